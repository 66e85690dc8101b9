"""Memory and storage of a use decision at scale: a real 20,000-unit plan through `use prepare`, `use run`, `use admit`.

    .venv/bin/python bench/run_memory.py [--units 20000] [--engine hf|fake] [--keep DIR] [--src SRC] [--json OUT]

The contract (written and prepared here, identities probed from the installed worker): the shipped model on Hugging
Face, FP32 with 1 thread as the reference against FP32 with 2 threads as the candidate, `--units` seeded prompts of
the evaluation population at T = 1 in one pairing layout of batches of 16, 64 requests per call. The commands:
`use prepare`, `use run`, `use admit`, `inspect records --json`, and a resumed `use run`: a copy of the run's first
half of records (what a run killed half-way leaves) resumed to the end, then decided again (it must decide as the
whole run did). Each command runs in a process of its own, importing this checkout's `src`; reported for each: wall
time and the peak resident memory of the core's process alone (`ru_maxrss` of that process, read as it exits: the
engine workers are other processes and are not counted), and for the run: bytes in the store (database and
write-ahead log) per unit and per call, and the records' count.

`--keep DIR` keeps the declaration, contract and run in DIR, and a later call with the same DIR (and the same
`--units` and `--engine`) reuses the run instead of making it again: the run is made once and read by every
measurement after (a 20,000-unit run of the shipped model takes about 40 minutes on 2 cores). `--src SRC` measures
the commands of another checkout's `src` (an older commit's) on the same run.

`--engine fake`: the run's records are made by the orchestration tests' in-process fake worker
(`tests/support/fake_worker.py`: the real protocol, client and store; the answers scripted from each request) passing
for the HF worker, with the candidate loading the model NF4 (how the fake tells the packages apart): seconds instead of
minutes. `use prepare`, `use admit` and `inspect records` are the real commands, each in its own process, and read a
run of the same plan, calls and shapes of outputs (a few tokens per response) as the engine's; they never see a
worker. `use run` and the resumed `use run` are then `invar.runner.use_run.use_run` (what the command runs) with the
fake transport, in a process of their own; their peak includes the fake workers, which are threads of that process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO, REPO / "tests"):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from declarations import hf_package, write_declaration  # noqa: E402
from report import write_json  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, worker_digest  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.records.store import _SCHEMA, DB_NAME  # noqa: E402

# Runs the CLI in this process and prints its own peak RSS (KiB on Linux) on stderr's last line as it exits.
MEASURED = ("import resource, runpy, sys\n"
            "sys.argv = ['invar'] + sys.argv[1:]\n"
            "try:\n"
            "    runpy.run_module('invar.cli', run_name='__main__')\n"
            "finally:\n"
            "    print(f'peak-rss-kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)\n")


# `use_run` with the tests' fake transport, printing its process's peak RSS as MEASURED does.
FAKE_RUN = ("import resource, sys\n"
            "sys.path[:0] = [sys.argv[3]]\n"
            "from pathlib import Path\n"
            "import itertools, os\n"
            "from support import fake_worker\n"
            "from support.fake_worker import FakeTransport\n"
            "fake_worker._PIDS = itertools.count(os.getpid() * 100)  # a resumed run's workers are other processes\n"
            "from invar.runner.use_run import use_run\n"
            "try:\n"
            "    use_run(Path(sys.argv[1]), Path(sys.argv[2]), transport=FakeTransport())\n"
            "finally:\n"
            "    print(f'peak-rss-kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)\n")


def fake_package(quantization: str) -> dict[str, Any]:
    """The shipped model as the tests' fake worker passes for it on HF (`ENGINE_VERSION`, its launch settings)."""
    from support.fake_worker import ENGINE_VERSION
    return {"engine": "hf", "engine_version": ENGINE_VERSION, "settings": {"device": "cpu", "threads": 1},
            "model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
            "dtype": "float32", "quantization": quantization}


def declaration(folder: Path, units: int, engine: str) -> Path:
    if engine == "fake":
        reference, candidate = fake_package("none"), fake_package("nf4")
        assert worker_digest("hf")  # the fake reports the HF worker's code digest, as `use prepare` pins it
    else:
        reference, candidate = hf_package(threads=1), hf_package(threads=2)
    return write_declaration(folder, "bench-memory", units=units, per_call=64, epsilon="0.01", seed=3,
                             reference=reference, candidate=candidate)


