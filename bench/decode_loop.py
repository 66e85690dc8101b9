"""The HF and MLX workers' decoding loops against the engines' own batched generation, and their numbers pinned.

    .venv/bin/python bench/decode_loop.py digest --engine hf|mlx [--sizes tiny,large] --out FILE.json
    .venv/bin/python bench/decode_loop.py time --engine hf|mlx [--sizes tiny,large] [--reps 5]
        [--old-src /tmp/old/src] [--json docs/performance/decode_loop.json]

- **digest**: runs the worker's `Engine.generate` and `Engine.score` in this process on a fixed set of calls (T = 1
  seeded, T = 0, T = 0.7 with top-p 0.9; batches of 1, 5, 16 and 32; a reference pass; score with vocabulary rows)
  and writes the SHA-256 of every reported array's `tobytes()`. Run it on two versions of the worker (the old one
  from `git worktree add /tmp/old HEAD`, `DECODE_LOOP_SRC=/tmp/old/src`) and compare the files: a change to the loop
  keeps every number only if the two are equal.
- **time**: the worker's `Engine.generate` (this checkout's, and with `--old-src` the old one, each in a process of
  its own) against the engine's own batched generation on the same loaded model and the same prompts (HF
  `model.generate` with sampling at T = 1, the batch left-padded; MLX `mlx_lm.batch_generate`), one call of 64
  requests per layout (batches of 16 and 32, 5 new tokens, as bench/overhead.py), rounds alternating the drivers'
  order. Reported, in wall time and in the CPU time of the driver's own process (one thread: steadier than wall
  time on a loaded machine): per driver the median over rounds of its call time, and the median per-round ratio
  worker / native with a 95 % bootstrap interval. The native drivers do not compute log-probabilities or use a
  generator per request: the ratio is what the worker's promises cost over the engine's plain loop.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# DECODE_LOOP_SRC: another version's src/ (a `git worktree` of an older commit), imported ahead of this checkout's.
OTHER_SRC = os.environ.get("DECODE_LOOP_SRC")
for path in (REPO / "src", REPO, *((Path(OTHER_SRC),) if OTHER_SRC else ())):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402

sys.path.append(str(REPO / "bench"))  # last, as bench/train_overhead.py: bench/workers.py must not shadow workers
from overhead import LARGE_SHAPE, build_large, handler, make_calls  # noqa: E402
from report import write_json  # noqa: E402

MODELS = {"tiny": REPO / "models" / "tiny-arith",
          # built by scripts/build_smollm2.py; digest only (--sizes smollm2), with the tiny model's prompt ids
          "smollm2": REPO / "models" / "smollm2-135m-instruct-mlx"}


def model_dir(size: str, cache: Path) -> Path:
    if size in MODELS:
        return MODELS[size]
    return build_large(cache, *LARGE_SHAPE["cpu"])


def engine_for(engine: str) -> Any:
    """The worker's engine class, set up as the worker's `main` sets it up (as bench/overhead.py's direct driver)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    from overhead import _direct_engine

    return _direct_engine(engine, "cpu")


def load(engine: Any, model: Path) -> None:
    handler(engine, "load_model")({"model_dir": str(model), "model_digest": canonical.tree_digest(str(model)),
                                   "dtype": "float32", "quantization": "none", "adapter": None})


def digest_calls(requests: int) -> list[dict[str, Any]]:
    """Calls covering the loop's branches: sampling settings × batch layouts, and a reference pass."""
    base = make_calls(requests, 6)["batch-32"][0]["requests"][:requests]
    calls = []
    for temperature, top_p in ((1.0, 1.0), (0.0, 1.0), (0.7, 0.9)):
        reqs = [{**r, "temperature": temperature, "top_p": top_p} for r in base]
        for batch in (1, 5, 16, 32):
            layout = [list(range(b, min(b + batch, len(reqs)))) for b in range(0, len(reqs), batch)]
            calls.append({"requests": reqs, "layout": layout, "adapter": None,
                          "reference_adapter": "base" if batch == 5 else None})
    return calls


def _h(a: Any) -> str:
    a = np.asarray(a)
    return hashlib.sha256(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:24]


def digests(call: Any, requests: int) -> list[dict[str, Any]]:
    """The digest of every array `digest_calls` reports, through `call(method, params)`: a worker's client, or the
    engine class's methods in this process (tests/workers/hf and mlx pin the tiny model's)."""
    entries: list[dict[str, Any]] = []
    for k, params in enumerate(digest_calls(requests)):
        rep = call("generate", params)
        entries.append({"call": k, "outputs": [{f: _h(o[f]) for f in sorted(o) if isinstance(o[f], np.ndarray)}
                                               | {"finish": o["finish_reason"]} for o in rep["outputs"]]})
        if k % 4 == 0:  # score the generated tokens back, with vocabulary rows at two steps
            items = [{"item_id": o["request_id"], "prompt_ids": params["requests"][j]["prompt_ids"],
                      "response_tokens": o["tokens"], "temperature": params["requests"][j]["temperature"] or 1.0,
                      "vocab_steps": [0, len(o["tokens"]) - 1] if len(o["tokens"]) else []}
                     for j, o in enumerate(rep["outputs"])]
            sc = call("score", {"items": items, "adapter": None})
            entries.append({"score": k, "outputs": [{"logprobs": _h(o["logprobs"]), "vocab": _h(o["vocab_logprobs"])}
                                                    for o in sc["outputs"]]})
    return entries


DIGEST_REQUESTS = {"tiny": 32, "large": 16, "smollm2": 8}


def run_digest(engine_name: str, sizes: list[str], cache: Path, out: Path) -> int:
    engine = engine_for(engine_name)
    result: dict[str, Any] = {}
    for size in sizes:
        load(engine, model_dir(size, cache))
        # Through `handler`: the engine's methods take the typed params its worker's server reads.
        result[size] = digests(lambda method, params: handler(engine, method)(params), DIGEST_REQUESTS[size])
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{out}: {sum(len(v) for v in result.values())} entries")
    return 0


# -- timing ---------------------------------------------------------------------------------------------------------


def _native(engine_name: str, engine: Any, model: Path) -> Any:
    if engine_name == "hf":
        import torch

        m = engine.m

        def run_hf(call: dict[str, Any]) -> int:
            n = 0
            for batch in call["layout"]:
                prompts = [call["requests"][i]["prompt_ids"] for i in batch]
                width = max(len(p) for p in prompts)
                ids = torch.tensor([[m.pad_id] * (width - len(p)) + p for p in prompts])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
                torch.manual_seed(call["requests"][batch[0]]["seed"])
                with torch.no_grad():
                    out = m.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                           top_p=1.0, top_k=0, max_new_tokens=call["requests"][0]["max_tokens"],
                                           pad_token_id=m.pad_id, eos_token_id=sorted(m.eos_ids))
                n += int(out.shape[0] * (out.shape[1] - width))
            return n

        return run_hf
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    m = engine.m

    class _Tok:  # batch_generate only asks the tokenizer for the ids that end a response
        def __init__(self) -> None:
            self.eos_token_ids = set(m.eos_ids)

        def decode(self, ids: Any) -> str:  # and for texts, which nothing here reads
            return ""

    def run_mlx(call: dict[str, Any]) -> int:
        n = 0
        for batch in call["layout"]:
            prompts = [call["requests"][i]["prompt_ids"] for i in batch]
            out = batch_generate(m.model, _Tok(), prompts, max_tokens=call["requests"][0]["max_tokens"],
                                 sampler=make_sampler(temp=1.0), verbose=False)
            n += len(out.texts)
        return n

    return run_mlx


