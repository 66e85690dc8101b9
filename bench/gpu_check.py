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

**The overhead benchmark** (`--overhead`, on by default with `--device cuda`) runs after the checks, as
subprocesses, on the same device: `bench/overhead.py --device cuda` (invar against the direct runner, and native
vLLM where installed; `--pairs` paired calls per layout, pairing-b16 and batch-32, on the larger random-weight model
first, then the tiny one: `--overhead-sizes`), then `bench/train_overhead.py --device cuda` (`--train-cycles` x
`--train-reps` cycle pairs on the larger model, Hugging Face; `invar train` needs pydantic and cryptography, so it
is skipped where they are missing). Per row, `gpu_check.json` gets under `overhead` the ratio Σ invar / Σ direct in
wall and CPU time with its 95 % interval, the fixed cost per call and per record (µs), the direct runner's call
time and, on the larger model, whether the 1.02 goal is met, missed or not established by the interval; the
benchmarks' own JSON (`overhead.json`, `train_overhead.json`) lands beside it. It is a measurement: nothing in it
changes the exit code. `--budget-s` (default 540 s) bounds the whole script for a 10-minute command: the
benchmarks get what the checks leave; no round, size or engine starts in the last 90 s of their share, and a bench
still running at its end is interrupted (its figures so far are kept when an engine has finished).

    python bench/gpu_check.py --device cpu --engines hf --overhead --pairs 2 --overhead-sizes tiny \
        --train-cycles 1 --train-reps 1 --out /tmp/check       # a dry run of all of it on the CPU (75-100 s)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import subprocess
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
from invar.tasks import ModelTokenizer  # noqa: E402
from invar.tasks.arithmetic import MAX_ANSWER_CHARS, Problem, load_population, score  # noqa: E402
from invar.transport import WorkerClient  # noqa: E402

EVAL_FILE = REPO / "data" / "arith-eval.jsonl"
BUDGET = MAX_ANSWER_CHARS + 1
PACKAGES = {"vllm": "vllm", "hf": "transformers"}
CALL_REQUESTS = 64  # bench/overhead.py sends 64 requests per generate call
# After the soft limit given to a bench (no new round starts), this long for the round under way, the breakdown and
# the workers' stop; at the hard limit the bench is interrupted (SIGINT: it stops its workers), 20 s later killed.
WIND_DOWN_S = 90
MIN_VERDICT_PAIRS = 8
MIN_OVERHEAD_S = 150  # less left than this: a worker start and one round would not fit, so the bench is not begun
TRAIN_SHARE = 0.35  # of the time left for the overhead benchmark, what the training cycles get when asked for
# `invar train` (the training benchmark's invar driver) needs the core's whole CLI; an image without these packages
# (carry them as wheels) cannot run it.
CLI_PACKAGES = ("pydantic", "cryptography", "typer", "rich", "scipy")


Prompt = tuple[str, list[int]]
"""A prompt's text (the label requests carry) and its token ids, the core's tokenization (what engines run)."""


def prompts_of(problems: list[Problem], vocab: ModelTokenizer) -> list[Prompt]:
    return [(p.prompt, vocab.prompt_ids(prompt=p.prompt)) for p in problems]


def requests(prompts: list[Prompt], temperature: float, seed0: int) -> list[dict[str, Any]]:
    return [{"request_id": f"r{i}", "prompt": text, "prompt_ids": ids, "seed": seed0 + i, "temperature": temperature,
             "top_p": 1.0, "max_tokens": BUDGET} for i, (text, ids) in enumerate(prompts)]


def generate(worker: WorkerClient, reqs: list[dict[str, Any]], **params: Any) -> list[dict[str, Any]]:
    outputs: list[dict[str, Any]] = worker.call("generate", {"requests": reqs, **params})["outputs"]
    for r, o in zip(reqs, outputs, strict=True):
        if o["prompt_tokens"].tolist() != r["prompt_ids"]:
            raise RuntimeError(f"generate: {r['request_id']} ran other prompt tokens than asked")
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


