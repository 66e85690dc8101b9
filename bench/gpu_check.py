"""The engine checks a CUDA machine answers, in one command: the vLLM and Hugging Face inference workers on the
shipped model, through the same protocol the core uses.

    python bench/gpu_check.py                       # on a CUDA machine (device cuda), JSON to $OUT or ./gpu-check
    python bench/gpu_check.py --device cpu          # the same checks on the CPU: a dry run of the script itself
    python bench/gpu_check.py --engines hf --out /tmp/check --dtype bfloat16

For each engine whose package is installed (vLLM needs the real `vllm` package, built for the device), it measures:

- **reproducibility**: the same seeded requests twice; tokens and log-probabilities must be bit-identical.
- **alone vs batch**: requests alone against the same requests at positions 0, n/2 and n-1 of a batch of n, and the
  n requests under three layouts (one batch, reversed order, two halves); reported as bit-identical or the largest
  log-probability difference and the number of requests whose tokens differ.
- **generate vs score**: the engine's teacher-forced scores of its own samples against the log-probabilities it
  reported when sampling, at T = 1, T = 0.7 and greedy (scored at T = 1): bit-identical count and max |difference|.
- **NF4 vs FP32** (Hugging Face, whose worker loads NF4 through bitsandbytes; the vLLM worker serves no NF4): the
  FP32 greedy responses scored under NF4 (max and mean |difference| of log-probabilities), and the task loss of
  greedy answers under each, scored by the core's scorer.

Only seeded reproducibility is a requirement (exit 1 if it fails or a check cannot run); the others are
measurements, printed and written to `gpu_check.json`. Nothing here needs a GPU to run: `--device cpu` exercises the
same code on the CPU build of each engine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, start_worker  # noqa: E402
from invar.protocol import WorkerClient  # noqa: E402
from invar.tasks.arithmetic import MAX_ANSWER_CHARS, Problem, load_population, score  # noqa: E402
from invar.tasks.vocabulary import Vocabulary  # noqa: E402

EVAL_FILE = REPO / "data" / "arith-eval.jsonl"
BUDGET = MAX_ANSWER_CHARS + 1
PACKAGES = {"vllm": "vllm", "hf": "transformers"}


def requests(prompts: list[str], temperature: float, seed0: int) -> list[dict[str, Any]]:
    return [{"request_id": f"r{i}", "prompt": p, "seed": seed0 + i, "temperature": temperature, "top_p": 1.0,
             "max_tokens": BUDGET} for i, p in enumerate(prompts)]


def generate(worker: WorkerClient, reqs: list[dict[str, Any]], **params: Any) -> list[dict[str, Any]]:
    outputs: list[dict[str, Any]] = worker.call("generate", {"requests": reqs, **params})["outputs"]
    return outputs


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Bit identity of two runs of the same requests, else how far apart: token mismatches and the largest
    log-probability difference over each pair's common token prefix (nats)."""
    token_mismatch, diff = 0, 0.0
    identical = True
    for x, y in zip(a, b, strict=True):
        tx, ty = x["tokens"], y["tokens"]
        if tx.tobytes() != ty.tobytes():
            token_mismatch += 1
        n = 0
        while n < min(tx.size, ty.size) and tx[n] == ty[n]:
            n += 1
        if n:
            diff = max(diff, float(np.max(np.abs(x["logprobs"][:n].astype(np.float64) -
                                                 y["logprobs"][:n].astype(np.float64)))))
        identical &= tx.tobytes() == ty.tobytes() and x["logprobs"].tobytes() == y["logprobs"].tobytes()
    return {"bit_identical": identical, "requests": len(a), "token_mismatches": token_mismatch,
            "max_abs_logprob_diff": diff}


def check_reproducibility(worker: WorkerClient, prompts: list[str]) -> dict[str, Any]:
    reqs = requests(prompts, 1.0, 1000)
    return compare(generate(worker, reqs), generate(worker, reqs))


