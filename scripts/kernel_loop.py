"""The agent's loop, timed: from a new kernel folder to a decision, on a sequential contract (docs/kernels.md).

    .venv/bin/python scripts/kernel_loop.py [--model tiny|smollm2] [--sample N] [--kernel NAME=PATH ...]

For each kernel, in a new folder of its own (the kernel copied there, as an agent's fresh kernel would be):

1. `invar use init k.toml --candidate-patch ./KERNEL --sequential --sample N --temperature 0`: the contract `use init`
   proposes for a kernel when asked to decide sequentially (the task bound, looked at after every pairing call, so a
   kernel that is clearly worse, or one whose calls fail with non-finite values, stops at once);
2. `invar use prepare k.toml --json`, 3. `invar use run k.contract.json --run run --json`,
4. `invar use admit run --contract k.contract.json --json`,

each step timed and its exit status kept, as an agent (or CI) reads them: `use admit` exits 0 Admitted, 10 Violated,
11 Unknown, 2 for refused input. Writes docs/kernels/loop_<model>.json (after every kernel, so a stopped
measurement keeps what it finished) and prints a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
INVAR = [sys.executable, "-m", "invar.cli"]

KERNELS: dict[str, tuple[str, str]] = {
    "softmax-fp32": ("examples/kernels/softmax-fp32", "correct (fp32 softmax)"),
    "softmax-bf16": ("examples/kernels/softmax-bf16", "silent precision downgrade (softmax in bfloat16)"),
    "bf16-matmul": ("tests/contract/kernels/bf16-matmul", "silent precision downgrade (matmul in bfloat16)"),
}
"""The kernels timed by default, in table order: name → (folder under the repository, what it is)."""

MODELS: dict[str, list[str]] = {
    "tiny": [],
    "smollm2": ["--model", str(REPO / "models" / "smollm2-135m-instruct"), "--population",
                str(REPO / "data" / "chat-eval.jsonl"), "--scorer", "numeric", "--scorer-setting", 'which="last"',
                "--max-tokens", "8"],
}
"""`use init` options per model (the shipped tiny model and its arithmetic population are `use init`'s defaults)."""

SAMPLE = {"tiny": 2000, "smollm2": 400}
"""n_max per model: every unit the sequential rule may use (the plan's sample)."""

EPSILON = {"tiny": "0.01", "smollm2": "0.02"}
"""ε per model: `use init`'s default on the tiny model; on SmolLM2 the shipped real-model contracts' 2 in 100, which a
correct kernel reaches within the 400 chats."""


def _step(argv: list[str], cwd: Path) -> dict[str, Any]:
    """Run one command of the loop: its exit status, wall time, CPU time (the command and the workers it started,
    which it waits for) and the machine's load average before and after (the wall time on a shared machine is read
    beside it), and its --json output when it printed one."""
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    out: dict[str, Any] = {"command": " ".join(["invar", *argv[3:]]), "exit": done.returncode, "wall_s": round(wall, 1),
                           "cpu_s": round(cpu, 1), "load_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    with contextlib.suppress(json.JSONDecodeError):  # a step that printed no JSON (refused) keeps its error line
        out["json"] = json.loads(done.stdout)
    if done.returncode not in (0, 10, 11):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        out["error"] = lines[-1] if lines else f"exit {done.returncode}"
    return out


def loop(name: str, source: Path, model: str, sample: int, work: Path) -> dict[str, Any]:
    """One kernel through the loop, from a new folder: init, prepare, run, admit; every step timed."""
    folder = work / name
    folder.mkdir()
    shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    steps: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    steps["init"] = _step([*INVAR, "use", "init", "k.toml", "--candidate-patch", f"./{name}", "--sequential",
                           "--sample", str(sample), "--temperature", "0", "--epsilon", EPSILON[model],
                           *MODELS[model]], folder)
    if steps["init"]["exit"] == 0:
        steps["prepare"] = _step([*INVAR, "use", "prepare", "k.toml", "--json"], folder)
    if steps.get("prepare", {}).get("exit") == 0:
        steps["run"] = _step([*INVAR, "use", "run", "k.contract.json", "--run", "run", "--json"], folder)
    if "run" in steps:  # a run that stopped at a failed call is still put to admission: it may decide it
        steps["admit"] = _step([*INVAR, "use", "admit", "run", "--contract", "k.contract.json", "--json"], folder)
    total = time.perf_counter() - started
    decision = steps.get("admit", {}).get("json")
    stop = (steps.get("run", {}).get("json") or {}).get("sequential_stop")
    return {
        "kernel": name, "source": str(source.relative_to(REPO)) if source.is_relative_to(REPO) else str(source),
        "what": KERNELS.get(name, ("", ""))[1],
        "answer": decision["answer"] if decision else None,
        "exit": steps["admit"]["exit"] if "admit" in steps else None,
        "reason": decision["reason"] if decision else next((s["error"] for s in steps.values() if "error" in s),
                                                             None),
        "units_used": None if stop is None else stop.get("units"),
        "look": None if stop is None else stop.get("look"),
        "n_max": sample,
        "folder_to_decision_s": round(total, 1),
        "folder_to_decision_cpu_s": round(sum(s["cpu_s"] for s in steps.values()), 1),
        "load_1min": [min(s["load_1min"][0] for s in steps.values()), max(max(s["load_1min"]) for s in steps.values())],
        "steps": {k: {key: v for key, v in s.items() if key != "json"} for k, s in steps.items()},
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| kernel | what it is | decision (exit) | units used of n_max | init, prepare, run, admit | folder to "
             "decision | CPU | load average |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        times = ", ".join(f"{r['steps'][k]['wall_s']:.0f} s" if k in r["steps"] else "–"
                          for k in ("init", "prepare", "run", "admit"))
        used = "–" if r["units_used"] is None else f"{r['units_used']} of {r['n_max']}"
        cpu, load = r.get("folder_to_decision_cpu_s"), r.get("load_1min")
        lines.append(f"| `{r['kernel']}` | {r['what']} | **{r['answer']}** ({r['exit']}) | {used} | {times} | "
                     f"{r['folder_to_decision_s']:.0f} s | {'–' if cpu is None else f'{cpu:.0f} s'} | "
                     f"{'–' if load is None else f'{load[0]:.1f} to {load[1]:.1f}'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--sample", type=int, default=None, help="n_max (default: 2000 tiny, 400 smollm2)")
    parser.add_argument("--kernel", action="append", default=[], metavar="NAME=PATH",
                        help="a kernel folder to time (repeatable; default: the ones KERNELS names); the other "
                             "kernels' rows of the model's JSON are kept")
    args = parser.parse_args()
    chosen = dict(k.split("=", 1) for k in args.kernel) if args.kernel else \
        {name: where for name, (where, _) in KERNELS.items()}
    sample = args.sample or SAMPLE[args.model]
    out = REPO / "docs" / "kernels" / f"loop_{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    if args.kernel and out.is_file():
        # Measuring some kernels again keeps the other kernels' rows of the same model, n_max and ε.
        kept = json.loads(out.read_text(encoding="utf-8"))
        if (kept.get("n_max"), kept.get("epsilon")) == (sample, EPSILON[args.model]):
            rows = [r for r in kept["kernels"] if r["kernel"] not in chosen]
    with tempfile.TemporaryDirectory(prefix="invar-kernel-loop-") as tmp:
        for name, where in chosen.items():
            print(f"{name}: init, prepare, run, admit …", file=sys.stderr, flush=True)
            rows.append(loop(name, (REPO / where).resolve(), args.model, sample, Path(tmp)))
            rows.sort(key=lambda r: list(KERNELS).index(r["kernel"]) if r["kernel"] in KERNELS else len(KERNELS))
            r = next(row for row in rows if row["kernel"] == name)
            print(f"{name}: {r['answer']} (exit {r['exit']}) in {r['folder_to_decision_s']} s: {r['reason']}",
                  file=sys.stderr, flush=True)
            doc = {"command": f".venv/bin/python scripts/kernel_loop.py --model {args.model}"
                              + (f" --sample {args.sample}" if args.sample else "")
                              + "".join(f" --kernel {k}" for k in args.kernel),
                   "model": args.model, "n_max": sample, "epsilon": EPSILON[args.model],
                   "host": f"{platform.machine()}, shared 2-core machine",
                   "kernels": rows}
            out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