def check_reproducibility(worker: WorkerClient, prompts: list[Prompt]) -> dict[str, Any]:
    reqs = requests(prompts, 1.0, 1000)
    return compare(generate(worker, reqs), generate(worker, reqs))


def check_batch(worker: WorkerClient, prompts: list[Prompt]) -> dict[str, Any]:
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


def check_scoring(worker: WorkerClient, prompts: list[Prompt]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for temperature in (1.0, 0.7, 0.0):
        reqs = requests(prompts, temperature, 200)
        sampled = generate(worker, reqs)
        scored_at = temperature or 1.0  # greedy log-probabilities are at T = 1
        items = [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
                  "response_tokens": o["tokens"], "temperature": scored_at, "vocab_steps": []}
                 for r, o in zip(reqs, sampled, strict=True)]
        scored = worker.call("score", {"items": items, "adapter": None})["outputs"]
        a = np.concatenate([o["logprobs"] for o in sampled])
        b = np.concatenate([s["logprobs"] for s in scored])
        out[f"T={temperature:g}"] = {
            "tokens": int(a.size), "bit_identical": int(np.sum(a.view(np.int32) == b.view(np.int32))),
            "max_abs_diff": float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))),
        }
    return out


def check_nf4(worker: WorkerClient, load: dict[str, Any], problems: list[Problem],
              vocab: ModelTokenizer) -> dict[str, Any]:
    reqs = requests(prompts_of(problems, vocab), 0.0, 0)
    fp32 = generate(worker, reqs)
    items = [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"], "temperature": 1.0, "vocab_steps": []}
             for r, o in zip(reqs, fp32, strict=True)]
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


def run_engine(engine: str, args: argparse.Namespace, problems: list[Problem], vocab: ModelTokenizer) -> dict[str, Any]:
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
        prompts = prompts_of(problems[: args.n], vocab)
        for name, check in (("reproducibility", check_reproducibility), ("batch", check_batch),
                            ("generate_vs_score", check_scoring)):
            t = time.perf_counter()
            result[name] = check(worker, prompts)
            result[name]["seconds"] = round(time.perf_counter() - t, 1)
        if engine == "hf" and importlib.util.find_spec("bitsandbytes") is None:
            # The worker loads NF4 through bitsandbytes; without it the check cannot run, and the others still count.
            result["nf4_vs_fp32"] = {"skipped": "the bitsandbytes package is not installed here"}
        elif engine == "hf":
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
    if "skipped" in r.get("nf4_vs_fp32", {}):
        lines.append(f"  NF4 vs FP32: skipped ({r['nf4_vs_fp32']['skipped']})")
    elif "nf4_vs_fp32" in r:
        q = r["nf4_vs_fp32"]
        s = q["fp32_greedy_scored_under_nf4"]
        lines.append(f"  NF4 vs FP32 on {q['problems']} problems: max |dlogp| {s['max_abs_diff']:.3g}, mean "
                     f"{s['mean_abs_diff']:.3g}; greedy mismatches {q['greedy_token_mismatches']}; task loss "
                     f"FP32 {q['task_loss_fp32']}, NF4 {q['task_loss_nf4']}")
    return lines


# -- the overhead benchmark: a measurement, never a reason to fail ---------------------------------------------------


def run_bench(command: list[str], hard_s: float) -> tuple[int | None, float]:
    """Run a bench script in a process group of its own; past `hard_s` interrupt the group, then kill it."""
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, start_new_session=True)
    try:
        return proc.wait(timeout=max(1.0, hard_s)), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        print(f"gpu_check: {Path(command[1]).name} ran past {hard_s:.0f} s; stopping it", flush=True)
        os.killpg(proc.pid, signal.SIGINT)  # its `finally` blocks stop the workers (they run in sessions of their own)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return None, time.monotonic() - t0


def verdict(ci: list[float], pairs: int, goal: float = 1.02) -> str:
    """Where the 95 % interval lies against the goal; a bootstrap over a handful of pairs decides nothing."""
    if pairs < MIN_VERDICT_PAIRS:
        return f"not established ({pairs} pairs)"
    return "met" if ci[1] <= goal else "missed" if ci[0] > goal else "not established"