def check_batch(worker: WorkerClient, prompts: list[str]) -> dict[str, Any]:
    n = len(prompts)
    batch = requests(prompts, 1.0, 7000)
    positions = sorted({0, n // 2, n - 1})
    alone = generate(worker, [batch[i] for i in positions], layout=[[k] for k in range(len(positions))])
    together = generate(worker, batch)
    return {
        "n": n,
        "positions": positions,
        "alone_vs_batch": compare(alone, [together[i] for i in positions]),
        "reversed_order": compare(together, generate(worker, batch, layout=[list(range(n - 1, -1, -1))])),
        "two_halves": compare(together, generate(worker, batch, layout=[list(range(n // 2)), list(range(n // 2, n))])),
    }


def check_scoring(worker: WorkerClient, prompts: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for temperature in (1.0, 0.7, 0.0):
        reqs = requests(prompts, temperature, 200)
        sampled = generate(worker, reqs)
        scored_at = temperature or 1.0  # greedy log-probabilities are at T = 1
        items = [{"item_id": r["request_id"], "prompt": r["prompt"], "response_tokens": o["tokens"],
                  "temperature": scored_at, "vocab_steps": []} for r, o in zip(reqs, sampled, strict=True)]
        scored = worker.call("score", {"items": items, "adapter": None})["outputs"]
        a = np.concatenate([o["logprobs"] for o in sampled])
        b = np.concatenate([s["logprobs"] for s in scored])
        out[f"T={temperature:g}"] = {
            "tokens": int(a.size), "bit_identical": int(np.sum(a.view(np.int32) == b.view(np.int32))),
            "max_abs_diff": float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))),
        }
    return out


def check_nf4(worker: WorkerClient, load: dict[str, Any], problems: list[Problem], vocab: Vocabulary) -> dict[str, Any]:
    reqs = requests([p.prompt for p in problems], 0.0, 0)
    fp32 = generate(worker, reqs)
    items = [{"item_id": r["request_id"], "prompt": r["prompt"], "response_tokens": o["tokens"], "temperature": 1.0,
              "vocab_steps": []} for r, o in zip(reqs, fp32, strict=True)]
    worker.call("load_model", {**load, "quantization": "nf4"})
    try:
        under_nf4 = worker.call("score", {"items": items, "adapter": None})["outputs"]
        nf4 = generate(worker, reqs)
    finally:
        worker.call("load_model", load)
    diffs = np.concatenate([np.abs(o["logprobs"].astype(np.float64) - s["logprobs"].astype(np.float64))
                            for o, s in zip(fp32, under_nf4, strict=True)])

    def loss(outputs: list[dict[str, Any]]) -> int:
        return sum(score(p.prompt, vocab.decode(o["tokens"])) for p, o in zip(problems, outputs, strict=True))

    return {"problems": len(problems), "fp32_greedy_scored_under_nf4": {
                "tokens": int(diffs.size), "max_abs_diff": float(diffs.max()), "mean_abs_diff": float(diffs.mean())},
            "greedy_token_mismatches": sum(o["tokens"].tobytes() != n["tokens"].tobytes()
                                           for o, n in zip(fp32, nf4, strict=True)),
            "task_loss_fp32": loss(fp32), "task_loss_nf4": loss(nf4)}


def run_engine(engine: str, args: argparse.Namespace, problems: list[Problem], vocab: Vocabulary) -> dict[str, Any]:
    if importlib.util.find_spec(PACKAGES[engine]) is None:
        return {"skipped": f"the {PACKAGES[engine]} package is not installed here"}
    result: dict[str, Any] = {}
    started = time.perf_counter()
    worker = start_worker(engine, args=["--device", args.device], handshake_timeout=600)
    try:
        result["identity"] = worker.identity.to_wire()
        load = {"model_dir": str(args.model), "model_digest": canonical.tree_digest(args.model),
                "dtype": args.dtype, "quantization": "none", "adapter": None}
        result["load_model"] = worker.call("load_model", load)
        result["start_s"] = round(time.perf_counter() - started, 1)
        prompts = [p.prompt for p in problems[: args.n]]
        for name, check in (("reproducibility", check_reproducibility), ("batch", check_batch),
                            ("generate_vs_score", check_scoring)):
            t = time.perf_counter()
            result[name] = check(worker, prompts)
            result[name]["seconds"] = round(time.perf_counter() - t, 1)
        if engine == "hf":
            t = time.perf_counter()
            result["nf4_vs_fp32"] = check_nf4(worker, load, problems[: args.nf4_problems], vocab)
            result["nf4_vs_fp32"]["seconds"] = round(time.perf_counter() - t, 1)
    finally:
        worker.close()
    return result


def summary(engine: str, r: dict[str, Any]) -> list[str]:
    if "skipped" in r or "error" in r:
        return [f"{engine}: {r.get('skipped') or 'ERROR ' + r['error']}"]

    def same(c: dict[str, Any]) -> str:
        return "bit-identical" if c["bit_identical"] else (
            f"{c['token_mismatches']}/{c['requests']} token mismatches, max |dlogp| {c['max_abs_logprob_diff']:.3g}")

    b = r["batch"]
    lines = [f"{engine} ({r['identity']['settings'].get('device')}, {r['load_model']['model_digest'][:12]}…):",
             f"  seeded reproducibility: {same(r['reproducibility'])}",
             f"  alone vs batch of {b['n']} at {b['positions']}: {same(b['alone_vs_batch'])}; "
             f"reversed: {same(b['reversed_order'])}; two halves: {same(b['two_halves'])}"]
    for t, c in r["generate_vs_score"].items():
        if isinstance(c, dict):
            lines.append(f"  generate vs score {t}: {c['bit_identical']}/{c['tokens']} bit-identical, "
                         f"max |diff| {c['max_abs_diff']:.3g}")
    if "nf4_vs_fp32" in r:
        q = r["nf4_vs_fp32"]
        s = q["fp32_greedy_scored_under_nf4"]
        lines.append(f"  NF4 vs FP32 on {q['problems']} problems: max |dlogp| {s['max_abs_diff']:.3g}, mean "
                     f"{s['mean_abs_diff']:.3g}; greedy mismatches {q['greedy_token_mismatches']}; task loss "
                     f"FP32 {q['task_loss_fp32']}, NF4 {q['task_loss_nf4']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--engines", default="vllm,hf", help="comma-separated: vllm, hf")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--n", type=int, default=32, help="requests per batch")
    parser.add_argument("--nf4-problems", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="where gpu_check.json goes (default $OUT, else "
                        "./gpu-check)")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in PACKAGES]
    if unknown or not engines:
        print(f"gpu_check: unknown engine(s) {unknown}; choose from {sorted(PACKAGES)}", file=sys.stderr)
        return 2
    if args.n < 2:
        print("gpu_check: --n must be at least 2", file=sys.stderr)
        return 2
    if not (args.model / "config.json").is_file():
        print(f"gpu_check: {args.model} holds no model; build it with scripts/train_model.py or pass --model",
              file=sys.stderr)
        return 2
    out_dir = args.out or Path(os.environ.get("OUT") or "gpu-check")
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = load_population(EVAL_FILE, EVAL_FILE.with_suffix(".sha256").read_text().split()[0])
    vocab = Vocabulary.from_model_dir(args.model)
    report: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "model": str(args.model),
                              "n": args.n, "engines": {}}
    ok = True
    for engine in engines:
        try:
            result = run_engine(engine, args, problems, vocab)
        except Exception as exc:  # one engine failing must not hide the other's numbers
            traceback.print_exc()
            result = {"error": " | ".join(line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines()
                                          if line.strip())}
        report["engines"][engine] = result
        if "error" in result or ("reproducibility" in result and not result["reproducibility"]["bit_identical"]):
            ok = False
        (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    print("\n".join(line for e, r in report["engines"].items() for line in summary(e, r)))
    print(f"written: {out_dir / 'gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
