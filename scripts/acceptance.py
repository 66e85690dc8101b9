"""Run the acceptance contracts end to end with the real commands and keep what each decided.

    .venv/bin/python scripts/acceptance.py [NAME ...] [--out runs/acceptance]

For each contract in contracts/ (all of ACCEPTANCE, or the names given): `invar use prepare`, `invar use plan`
(population standard), `invar use run`, `invar use admit --json --expect-head HEAD`. The admit output is kept in
docs/acceptance/<name>.admit.json, and docs/acceptance/summary.json gathers the figures docs/acceptance.md reports
(answer, counts, bound, wall times, the run's head).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE = ["arith-split-k", "arith-fixed-block", "arith-nf4-fixed-block", "arith-vllm", "arith-finite"]
"""The decisions of docs/acceptance.md: invariance broken, batch-invariant FP32, NF4, cross-engine, finite domain."""


def invar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "invar"), *args], capture_output=True, text=True,
                          cwd=ROOT)


def run_one(name: str, out: Path) -> dict[str, object]:
    decl = ROOT / "contracts" / f"{name}.toml"
    prepared = invar("use", "prepare", str(decl), "--out", str(out), "--json")
    if prepared.returncode != 0:
        raise SystemExit(f"{name}: prepare failed: {prepared.stderr.strip()}")
    contract = out / f"{name}.contract.json"
    planned = None
    doc = json.loads(contract.read_text())
    if doc["requirement"]["standard"] == "population":
        p = invar("use", "plan", str(contract), "--assume", "worse=0.01 better=0.01", "--json")
        planned = json.loads(p.stdout) if p.returncode == 0 else p.stderr.strip()
    run_dir = out / f"run-{name}"
    started = time.perf_counter()
    ran = invar("use", "run", str(contract), "--run", str(run_dir), "--json")
    run_s = time.perf_counter() - started
    if ran.returncode != 0:
        raise SystemExit(f"{name}: use run failed: {ran.stderr.strip()}")
    outcome = json.loads(ran.stdout)
    admitted = invar("use", "admit", str(run_dir), "--contract", str(contract), "--expect-head",
                     outcome["chain_head"], "--json")
    if admitted.returncode not in (0, 10, 11):
        raise SystemExit(f"{name}: use admit refused the run: {admitted.stderr.strip()}")
    decision = json.loads(admitted.stdout)
    (ROOT / "docs" / "acceptance" / f"{name}.admit.json").write_text(admitted.stdout)
    print(f"{name}: {decision['answer']} ({decision['reason']}); use run {run_s:.0f} s", flush=True)
    return {"name": name, "answer": decision["answer"], "reason": decision["reason"],
            "units": decision["task_loss"]["n"], "task_loss": decision["task_loss"], "bound": decision["bound"],
            "invariance": decision["invariance"], "diagnostics": decision["diagnostics"],
            "calls": outcome["calls_total"], "use_run_s": round(run_s, 1), "chain_head": outcome["chain_head"],
            "contract_sha256": outcome["contract_sha256"], "plan": planned,
            "command": f"invar use prepare contracts/{name}.toml && invar use run contracts/{name}.contract.json "
                       f"--run runs/{name} && invar use admit runs/{name} --contract contracts/{name}.contract.json"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=ACCEPTANCE)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "acceptance")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = ROOT / "docs" / "acceptance" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for name in args.names:
        summary[name] = run_one(name, args.out)
        summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
