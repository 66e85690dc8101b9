"""How the reading commands grow with a use run's size: `use admit`, `use verify`, `compare numerical RUN --contract`
and `use plan`, at 10^3 to 10^6 paired units, in time and peak memory, with the fitted growth.

    .venv/bin/python bench/scale.py [--keep DIR] [--sizes 1000,10000,100000,1000000] [--baseline OLD/src]
                                    [--commands admit,verify,compare,plan] [--json OUT]

Per size the script writes a population of that many arithmetic problems (`invar.tasks.arithmetic.population`,
split eval, seed 11: the shipped population holds 20,000), a declaration of the shipped model on HF against its NF4
candidate (as `bench/run_memory.py --engine fake` writes it: T = 1, 5 tokens, batches of 16, 64 requests per call,
paired-binary-score at ε = 0.01), `use prepare`, and a run made by `invar.runner.use_run.use_run` with the tests'
in-process fake worker (`tests/support/fake_worker.py`: the real protocol, client and store, every record bound to
its call; the answers scripted from each request). Run and contract are kept under `--keep DIR/<size>` (by default
`bench/.cache/scale`, ignored by git) and reused by later calls: a million-unit run takes a while to make (about 450
CPU s), once. `--maker SRC` makes them with another checkout's `src` (one whose worker code does not change while they
are made).

Then each command runs as a fresh process importing `src` (this checkout's, and with `--baseline` another's, right
after it on the same run, so both see the same machine load): `use admit RUN --contract C --json --receipt R`,
`use verify R --run RUN --contract C --trust-embedded-key --json`, `compare numerical RUN --contract C --json`, and
`use plan C --assume "worse=0.01 better=0.01" --json` (the contract's own n is the size: the plan also computes the
power the contract's n reaches). Reported per command and size: wall seconds, CPU seconds (user + system of the
process and the helper processes it forks), its own CPU seconds (the process alone: with a free second core, its
critical path), peak resident memory (`ru_maxrss` of the process), and the sha256 of its stdout (admission's `--json`
and the compare report are the same bytes before and after, or the script says so). Per command and tree, the growth is
the least-squares slope of log(CPU s) on log(units) over the sizes ≥ 10^4 (1.0 is linear).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO / "bench", REPO / "tests"):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from report import compile_sources  # noqa: E402
from run_memory import FAKE_RUN, fake_package  # noqa: E402

from invar.records import RunStore  # noqa: E402

SEED = 11

# `invar ARGS` printing its peak RSS (as bench/run_memory.py's MEASURED) and its own CPU: the process alone, without the
# helper processes it forks and reaps (counted in `cpu_s`), so the command's critical path on a free second core.
MEASURED = ("import resource, runpy, sys\n"
            "sys.argv = ['invar'] + sys.argv[1:]\n"
            "try:\n"
            "    runpy.run_module('invar.cli', run_name='__main__')\n"
            "finally:\n"
            "    usage = resource.getrusage(resource.RUSAGE_SELF)\n"
            "    print(f'peak-rss-kib {usage.ru_maxrss}', file=sys.stderr)\n"
            "    print(f'self-cpu-s {usage.ru_utime + usage.ru_stime}', file=sys.stderr)\n")


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def write_inputs(folder: Path, units: int) -> Path:
    """`folder/scale.toml` over a population of `units` arithmetic problems written beside it."""
    from invar import canonical
    from invar.tasks import arithmetic

    population = folder / "population.jsonl"
    if not population.exists():
        population.write_bytes(arithmetic.population_bytes(arithmetic.population("eval", SEED, units, "scale")))
    digest = canonical.file_sha256(population)
    reference, candidate = fake_package("none"), fake_package("nf4")
    lines = [
        'name = "scale"',
        "[population]", f'path = "{population}"', f'sha256 = "{digest}"',
        "[scorer]", 'name = "arithmetic-exact"',
        "[sampling]", "temperature = 1.0", "max_tokens = 5",
        "[requirement]", 'standard = "population"', 'epsilon = "0.01"', 'confidence = "0.95"',
        'method = "paired-binary-score"',
        "[pairing]", "seed = 3", 'layout = "b16"',
        "[layouts.b16]", "batch_size = 16",
        "[invariance]", "required = false",
        "[execution]", "requests_per_call = 64",
        "[reference]", *(f"{k} = {_toml(v)}" for k, v in reference.items()),
        "[candidate]", *(f"{k} = {_toml(v)}" for k, v in candidate.items()),
    ]
    declaration = folder / "scale.toml"
    declaration.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return declaration


def timed(args: list[str], src: Path, script: str = MEASURED, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Run `invar ARGS` (or `script`) as a fresh process importing `src`: wall, CPU, peak RSS, stdout digest."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode not in ok:
        raise SystemExit(f"bench/scale.py: {' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    rss = [line for line in out.stderr.splitlines() if line.startswith("peak-rss-kib ")][-1]
    return {"wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "peak_rss_mib": round(int(rss.split()[1]) / 1024, 1), "exit": out.returncode,
            "stdout_sha256": hashlib.sha256(out.stdout.encode()).hexdigest(), **_own_cpu(out.stderr)}


def _own_cpu(stderr: str) -> dict[str, float]:
    """`self_cpu_s`, the command's own process's CPU (user + system), where its script printed it."""
    lines = [line for line in stderr.splitlines() if line.startswith("self-cpu-s ")]
    return {"self_cpu_s": round(float(lines[-1].split()[1]), 2)} if lines else {}


def make_run(folder: Path, units: int, maker: Path) -> tuple[Path, Path]:
    """The contract and closed fake-worker run of `units` units in `folder`, made once (reused when present)."""
    folder.mkdir(parents=True, exist_ok=True)
    contract, run = folder / "scale.contract.json", folder / "run"
    if not contract.exists():
        timed(["use", "prepare", str(write_inputs(folder, units))], maker)
    closed = False
    marker = folder / "run.closed"  # a run verified closed once is not verified again by each bench (10^6: a minute)
    if (run / "records.sqlite").exists() and not marker.exists():
        with RunStore.open(run) as store:
            closed = store.verify().closed
        if closed:
            marker.write_text("verified closed\n")
    closed = closed or (marker.exists() and (run / "records.sqlite").exists())
    if not closed:
        if run.exists():
            raise SystemExit(f"bench/scale.py: {run} holds an unfinished run; remove it to make it again")
        made = timed([str(contract), str(run), str(maker.parent / "tests")], maker, script=FAKE_RUN)
        print(f"  made the {units}-unit run in {made['wall_s']} s ({made['cpu_s']} CPU s)", flush=True)
    return contract, run


def measure(command: str, contract: Path, run: Path, src: Path, scratch: Path) -> dict[str, Any]:
    receipt = scratch / "receipt.json"
    if command == "admit":
        receipt.unlink(missing_ok=True)
        return timed(["use", "admit", str(run), "--contract", str(contract), "--json", "--quiet",
                      "--receipt", str(receipt)], src, ok=(0, 10, 11))
    if command == "verify":
        if not receipt.exists():
            timed(["use", "admit", str(run), "--contract", str(contract), "--quiet", "--receipt", str(receipt)], src,
                  ok=(0, 10, 11))
        return timed(["use", "verify", str(receipt), "--run", str(run), "--contract", str(contract),
                      "--trust-embedded-key", "--json", "--quiet"], src)
    if command == "compare":
        return timed(["compare", "numerical", str(run), "--contract", str(contract), "--json", "--quiet"], src)
    return timed(["use", "plan", str(contract), "--assume", "worse=0.01 better=0.01", "--json", "--quiet"], src)


def growth(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(seconds) on log(units) over the sizes ≥ 10^4."""
    pts = [(math.log(n), math.log(s)) for n, s in points if n >= 10_000 and s > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / sxx, 3) if sxx > 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, default=REPO / "bench" / ".cache" / "scale",
                        help="where the runs are made and kept (default bench/.cache/scale, which git ignores)")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--commands", default="admit,verify,compare,plan")
    parser.add_argument("--baseline", type=Path, default=None, help="also time this source tree (OLD/src)")
    parser.add_argument("--maker", type=Path, default=REPO / "src", help="the source tree that makes the runs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    trees = {"this": (REPO / "src").resolve()}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    commands = [c for c in args.commands.split(",") if c]
    compile_sources(*trees.values())
    result: dict[str, Any] = {"sizes": sizes, "trees": {k: str(v) for k, v in trees.items()}, "cores": os.cpu_count(),
                              "bytecode": "compiled before timing", "rows": []}
    for units in sizes:
        folder = args.keep / str(units)
        contract, run = make_run(folder, units, args.maker.resolve())
        for command in commands:
            got: dict[str, dict[str, Any]] = {}
            for name, src in trees.items():
                scratch = folder / "scratch"  # one receipt path, so admission prints the same bytes in both trees
                scratch.mkdir(exist_ok=True)
                got[name] = measure(command, contract, run, src, scratch)
                row = {"units": units, "command": command, "tree": name, "load": os.getloadavg()[0], **got[name]}
                result["rows"].append(row)
                print(f"{units:>8} {command:<8} {name:<8} {row['wall_s']:>7} s wall {row['cpu_s']:>7} s CPU "
                      f"({row.get('self_cpu_s', '-')} s its own) {row['peak_rss_mib']:>7} MiB", flush=True)
                if args.json:  # written after every row: a bench stopped part-way keeps what it measured
                    _write(args.json, result, commands, trees)
            if command in ("admit", "compare") and len(got) == 2 and \
                    got["this"]["stdout_sha256"] != got["baseline"]["stdout_sha256"]:
                raise SystemExit(f"bench/scale.py: {command} at {units} units prints other bytes than the baseline")
    if args.json:
        _write(args.json, result, commands, trees)
    print("growth (slope of log CPU s on log units, sizes >= 10^4):", _growths(result, commands, trees))
    return 0


def _growths(result: dict[str, Any], commands: list[str], trees: dict[str, Path]) -> dict[str, float | None]:
    return {f"{c}/{t}": growth([(r["units"], r["cpu_s"]) for r in result["rows"]
                                if r["command"] == c and r["tree"] == t]) for c in commands for t in trees}


def _write(path: Path, result: dict[str, Any], commands: list[str], trees: dict[str, Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result, "growth": _growths(result, commands, trees)}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