def inference_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """bench/overhead.py's JSON, one flat row per model size, engine and layout."""
    rows = []
    for size, entry in data.get("sizes", {}).items():
        for engine, per in entry["engines"].items():
            for layout, row in per["layouts"].items():
                wall, cpu = row["paired"], row["paired_cpu"]
                rows.append({
                    "size": size, "parameters": entry["parameters"], "engine": engine, "layout": layout,
                    "pairs": wall["pairs"], "direct_median_call_s": wall["direct_median_call_s"],
                    "wall_total_ratio": wall["total_ratio"], "wall_total_ratio_ci95": wall["total_ratio_ci95"],
                    "wall_median_ratio": wall["median_ratio"], "wall_median_ratio_ci95": wall["median_ratio_ci95"],
                    "cpu_total_ratio": cpu["total_ratio"], "cpu_total_ratio_ci95": cpu["total_ratio_ci95"],
                    "fixed_cost_per_call_us": row["fixed_cost_per_call_us"],
                    "fixed_cost_per_call_us_ci95": [x * 1e3 for x in wall["mean_diff_ms_ci95"]],
                    "fixed_cost_per_record_us": row["fixed_cost_per_record_us"],
                    "cpu_cost_per_call_us": cpu["mean_diff_ms"] * 1e3,
                    "breakdown_core_us": sum(row["breakdown"]["core_median_us"].get(k, 0.0) for k in (
                        "encode call", "hash call", "record call", "write call to the pipe", "decode report",
                        "record report")),
                    **({"goal_1_02_wall": verdict(wall["total_ratio_ci95"], wall["pairs"]),  # the larger model's
                        "goal_1_02_cpu": verdict(cpu["total_ratio_ci95"], cpu["pairs"])} if size == "large" else {}),
                })
    return rows


def run_overhead(args: argparse.Namespace, engines: list[str], out_dir: Path, deadline: float) -> dict[str, Any]:
    """bench/overhead.py (and bench/train_overhead.py when asked) on this device, inside what is left of the budget."""
    installed = [e for e in engines if importlib.util.find_spec(PACKAGES[e]) is not None]
    left = deadline - time.monotonic()
    result: dict[str, Any] = {"goal": "invar / direct <= 1.02 on the larger model", "seconds_left_at_start":
                              round(left)}
    if not installed:
        return {**result, "skipped": "no engine package is installed here"}
    if left < MIN_OVERHEAD_S:
        return {**result, "skipped": f"{left:.0f} s of the time budget left, under {MIN_OVERHEAD_S} s"}
    # Training gets a share of the time only where it can run (Hugging Face, and the core's CLI packages).
    missing = [m for m in CLI_PACKAGES if importlib.util.find_spec(m) is None]
    train = args.train_cycles > 0 and "hf" in installed and not missing
    inference_s = left * (1 - TRAIN_SHARE) if train else left
    calls = min(4, args.pairs)  # per layout; bench/overhead.py's default request count gives 4
    reps = math.ceil(args.pairs / calls)
    json_path = out_dir / "overhead.json"
    json_path.unlink(missing_ok=True)
    command = [sys.executable, str(REPO / "bench" / "overhead.py"), "--device", args.device, "--engines",
               ",".join(installed), "--sizes", args.overhead_sizes, "--reps", str(reps), "--requests",
               str(CALL_REQUESTS * calls), "--json", str(json_path),
               "--budget-s", str(round(max(1.0, inference_s - WIND_DOWN_S)))]
    for flag, value in (("--large-layers", args.large_layers), ("--large-hidden", args.large_hidden)):
        if value is not None:
            command += [flag, str(value)]
    print(f"gpu_check: overhead benchmark, {args.pairs} pairs per layout, {inference_s:.0f} s at most: "
          + " ".join(command[1:]), flush=True)
    rc, seconds = run_bench(command, inference_s)
    result["inference"] = {"command": command[1:], "returncode": rc, "seconds": round(seconds, 1),
                           "json": json_path.name}
    if json_path.is_file():
        data = json.loads(json_path.read_text())
        result["inference"].update(rows=inference_rows(data), not_measured=data.get("not_measured", []),
                                   gpu=next((e.get("gpu") for s in data["sizes"].values()
                                             for e in s["engines"].values() if e.get("gpu")), None))
        large = data["sizes"].get("large")
    else:
        large = None
    if train:
        result["training"] = run_train(args, out_dir, deadline, large)
    elif args.train_cycles > 0:
        result["training"] = {"skipped": f"invar train needs {', '.join(missing)}, not installed here (carry them as "
                                         "wheels)" if missing else "Hugging Face (transformers) is not installed here"}
    return result