def _bytes_in(value: Any) -> int:
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, dict):
        return sum(_bytes_in(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_bytes_in(v) for v in value)
    return 0


def cut_copy(run: Path, into: Path, keep: int) -> None:
    """`into`: a run holding the first `keep` records of `run`, as a run killed after its record `keep` is left."""
    into.mkdir()
    conn = sqlite3.connect(into / DB_NAME, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        conn.execute("ATTACH DATABASE ? AS whole", (str(run / DB_NAME),))
        conn.execute("INSERT INTO log SELECT * FROM whole.log WHERE seq <= ?", (keep,))
        conn.execute("DETACH DATABASE whole")
    finally:
        conn.close()


def measured(*args: str | Path, ok: tuple[int, ...] = (0,), src: Path = REPO / "src",
             script: str = MEASURED) -> dict[str, Any]:
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, cwd=REPO,
                         env=env)
    wall = time.perf_counter() - t0
    if out.returncode not in ok:
        raise SystemExit(f"bench/run_memory.py: invar {' '.join(map(str, args))} exited {out.returncode}: "
                         f"{out.stderr.strip()[-2000:]}")
    rss = [line for line in out.stderr.splitlines() if line.startswith("peak-rss-kib ")][-1]
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(int(rss.split()[1]) / 1024, 1),
            "exit": out.returncode, "stdout": out.stdout}


def _closed(run: Path) -> bool:
    if not (run / DB_NAME).exists():
        return False
    with RunStore.open(run) as store:
        return store.verify().closed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=20000)
    parser.add_argument("--engine", choices=("hf", "fake"), default="hf",
                        help="what makes the run's records: the HF worker, or the tests' fake worker (see above)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the contract and the run here, and reuse a run already made here")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the package the commands import")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"units": args.units, "engine": args.engine, "src": str(args.src)}
    with tempfile.TemporaryDirectory(prefix="invar-memory-") as tmp:
        folder = Path(tmp) if args.keep is None else args.keep
        folder.mkdir(parents=True, exist_ok=True)
        decl = folder / "bench-memory.toml"
        if not decl.exists():
            declaration(folder, args.units, args.engine)
        contract = folder / "bench-memory.contract.json"
        run = folder / "run"
        resumed = folder / "resumed"
        src = args.src.resolve()
        fake = (FAKE_RUN, str(REPO / "tests"))
        steps = {
            "use prepare": ("use", "prepare", decl),
            "use run": ("use", "run", contract, "--run", run),
            "use admit": ("use", "admit", run, "--contract", contract, "--json"),
            "inspect records": ("inspect", "records", run, "--json"),
            "resumed use run": ("use", "run", contract, "--run", resumed),
            "use admit (resumed)": ("use", "admit", resumed, "--contract", contract, "--json"),
        }
        decisions: dict[str, Any] = {}
        for name, command in steps.items():
            if name == "use run" and _closed(run):
                result["use run"] = "reused"
                print(f"use run: reusing {run}", flush=True)
                continue
            if name == "resumed use run":
                shutil.rmtree(resumed, ignore_errors=True)
                with RunStore.open(run) as store:
                    half = store.verify().records // 2
                cut_copy(run, resumed, half)
                result["resumed_from_records"] = half
            if args.engine == "fake" and name.endswith("use run"):
                got = measured(command[2], command[4], fake[1], src=src, script=fake[0])
            else:
                got = measured(*command, ok=(0, 10, 11) if name.startswith("use admit") else (0,), src=src)
            if name.startswith("use admit"):
                decision = json.loads(got["stdout"])
                decisions[name] = {k: decision[k] for k in ("answer", "reason", "bound", "task_loss")}
                result.setdefault("decision", {"answer": decision["answer"], "bound": decision.get("bound")})
                got["json_sha256"] = hashlib.sha256(got["stdout"].encode()).hexdigest()
            if name == "inspect records":
                got["json_sha256"] = hashlib.sha256(got["stdout"].encode()).hexdigest()
            del got["stdout"]
            result[name] = got
            print(f"{name}: {got['wall_s']} s, core peak RSS {got['peak_rss_mib']} MiB", flush=True)
        if decisions["use admit"] != decisions["use admit (resumed)"]:
            raise SystemExit("bench/run_memory.py: the resumed run decides otherwise than the whole run: "
                             f"{decisions}")
        files = [run / "records.sqlite", run / "records.sqlite-wal"]
        size = sum(f.stat().st_size for f in files if f.exists())
        with RunStore.open(run) as store:
            calls = sum(1 for c in store.calls() if c.call.method == "generate")
            records = store.verify().records
            # The population file and tokenizer kept once per run (so the run verifies on its own): a fixed cost.
            inputs = _bytes_in(store.meta().get("inputs"))
    per_unit = (size - inputs) / (2 * args.units)
    result["store"] = {"bytes": size, "inputs_bytes": inputs, "generate_calls": calls, "records": records,
                       "bytes_per_unit_per_package": round(per_unit, 1),
                       "bytes_per_generate_call": round((size - inputs) / calls, 1)}
    print(f"store: {size / 2**20:.1f} MiB for {args.units} units × 2 packages ({calls} generate calls, "
          f"{records} records), of which {inputs / 2**20:.2f} MiB the run's inputs: {per_unit:.0f} bytes per unit "
          "per package")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
