"""How long a whole `invar use plan` command takes, per bound method and for all methods together.

Run from the repository root:

    .venv/bin/python bench/plan_speed.py [--reps 5] [--cases seed,grid] [--baseline OLD/src] [--json plan_speed.json]

For each case (an assumption p_worse, p_better, a contract's ε and δ, and a power) the script prepares the
example contract `contracts/arith-fixed-block.toml` with that ε (in a temporary folder, data paths made absolute),
then runs `invar use plan CONTRACT --assume "worse=.. better=.." --json` as a fresh process, once per method
(`--method M`) and once for all methods, `--reps` times each, interleaved (method after method, repetition after
repetition, so that a change in the machine's load touches every method alike). Reported per command: the planned n
(the same in every repetition, else the script stops: a plan is a pure function of its inputs), the median wall
time with its minimum and maximum, and the median CPU time of the process and its children (user + system; the
plan uses forked worker processes where there are several cores, so wall < CPU there). The start-up row is the
import of the command-line application alone (`python -c "import invar.cli.app"`), part of every command.

`--prepare-src SRC` prepares the contract with another tree's `use prepare` (the plan reads only its ε, δ and
method; a checkout whose worker code has moved since the pins were taken cannot prepare it).

`--baseline OLD/src` also runs every command on another source tree (an older checkout's `src`, first on
PYTHONPATH), right after the same command on this one, so that before and after see the same machine load; the
table then shows both (and the script checks that both plan the same n, except for betting, a simulation).

Cases: `seed` is p_worse = p_better = 0.01 at ε = 0.005 (the figures docs/statistics.md reports); `grid` adds three
rows of its ratio table (0.002/0.002 at ε = 0.005, 0.02/0.02 at ε = 0.01, 0.05/0.05 at ε = 0.02); `eps` is
0.01/0.01 at ε = 0.05, 0.01, 0.005 and 0.002; `vary` is the seed case at δ = 0.01 and power 0.9. δ = 0.05 and power
0.8 unless the case says otherwise (δ through the contract's `confidence`, the power through `--power`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where a bench's name could hide a standard module
# (statistical_figures.py would hide `statistics`): take the folder off before importing anything else.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))  # last: the standard modules come first
from report import compile_sources  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONTRACT = REPO / "contracts" / "arith-fixed-block.toml"
PYTHON = REPO / ".venv" / "bin" / "python"
INVAR = REPO / ".venv" / "bin" / "invar"
METHODS = ("hoeffding", "maurer-pontil", "betting", "paired-binary-exact", "paired-binary-score")
# (p_worse, p_better, ε, confidence 1 − δ, power)
CASES: dict[str, list[tuple[float, float, str, str, float]]] = {
    "seed": [(0.01, 0.01, "0.005", "0.95", 0.8)],
    "grid": [(0.002, 0.002, "0.005", "0.95", 0.8), (0.02, 0.02, "0.01", "0.95", 0.8),
             (0.05, 0.05, "0.02", "0.95", 0.8)],
    "eps": [(0.01, 0.01, eps, "0.95", 0.8) for eps in ("0.05", "0.01", "0.005", "0.002")],
    "vary": [(0.01, 0.01, "0.005", "0.99", 0.9)],
}


def prepare(epsilon: str, folder: Path, source: Path | None = None, confidence: str = "0.95") -> Path:
    """The example contract with this ε and confidence, prepared into `folder` (its relative data paths made
    absolute) by the `use prepare` of `source` (a checkout's `src`, first on PYTHONPATH), or of this tree."""
    text = CONTRACT.read_text()
    text = re.sub(r"(?m)^epsilon *=.*$", f'epsilon = "{epsilon}"', text)
    text = re.sub(r"(?m)^confidence *=.*$", f'confidence = "{confidence}"', text)
    text = text.replace('"../', f'"{REPO}/')
    contract = folder / f"eps-{epsilon}-conf-{confidence}" / "arith-fixed-block.toml"
    contract.parent.mkdir(parents=True, exist_ok=True)
    contract.write_text(text)
    out = contract.parent / "prepared"
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([str(INVAR), "use", "prepare", str(contract), "--out", str(out)], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"use prepare failed: {done.stderr.strip()}")
    return out / "arith-fixed-block.contract.json"


def timed(command: list[str], source: Path | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and its children, stdout) of one command; `source` first on
    PYTHONPATH."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), *filter(None, [env.get("PYTHONPATH")])])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def planned(stdout: str) -> dict[str, int]:
    """method -> n from the command's JSON."""
    data = json.loads(stdout)
    rows = data["rows"] if isinstance(data, dict) and "rows" in data else data
    return {row["method"]: int(row["n"]) for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each command (default 5)")
    parser.add_argument("--cases", default="seed,grid", help="comma-separated: seed, grid (default both)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods (default all five)")
    parser.add_argument("--baseline", type=Path, default=None, help="also time this source tree (e.g. OLD/src)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--prepare-src", type=Path, default=None,
                        help="prepare the contract with this source tree's `use prepare` (a checkout whose worker "
                             "digests match the contract's pins, while this one's are stale)")
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"this": None}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    methods = [m for m in args.methods.split(",") if m]
    cases = [case for name in args.cases.split(",") if name for case in CASES[name]]
    compile_sources(REPO / "src", *[tree for tree in trees.values() if tree is not None])
    results: dict[str, object] = {"reps": args.reps, "cores": os.cpu_count(), "load_before": os.getloadavg(),
                                  "bytecode": "compiled before timing"}

    startup = [timed([str(PYTHON), "-c", "import invar.cli.app"])[:2] for _ in range(args.reps)]
    start_wall = statistics.median(w for w, _ in startup)
    results["startup"] = {"wall_median": start_wall, "cpu_median": statistics.median(c for _, c in startup)}
    print(f"start-up (import invar.cli.app): median {start_wall:.2f} s wall")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as scratch:
        for p_worse, p_better, epsilon, confidence, power in cases:
            contract = prepare(epsilon, Path(scratch), args.prepare_src, confidence)
            commands = {m: ["--method", m] for m in methods}
            if len(methods) > 1:
                commands["all"] = [arg for m in methods for arg in ("--method", m)]
            keys = [(name, tree) for name in commands for tree in trees]
            walls: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
            cpus: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
            ns: dict[tuple[str, str], dict[str, int]] = {}
            for _ in range(args.reps):
                for name, extra in commands.items():
                    for tree, source in trees.items():
                        base = [str(INVAR), "use", "plan", str(contract), "--assume"]
                        assume = f"worse={p_worse} better={p_better}"
                        wall, cpu, out = timed([*base, assume, "--power", str(power), *extra, "--json"], source)
                        got = planned(out)
                        if ns.setdefault((name, tree), got) != got:
                            raise SystemExit(f"{name}: the planned n changed between repetitions: {got}")
                        walls[(name, tree)].append(wall)
                        cpus[(name, tree)].append(cpu)
            for name in commands:
                exact = {m: n for m, n in ns[(name, "this")].items() if m != "betting"}
                if "baseline" in trees and exact != {m: n for m, n in ns[(name, "baseline")].items() if m != "betting"}:
                    raise SystemExit(f"{name}: this tree and the baseline plan different n: {ns}")
                for tree in trees:
                    key = (name, tree)
                    rows.append(
                        {
                            "p_worse": p_worse,
                            "p_better": p_better,
                            "epsilon": float(epsilon),
                            "delta": round(1.0 - float(confidence), 12),
                            "power": power,
                            "command": name,
                            "tree": tree,
                            "n": ns[key],
                            "wall_median": statistics.median(walls[key]),
                            "wall_min": min(walls[key]),
                            "wall_max": max(walls[key]),
                            "cpu_median": statistics.median(cpus[key]),
                            "walls": walls[key],
                        }
                    )
    results["rows"] = rows
    results["load_after"] = os.getloadavg()
    print("| p_worse | p_better | eps | delta | power | command | tree | n | wall median s | wall min-max s | "
          "cpu median s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        n = row["n"]
        shown = ", ".join(f"{v:,}" for v in n.values()) if isinstance(n, dict) else str(n)
        print(
            f"| {row['p_worse']:g} | {row['p_better']:g} | {row['epsilon']:g} | {row['delta']:g} | {row['power']:g} | "
            f"{row['command']} | {row['tree']} | "
            f"{shown} | {row['wall_median']:.2f} | {row['wall_min']:.2f}-{row['wall_max']:.2f} | "
            f"{row['cpu_median']:.2f} |"
        )
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