def run_train(args: argparse.Namespace, out_dir: Path, deadline: float, large: dict[str, Any] | None) -> dict[str, Any]:
    left = deadline - time.monotonic()
    if left < MIN_OVERHEAD_S:
        return {"skipped": f"{left:.0f} s of the time budget left, under {MIN_OVERHEAD_S} s"}
    model = (REPO / large["model"]) if large else None  # the larger model if the inference bench built it
    json_path = out_dir / "train_overhead.json"
    json_path.unlink(missing_ok=True)
    command = [sys.executable, str(REPO / "bench" / "train_overhead.py"), "--device", args.device, "--config",
               str(REPO / "configs" / "arith-hf.toml"), "--cycles", str(args.train_cycles), "--reps",
               str(args.train_reps), "--json", str(json_path)]
    if model is not None:
        command += ["--model", str(model)]
    print(f"gpu_check: training benchmark, {left:.0f} s at most: " + " ".join(command[1:]), flush=True)
    env_path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = env_path  # `invar train` runs from this checkout, installed or not
    rc, seconds = run_bench(command, left)
    out: dict[str, Any] = {"command": command[1:], "returncode": rc, "seconds": round(seconds, 1),
                           "json": json_path.name}
    if json_path.is_file():
        data = json.loads(json_path.read_text())
        out.update({k: data[k] for k in ("model", "cycles", "reps", "invar_over_direct", "same_checkpoints")},
                   median_cycle_s={d: data[d]["median_cycle_s"] for d in ("invar", "direct")},
                   wall=data["paired"], cpu=data["paired_cpu"], publish_s=data["publish_s"])
        if model is not None:  # the goal is the larger model's
            out.update(goal_1_02_wall=verdict(data["paired"]["total_ratio_ci95"], data["paired"]["pairs"]),
                       goal_1_02_cpu=verdict(data["paired_cpu"]["total_ratio_ci95"], data["paired_cpu"]["pairs"]))
    return out


