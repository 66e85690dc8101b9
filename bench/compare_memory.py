"""Peak memory of `invar compare numerical` as the captures grow: the comparison streams over units.

    .venv/bin/python bench/compare_memory.py [--units 500 2000] [--steps 4] [--vocab 18 4096 16384] [--out DIR]

For each number of units and vocabulary size V it writes, through the record store as `invar evaluate` and
`invar score` write them, a reference run and a candidate run of that many units (the same responses), and two score
runs of the reference's responses with whole-vocabulary captures at `--steps` steps (float32[steps, V] per unit;
the candidate's perturbed), 64 items per score call. It then runs
`invar compare numerical REF CAND --cand-scores … --ref-scores … --json` under `/usr/bin/time` and reports its
peak resident memory next to the size of the captures on disk. Memory that held every record would grow with the
captures; streamed, it follows the size of one score call's captures (64 items × steps × V), whatever the number of
units. Results go to docs/compare/memory.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.protocol.messages import Call, Report
from invar.records import RunStore
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import population

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
DIGEST = canonical.tree_digest(DEFAULT_MODEL)
IDENTITY = {"engine": "hf", "engine_version": {"torch": "bench"}, "role": "inference", "settings": {},
            "methods": ["generate", "score"], "pid": 1}
PER_CALL = 64


class Writer:
    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.store = RunStore.create(path, meta={"engine": "hf", "model": str(DEFAULT_MODEL), "model_digest": DIGEST,
                                                 "dtype": "float32", "quantization": "none", **meta})
        self.worker = self.store.record_worker(IDENTITY)
        self.n = 0

    def call(self, method: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        self.n += 1
        d = self.store.record_call(canonical.encode(Call(self.n, method, params).to_wire()), worker=self.worker)
        self.store.record_report(canonical.encode(Report(self.n, d, self.worker, result=result).to_wire()),
                                 worker=self.worker)

    def close(self) -> None:
        self.store.close_run()
        self.store.close()


def write_runs(folder: Path, units: int, steps: int, vocab: int) -> dict[str, Path]:
    problems = population("eval", seed=3, count=units, id_prefix="m")
    tokens = [np.array([*VOCAB.encode(p.answer), VOCAB.eos_token_id], dtype=np.int32) for p in problems]
    prompt_ids = [VOCAB.prompt_ids(prompt=p.prompt) for p in problems]  # as evaluate sends them
    rng = np.random.default_rng(vocab)
    lps = [(-rng.random(len(t))).astype(np.float32) for t in tokens]
    paths = {name: folder / name for name in ("ref", "cand", "ref_scores", "cand_scores")}
    for name in ("ref", "cand"):
        w = Writer(paths[name], {"command": "evaluate"})
        for start in range(0, units, PER_CALL):
            part = range(start, min(start + PER_CALL, units))
            w.call("generate", {"requests": [{"request_id": problems[i].id, "prompt": problems[i].prompt,
                                              "prompt_ids": prompt_ids[i], "seed": i, "temperature": 1.0,
                                              "top_p": 1.0, "max_tokens": 5}
                                             for i in part], "layout": [list(range(len(part)))], "adapter": None,
                                "reference_adapter": None},
                   {"outputs": [{"request_id": problems[i].id,
                                 "prompt_tokens": np.array(prompt_ids[i], dtype=np.int32), "tokens": tokens[i],
                                 "logprobs": lps[i], "finish_reason": "stop"} for i in part],
                    "model_digest": DIGEST})
        w.close()
    for name, shift in (("ref_scores", 0.0), ("cand_scores", 0.05)):
        w = Writer(paths[name], {"command": "score", "source": {"run": str(paths["ref"])}})
        noise = np.random.default_rng(7)
        for start in range(0, units, PER_CALL):
            part = range(start, min(start + PER_CALL, units))
            items, outputs = [], []
            for i in part:
                k = min(steps, len(tokens[i]))
                logits = np.random.default_rng(i).normal(0, 3, (k, vocab)) + shift * noise.normal(size=(k, vocab))
                caps = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
                items.append({"item_id": problems[i].id, "prompt": problems[i].prompt, "prompt_ids": prompt_ids[i],
                              "response_tokens": tokens[i], "temperature": 1.0, "vocab_steps": list(range(k))})
                outputs.append({"item_id": problems[i].id, "logprobs": lps[i], "vocab_logprobs": caps})
            w.call("score", {"items": items, "adapter": None}, {"outputs": outputs, "model_digest": DIGEST})
        w.close()
    return paths


def measure(paths: dict[str, Path]) -> tuple[float, float]:
    """(peak RSS MiB, wall s) of one comparison."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        cmd = ["/usr/bin/time", "-f", "%M %e", "-o", timing.name, str(Path(sys.executable).parent / "invar"),
               "compare", "numerical", str(paths["ref"]), str(paths["cand"]), "--cand-scores",
               str(paths["cand_scores"]), "--ref-scores", str(paths["ref_scores"]), "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(out.stderr)
        peak, wall = timing.read().split()[-2:]
    return int(peak) / 1024, float(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, nargs="+", default=[18, 4096, 16384])
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here (default: a scratch folder).")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="invar-compare-memory-"))
    rows = []
    try:
        for v in args.vocab:
            for units in args.units:
                folder = root / f"v{v}-n{units}"
                paths = write_runs(folder, units, args.steps, v)
                captures = sum((p / "records.sqlite").stat().st_size for k, p in paths.items()
                               if k.endswith("scores"))
                peak, wall = measure(paths)
                rows.append({"units": units, "steps": args.steps, "vocab": v,
                             "score_runs_mib": round(captures / 2**20, 1), "peak_rss_mib": round(peak, 1),
                             "wall_s": wall})
                print(f"{units} units, V = {v:>6}: score runs {captures / 2**20:8.1f} MiB on disk, compare peak RSS "
                      f"{peak:6.1f} MiB, {wall:.1f} s", flush=True)
                if args.out is None:
                    shutil.rmtree(folder)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    out = ROOT / "docs" / "compare" / "memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
