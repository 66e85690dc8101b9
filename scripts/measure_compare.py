"""Run the measurement contracts (contracts/measure-*.toml) end to end and keep the figures docs/compare.md reports.

    .venv/bin/python scripts/measure_compare.py [NAME ...] [--out runs/measure]

For each contract: `invar use prepare`, `invar use run` (resumed, or left as it is when already closed),
`invar use admit --json --expect-head HEAD`, then `invar compare numerical RUN --json --report OUT/NAME.html` under
`/usr/bin/time` for its wall time and peak resident memory. The figures go to docs/compare/summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["measure-threads", "measure-fixed-block", "measure-split-k", "measure-nf4", "measure-vllm"]


def invar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "invar"), *args], capture_output=True, text=True,
                          cwd=ROOT)


def must(out: subprocess.CompletedProcess[str], what: str, codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
    if out.returncode not in codes:
        raise SystemExit(f"{what} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The numbers docs/compare.md quotes, from `compare numerical --json`."""
    g, t, tf, c = doc["generation"], doc["task"], doc["teacher_forcing"], doc["captures"]
    out: dict[str, Any] = {
        "units": g["units"], "identical": g["identical"], "tokens_identical": g["tokens_identical"],
        "logprobs_identical": g["logprobs_identical_over_shared_prefix"],
        "first_divergence": g["first_divergence"],
        "max_ulp": None if g["max_ulp"] is None else {k: g["max_ulp"][k] for k in ("mean", "max")},
        "max_abs_delta": None if g["max_abs_delta"] is None else {k: g["max_abs_delta"][k] for k in ("mean", "max")},
        "task": t,
    }
    if tf is not None:
        out["teacher_forcing"] = {"units": tf["units"], "identical": tf["identical"],
                                  "first_large_step": tf["first_large_step"], "abs_delta": tf["abs_delta"]}
    if c is not None:
        out["captures"] = {k: c[k] for k in ("captures", "identical", "indistinguishable_from_0", "kl_ref_cand",
                                            "kl_cand_ref", "same_top", "rms_delta_p", "delta_p")}
    if doc.get("reference_self_consistency") is not None:
        out["reference_self_consistency"] = doc["reference_self_consistency"]
    return out


def run_one(name: str, out: Path) -> dict[str, Any]:
    prepared = must(invar("use", "prepare", str(ROOT / "contracts" / f"{name}.toml"), "--out", str(out), "--json"),
                    f"{name}: prepare")
    contract = Path(prepared["contract"])
    run_dir = out / name
    started = time.perf_counter()
    outcome = must(invar("use", "run", str(contract), "--run", str(run_dir), "--json"), f"{name}: use run")
    run_s = time.perf_counter() - started
    decision = must(invar("use", "admit", str(run_dir), "--contract", str(contract), "--expect-head",
                          outcome["chain_head"], "--json"), f"{name}: use admit", (0, 10, 11))
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        report = out / f"{name}.html"
        cmd = ["/usr/bin/time", "-f", "%M %e", "-o", timing.name, str(Path(sys.executable).parent / "invar"),
               "compare", "numerical", str(run_dir), "--contract", str(contract), "--json", "--report", str(report)]
        compared = must(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT), f"{name}: compare")
        peak_kb, wall = timing.read().split()[-2:]
    print(f"{name}: {decision['answer']}; compare {float(wall):.1f} s, peak RSS {int(peak_kb) / 1024:.0f} MiB",
          flush=True)
    return {"name": name, "answer": decision["answer"], "reason": decision["reason"],
            "chain_head": outcome["chain_head"], "contract_sha256": prepared["sha256"],
            "use_run_s": round(run_s, 1) if not outcome["already_closed"] else None,
            "compare_s": float(wall), "compare_peak_rss_mib": round(int(peak_kb) / 1024, 1),
            "figures": figures(compared),
            "commands": [f"invar use prepare contracts/{name}.toml --out {out.relative_to(ROOT)}",
                         f"invar use run {contract.relative_to(ROOT)} --run {run_dir.relative_to(ROOT)}",
                         f"invar compare numerical {run_dir.relative_to(ROOT)} --report "
                         f"{report.relative_to(ROOT)}"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=NAMES)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "measure")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = ROOT / "docs" / "compare" / "summary.json"
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for name in args.names:
        summary[name] = run_one(name, args.out.resolve())
        summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