def overhead_summary(o: dict[str, Any], device: str) -> list[str]:
    if "skipped" in o or "error" in o:
        return [f"overhead: {o.get('skipped') or 'ERROR ' + o['error']}"]
    inf = o["inference"]
    lines = [f"overhead on {device}{' (' + inf['gpu'] + ')' if inf.get('gpu') else ''}: invar / direct, Σ of paired "
             f"calls (95 %); goal <= 1.02 on the larger model (bench/overhead.py exit {inf['returncode']}, "
             f"{inf['seconds']} s)"]
    for r in inf.get("rows", []):
        w, c = r["wall_total_ratio_ci95"], r["cpu_total_ratio_ci95"]
        goal = f" (1.02: {r['goal_1_02_wall']})" if r["size"] == "large" else ""
        lines.append(f"  {r['size']} ({r['parameters'] / 1e6:.1f} M) {r['engine']} {r['layout']}: wall "
                     f"{r['wall_total_ratio']:.3f} ({w[0]:.3f}-{w[1]:.3f}){goal}, CPU "
                     f"{r['cpu_total_ratio']:.3f} ({c[0]:.3f}-{c[1]:.3f}); {r['pairs']} pairs, direct "
                     f"{r['direct_median_call_s'] * 1e3:.1f} ms/call; fixed cost {r['fixed_cost_per_call_us']:,.0f} "
                     f"µs/call, {r['fixed_cost_per_record_us']:,.0f} µs/record (core's steps "
                     f"{r['breakdown_core_us']:,.0f} µs/call)")
    if inf.get("not_measured"):
        lines.append(f"  not measured: {', '.join(inf['not_measured'])}")
    t = o.get("training")
    if t is not None and "wall" in t:
        goal = f" (1.02: {t['goal_1_02_wall']})" if "goal_1_02_wall" in t else ""
        w, cycle = t["wall"], t["median_cycle_s"]
        lines.append(f"  training cycle ({t['cycles']} cycles x {t['reps']} reps, {Path(t['model']).name}): wall "
                     f"{w['total_ratio']:.3f} ({w['total_ratio_ci95'][0]:.3f}-{w['total_ratio_ci95'][1]:.3f}){goal}, "
                     f"CPU {t['cpu']['total_ratio']:.3f}; median cycle invar {cycle['invar']:.2f} s, direct "
                     f"{cycle['direct']:.2f} s; publish {t['publish_s']['median'] * 1e3:.0f} ms")
    elif t is not None and "skipped" in t:
        lines.append(f"  training: skipped ({t['skipped']})")
    elif t is not None:
        lines.append(f"  training: no result (bench/train_overhead.py exit {t['returncode']}, {t['seconds']} s)")
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
    parser.add_argument("--budget-s", type=float, default=540, help="the whole script's time: the overhead "
                        "benchmark gets what the engine checks leave (default 540, for a 10-minute command)")
    parser.add_argument("--checks", action=argparse.BooleanOptionalAction, default=True,
                        help="the engine checks (--no-checks: the overhead benchmark alone)")
    parser.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=None,
                        help="after the checks, bench/overhead.py on this device (default: on with --device cuda)")
    parser.add_argument("--pairs", type=int, default=16, help="overhead: paired calls per layout, engine and size")
    parser.add_argument("--overhead-sizes", default="large,tiny", help="overhead: model sizes, in order")
    parser.add_argument("--large-layers", type=int, default=None, help="overhead: the larger model's layers")
    parser.add_argument("--large-hidden", type=int, default=None, help="overhead: the larger model's hidden size")
    parser.add_argument("--train-cycles", type=int, default=2, help="overhead: training cycles per repetition "
                        "(bench/train_overhead.py, Hugging Face; 0: none)")
    parser.add_argument("--train-reps", type=int, default=2, help="overhead: training repetitions per driver")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    if args.overhead is None:
        args.overhead = args.device == "cuda"
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in PACKAGES]
    if unknown or not engines:
        print(f"gpu_check: unknown engine(s) {unknown}; choose from {sorted(PACKAGES)}", file=sys.stderr)
        return 2
    if args.n < 2 or args.pairs < 1 or args.train_cycles < 0 or args.train_reps < 1:
        print("gpu_check: --n must be at least 2, --pairs and --train-reps at least 1, --train-cycles at least 0",
              file=sys.stderr)
        return 2
    if not (args.model / "config.json").is_file():
        print(f"gpu_check: {args.model} holds no model; build it with scripts/train_model.py or pass --model",
              file=sys.stderr)
        return 2
    # On CUDA vLLM's engine core runs in a spawned process; the worker reads the configuration the engine computes
    # with (and scores at T != 1) through `LLM.apply_model`, which vLLM sends to that process only with this set.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    out_dir = args.out or Path(os.environ.get("OUT") or "gpu-check")
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = load_population(EVAL_FILE, EVAL_FILE.with_suffix(".sha256").read_text().split()[0])
    vocab = ModelTokenizer.from_model_dir(args.model)
    report: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "model": str(args.model),
                              "n": args.n, "engines": {}}
    ok = True
    for engine in engines if args.checks else []:
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
    if args.overhead:
        try:
            report["overhead"] = run_overhead(args, engines, out_dir, deadline)
        except Exception as exc:  # a measurement: whatever goes wrong, the checks above still decide the exit code
            traceback.print_exc()
            report["overhead"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    print("\n".join(line for e, r in report["engines"].items() for line in summary(e, r)))
    if "overhead" in report:
        print("\n".join(overhead_summary(report["overhead"], args.device)))
    print(f"written: {out_dir / 'gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