def serve(engine_name: str, model: Path) -> int:
    """Answer JSON lines on stdin ({"driver": "worker"|"native", "call": ...}) with seconds on stdout."""
    engine = engine_for(engine_name)
    load(engine, model)
    native = _native(engine_name, engine, model)
    generate = handler(engine, "generate")
    out = sys.stdout
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        t0, c0 = time.perf_counter(), time.process_time()
        if req["driver"] == "worker":
            generate(req["call"])
        else:
            native(req["call"])
        out.write(json.dumps({"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}) + "\n")
        out.flush()
    return 0


class Driver:
    def __init__(self, engine: str, model: Path, src: Path | None) -> None:
        env = dict(os.environ)
        if src is not None:
            env["DECODE_LOOP_SRC"] = str(src)
        self.p = subprocess.Popen([sys.executable, __file__, "serve", "--engine", engine, "--model", str(model)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.p.stdout is not None
        assert json.loads(self.p.stdout.readline())["ready"]

    def run(self, driver: str, call: dict[str, Any]) -> tuple[float, float]:
        """(wall s, CPU s of the driver's process) for one call."""
        assert self.p.stdin is not None
        assert self.p.stdout is not None
        self.p.stdin.write(json.dumps({"driver": driver, "call": call}) + "\n")
        self.p.stdin.flush()
        reply = json.loads(self.p.stdout.readline())
        return float(reply["seconds"]), float(reply["cpu_s"])

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait()


def _ci(ratios: np.ndarray, resamples: int = 4000) -> list[float]:
    rng = np.random.default_rng(0)
    meds = [float(np.median(rng.choice(ratios, ratios.size))) for _ in range(resamples)]
    return [float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))]


def run_time(engine_name: str, sizes: list[str], cache: Path, reps: int, old_src: Path | None,
             out: Path | None) -> int:
    results: dict[str, Any] = {"engine": engine_name, "reps": reps, "cpus": os.cpu_count(),
                               "load_at_start": os.getloadavg(), "sizes": {}}
    for size in sizes:
        model = model_dir(size, cache)
        count = 64 if size == "tiny" or engine_name == "hf" else 32
        calls = {k: v[0] for k, v in make_calls(count, 5).items()}
        drivers = {"new": Driver(engine_name, model, None)}
        if old_src is not None:
            drivers["old"] = Driver(engine_name, model, old_src)
        entry: dict[str, Any] = {"model": str(model.relative_to(REPO) if model.is_relative_to(REPO) else model),
                                 "requests": count, "layouts": {}}
        for layout, call in calls.items():
            for d in drivers.values():  # one warm-up call each
                d.run("worker", call)
                d.run("native", call)
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in [*drivers, "native"]}
            for r in range(reps):
                order = [*drivers, "native"]
                if r % 2:
                    order.reverse()
                for who in order:
                    times[who].append(drivers["new"].run("native", call) if who == "native"
                                      else drivers[who].run("worker", call))
            row: dict[str, Any] = {}
            for kind, col in (("wall", 0), ("cpu", 1)):
                native = np.asarray([t[col] for t in times["native"]])
                row[kind] = {"native_median_s": float(np.median(native))}
                for who in drivers:
                    t = np.asarray([x[col] for x in times[who]])
                    ratio = t / native
                    ci = _ci(ratio)
                    row[kind][who] = {"median_s": float(np.median(t)), "ratio_to_native": float(np.median(ratio)),
                                      "ratio_ci95": ci}
                    print(f"{size:5} {layout:12} {kind:4} {who:3}: {np.median(t):.4f} s, native "
                          f"{np.median(native):.4f} s, ratio {np.median(ratio):.3f} ({ci[0]:.3f}-{ci[1]:.3f})",
                          flush=True)
            row["times_s"] = times
            entry["layouts"][layout] = row
        for d in drivers.values():
            d.close()
        results["sizes"][size] = entry
    results["load_at_end"] = os.getloadavg()
    write_json(out, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["digest", "time", "serve"])
    parser.add_argument("--engine", choices=["hf", "mlx"], required=True)
    parser.add_argument("--sizes", default="tiny,large")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--old-src", type=Path, default=None)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    if args.mode == "serve":
        return serve(args.engine, args.model)
    if args.mode == "digest":
        if args.out is None:
            parser.error("digest needs --out")
        return run_digest(args.engine, sizes, args.cache, args.out)
    return run_time(args.engine, sizes, args.cache, args.reps, args.old_src, args.json)


if __name__ == "__main__":
    sys.exit(main())
