"""Run the acceptance contracts end to end with the real commands and keep what each decided.

    .venv/bin/python scripts/acceptance.py [NAME ...] [--out runs/acceptance]
    .venv/bin/python scripts/acceptance.py --redecide [NAME ...] [--out runs/acceptance]
    .venv/bin/python scripts/acceptance.py --real-model [NAME ...] [--out runs/acceptance]

For each contract in contracts/ (all of ACCEPTANCE, or the names given): `invar use prepare`, `invar use plan`
(population standard), `invar use run`, `invar use admit --json --expect-head HEAD`. The admit output is kept in
docs/acceptance/<name>.admit.json, `invar compare numerical RUN --contract` (where the packages' numbers part, from
the same records) in docs/acceptance/<name>.compare.json, and docs/acceptance/summary.json gathers the figures
docs/acceptance.md reports (answer, counts, bound, wall times, the store's bytes, the run's head). A run already
under --out is resumed, so a complete one is decided again without an engine call (`calls_reused`; its `use_run_s`
is then the resume's, not the run's).

`--redecide` runs no engine: it decides the runs kept under --out again, from the same records. `use admit` (the
function) checks every record against the contract the run was made under, exactly as the command does; then the
task-loss bound is computed again with the default method for 0/1 losses (`DEFAULT_BINARY_METHOD`, today
paired-binary-score/1) on the same paired differences, and the decision procedure is applied to it. The contracts fix
paired-binary-exact/1, so this is what a contract naming the new default would decide on these records (its sha256
would differ, so the run itself cannot be admitted under it). Both methods depend on the counts of worse and better
units only, never on their order. The result is kept in summary.json as `redecided`, naming the method version.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE = ["arith-split-k", "arith-fixed-block", "arith-nf4-fixed-block", "arith-vllm", "arith-finite",
              "arith-fixed-block-sequential"]
"""The decisions of docs/acceptance.md: invariance broken, batch-invariant FP32, NF4, cross-engine, finite domain,
and fixed-block decided sequentially."""
REAL_MODEL = ["smollm2-fixed-block", "smollm2-nf4-fixed-block", "smollm2-split-k", "smollm2-nf4", "smollm2-vllm",
              "smollm2-mlx-as-installed", "smollm2-mlx-fixed-up", "smollm2-mlx-as-installed-kl",
              "smollm2-mlx-fixed-up-openblas"]
"""The same questions on the real model, SmolLM2-135M-Instruct on the chat task (docs/acceptance.md, "The real
model"; declared in contracts/real-model/): `--real-model` runs these, building the model first when it is missing
(scripts/build_smollm2.py)."""


def invar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "invar"), *args], capture_output=True, text=True,
                          cwd=ROOT)


def run_one(name: str, out: Path) -> dict[str, object]:
    decl = ROOT / "contracts" / ("real-model" if name in REAL_MODEL else "") / f"{name}.toml"
    prepared = invar("use", "prepare", str(decl), "--out", str(out), "--json")
    if prepared.returncode != 0:
        raise SystemExit(f"{name}: prepare failed: {prepared.stderr.strip()}")
    contract = out / f"{name}.contract.json"
    planned = None
    doc = json.loads(contract.read_text())
    if doc["requirement"]["standard"] == "population":
        p = invar("use", "plan", str(contract), "--assume", "worse=0.01 better=0.01", "--json")
        planned = json.loads(p.stdout) if p.returncode == 0 else p.stderr.strip()
        if isinstance(planned, dict):  # the contract as --out names it, not this machine's path to it
            planned["contract"] = contract.name
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
    # Where the packages' numbers part, from the same records (no engine): kept beside the decision.
    compared = invar("compare", "numerical", str(run_dir), "--contract", str(contract), "--json")
    if compared.returncode in (0, 1):
        (ROOT / "docs" / "acceptance" / f"{name}.compare.json").write_text(compared.stdout)
    rel = decl.relative_to(ROOT).with_suffix("").as_posix()
    store_bytes = sum(f.stat().st_size for f in run_dir.iterdir() if f.is_file() and f.suffix != ".lock")
    return {"name": name, "answer": decision["answer"], "reason": decision["reason"],
            "units": decision["task_loss"]["n"], "task_loss": decision["task_loss"], "bound": decision["bound"],
            "invariance": decision["invariance"], "diagnostics": decision["diagnostics"],
            "calls": outcome["calls_total"], "use_run_s": round(run_s, 1), "chain_head": outcome["chain_head"],
            "calls_reused": outcome["calls_reused"], "store_bytes": store_bytes,
            "contract_sha256": outcome["contract_sha256"], "plan": planned,
            "sequential": decision.get("sequential"), "sequential_stop": outcome.get("sequential_stop"),
            "command": f"invar use prepare {rel}.toml && invar use run {rel}.contract.json "
                       f"--run runs/{name} && invar use admit runs/{name} --contract {rel}.contract.json"}


def redecide(name: str, out: Path) -> dict[str, object]:
    """The kept run of `name` decided again with the default method for 0/1 losses (see the module docstring)."""
    import numpy as np

    from invar.contract.admit import admit
    from invar.contract.decide import conservative_delta, decide
    from invar.contract.model import read_contract
    from invar.stats.bounds import DEFAULT_BINARY_METHOD, bound

    contract_path = out / f"{name}.contract.json"
    run_dir = out / f"run-{name}"
    kept = admit(contract_path, run_dir)  # every record checked against the run's own contract
    contract, _sha = read_contract(contract_path)
    loss = kept.task_loss
    entry: dict[str, object] = {"chain_head": kept.chain_head, "records": kept.records,
                                "contract_method": None if kept.bound is None else kept.bound.version,
                                "contract_answer": kept.answer.value}
    if contract.requirement.standard != "population" or contract.requirement.delta is None:
        entry.update({"method": None, "answer": kept.answer.value, "reason": kept.reason,
                      "note": "finite domain: decided exactly, no bound method"})
        print(f"{name}: {kept.answer.value}, finite domain (no bound method to change)", flush=True)
        return entry
    if contract.requirement.sequential:
        # The data chose where this run stopped; a fixed-n bound on its units would not have its guarantee.
        entry.update({"method": kept.bound.version if kept.bound else None, "answer": kept.answer.value,
                      "reason": kept.reason, "note": "sequential: decided by its stopping rule, not re-decided"})
        print(f"{name}: {kept.answer.value}, sequential (its stopping rule decides)", flush=True)
        return entry
    d = np.array([1.0] * loss.worse + [-1.0] * loss.better + [0.0] * (loss.n - loss.worse - loss.better))
    new = bound(DEFAULT_BINARY_METHOD, d, -1.0, 1.0, conservative_delta(contract.requirement.delta))
    answer, reason = decide(contract, kept.invariance, kept.premises, loss, new)
    entry.update({"method": new.version, "answer": answer.value, "reason": reason,
                  "bound": {"method": new.method, "version": new.version, "n": new.n, "delta": new.delta,
                            "estimate": new.estimate, "lower": new.lower, "upper": new.upper}})
    print(f"{name}: {kept.answer.value} with {entry['contract_method']} -> {answer.value} with {new.version} "
          f"({reason})", flush=True)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--real-model", action="store_true", help="the real-model decisions (REAL_MODEL) instead "
                        "of the tiny model's; builds SmolLM2-135M-Instruct into models/ first if it is missing")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "acceptance")
    parser.add_argument("--redecide", action="store_true", help="decide the kept runs again with the default "
                        "method for 0/1 losses; runs no engine")
    args = parser.parse_args()
    names = args.names or (REAL_MODEL if args.real_model else ACCEPTANCE)
    if args.real_model and not args.redecide:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_smollm2.py")], check=True, cwd=ROOT)
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = ROOT / "docs" / "acceptance" / "summary.json"
    for name in names:
        entry = redecide(name, args.out) if args.redecide else run_one(name, args.out)
        # Read just before writing: another invocation (other names, on another run) may have written meanwhile.
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        if args.redecide:
            summary.setdefault(name, {})["redecided"] = entry
        else:
            summary[name] = entry
        summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
