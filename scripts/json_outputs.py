"""Every command's `--json` output and a signed receipt on a fixed set of runs, written to files to `cmp` across
two checkouts: a change that claims to keep each output's bytes is shown to.

    .venv/bin/python scripts/json_outputs.py make DIR                 # the runs, once (the tests' run writer)
    .venv/bin/python scripts/json_outputs.py run DIR OUT [--src SRC]  # the commands, importing SRC (default: src)
    cmp -r OUT_BEFORE OUT_AFTER   # or diff -r

`--engine NAME CONTRACT RUN` (repeatable) adds a run an engine made (e.g. runs/gguf-ladder/Q8_0, SmolLM2 on
llama.cpp), decided by the same commands.

`make` writes, with the contract tests' run writer (tests/contract/contract_runs.py) and a fixed key pair, one closed
run per kind of decision: Violated on a population bound, plan /3 measurements decided by `max_kl`, invariance relative
to the reference, a sequential run stopped at a look, a scorer of losses in a declared range, and determinism relative
to the reference broken on three units; and an imported contract over a table of exported losses. A scenario whose
folder exists is kept (`make` again adds only what is new). `run` runs, for each run, `use admit --json` (with a signed
receipt), `use verify --json`, `use plan --json`, `compare numerical --json` and `inspect records --json`, and for the
imported contract `use admit --json` and `use summary --json`, each in a process of its own importing SRC, and keeps
each one's stdout, exit status and receipt under OUT. The runs are made once, so their records (and chain heads) are the
same for both checkouts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("violated", "measured", "relative", "sequential", "range", "determinism")


def make(folder: Path) -> None:
    """Write each scenario's contract and closed run under `folder`, and one key pair."""
    sys.path[:0] = [str(REPO / "tests" / "contract"), str(REPO / "tests")]  # the tests' run writers
    import test_determinism as determinism  # type: ignore[import-not-found]
    import test_measurements as measured  # type: ignore[import-not-found]
    import test_range_losses as ranged  # type: ignore[import-not-found]
    import test_relative_invariance as relative  # type: ignore[import-not-found]
    import test_sequential_admit as sequential  # type: ignore[import-not-found]
    from contract_runs import RunWriter, make_workspace, unit_ids  # type: ignore[import-not-found]
    from imported import test_ci as imports

    from invar.contract.receipt import new_key_pair
    from invar.imported import prepare_imported

    folder.mkdir(parents=True, exist_ok=True)
    fresh = [name for name in (*SCENARIOS, "imported") if not (folder / name).exists()]  # runs made are kept
    if not (folder / "keys").exists():
        new_key_pair(folder / "keys", "owner")
    if "violated" in fresh:
        ws = make_workspace(folder / "violated", units=300, requirement={"epsilon": "0.1"})
        RunWriter(ws, folder / "violated" / "run", keep_inputs=True).complete(
            candidate_wrong=unit_ids(ws, 120)).close()
    if "measured" in fresh:
        ws = make_workspace(folder / "measured", units=measured.UNITS,
                            measurements={**measured.MEASURE, "max_kl": "0.001"}, requirement=measured.FINITE)
        measured.write_run(ws, folder / "measured" / "run",
                           candidate_capture=lambda i, rows: measured._capture(1000 + i, rows, ws.vocab.size))
    if "relative" in fresh:
        ws = make_workspace(folder / "relative", units=relative.N, invariance=relative.RELATIVE,
                            candidate=relative.UNPATCHED)
        relative._run(ws, folder / "relative" / "run",
                      {"candidate": unit_ids(ws, 3, 5), "reference": unit_ids(ws, 2)})
    if "sequential" in fresh:
        ws = make_workspace(folder / "sequential", units=sequential.UNITS, **sequential.SEQUENTIAL)
        sequential._run(ws, folder / "sequential" / "run", 1, candidate_wrong=tuple(unit_ids(ws, 16)))
    if "range" in fresh:
        ws = ranged._workspace(folder / "range")
        ranged._run(ws, folder / "range" / "run", ranged._offsets(ws, 1, 2), ranged._offsets(ws, 2, 3))
    if "determinism" in fresh:  # three units the candidate does not reproduce, twenty the reference does not either
        ws = make_workspace(folder / "determinism", units=determinism.N, determinism=determinism.DETERMINISM,
                            **determinism.NO_INVARIANCE)
        ref_varies = unit_ids(ws, 20, 10)
        determinism._run(ws, folder / "determinism" / "run",
                         {"reference": ref_varies, "candidate": [*ref_varies[:5], *unit_ids(ws, 3, 200)]})
    if "imported" in fresh:  # exported scores: a table of 600 items, 30 lost by the candidate only, 4 won
        (folder / "imported").mkdir()
        ref, cand = imports._binary(600, 30, 4)
        imports._table(folder / "imported" / "losses.jsonl", ref, cand)
        prepare_imported(imports._declare(folder / "imported", "gate", imports.POPULATION))

def _contract(scenario: Path) -> Path:
    (path,) = scenario.glob("*.contract.json")
    return path


def run(folder: Path, out: Path, src: Path, engine: list[tuple[str, Path, Path]]) -> None:
    """Each scenario's commands, importing `src`: stdout, exit status and receipt kept under `out`."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    keys = folder / "keys"
    _imported(folder, out, env)
    for name, contract, runs in [(n, _contract(folder / n), folder / n / "run") for n in SCENARIOS] + engine:
        to = out / name
        to.mkdir(parents=True, exist_ok=True)
        receipt = folder / f"{name}.receipt.json"  # one path for every checkout: admit prints it
        receipt.unlink(missing_ok=True)
        commands: dict[str, list[Any]] = {
            "admit": ["use", "admit", runs, "--contract", contract, "--json"],
            "admit-signed": ["use", "admit", runs, "--contract", contract, "--receipt", receipt,
                             "--key", keys / "owner.key", "--json"],
            "verify": ["use", "verify", receipt, "--run", runs, "--contract", contract, "--public-key",
                       keys / "owner.pub", "--json"],
            "plan": ["use", "plan", contract, "--assume", "worse=0.01 better=0.01", "--json"],
            "compare": ["compare", "numerical", runs, "--contract", contract, "--json"],
            "inspect": ["inspect", "records", runs, "--json"],
        }
        for label, args in commands.items():
            done = subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], env=env, cwd=folder,
                                  capture_output=True, timeout=600)
            (to / f"{label}.json").write_bytes(done.stdout)
            (to / f"{label}.rc").write_text(f"{done.returncode}\n", encoding="utf-8")
            if label == "admit-signed" and receipt.is_file():
                (to / "receipt.json").write_bytes(receipt.read_bytes())
            if done.returncode not in (0, 10, 11):
                print(f"{name} {label}: exit {done.returncode}: {done.stderr.decode()[-400:]}", file=sys.stderr)


def _imported(folder: Path, out: Path, env: dict[str, str]) -> None:
    """The imported contract's `use admit --json` and `use summary --json`."""
    to = out / "imported"
    to.mkdir(parents=True, exist_ok=True)
    contract = folder / "imported" / "gate.contract.json"
    for label, args in {"admit": ["use", "admit", "--contract", contract, "--json"],
                        "summary": ["use", "summary", contract, "--json"]}.items():
        done = subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], env=env, cwd=folder,
                              capture_output=True, timeout=600)
        (to / f"{label}.json").write_bytes(done.stdout)
        (to / f"{label}.rc").write_text(f"{done.returncode}\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("make").add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--src", type=Path, default=REPO / "src", help="the package the commands import")
    r.add_argument("--engine", nargs=3, action="append", default=[], metavar=("NAME", "CONTRACT", "RUN"),
                   help="a run an engine made, and its contract: decided by the same commands")
    args = parser.parse_args()
    if args.what == "make":
        make(args.dir.resolve())
    else:
        engine = [(name, Path(contract).resolve(), Path(runs).resolve()) for name, contract, runs in args.engine]
        run(args.dir.resolve(), args.out.resolve(), args.src.resolve(), engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
