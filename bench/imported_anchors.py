"""Invar's imported decision beside the tests other tools decide with, on one real pair of lm-eval exports.

Run from the repository root (about 12 minutes on 2 shared cores, most of it lm-eval generating):

    nice -n 10 .venv/bin/python bench/imported_anchors.py [--items 600] [--out docs/imported_anchors.json]

It evaluates the shipped tiny model (the reference) and a copy whose MLP weights carry seeded noise of 0.3 of their
own scale (the candidate) with the real lm-evaluation-harness (HF backend, greedy, offline) on the first `--items`
problems of data/arith-eval.jsonl, then decides from the two `samples_*.jsonl` with `invar use prepare` and
`invar use admit` (paired-binary-exact, ε = 0.02, confidence 0.95), and computes here, with scipy and statsmodels,
what the other tools report on the same paired 0/1 losses: a paired Newcombe interval for the difference of two
correlated proportions (Newcombe 1998, method 10, from Wilson intervals), a paired percentile bootstrap of 2,048
replicates, and McNemar's exact test. For each interval it also finds the smallest n at which the interval's upper
limit falls to ε when the observed rates of worse and better items hold exactly (counts rounded to the nearest
integer), the n each would need to admit. The core computes none of these anchors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from invar.stats.bounds import paired_binary_exact

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-arith"
EPSILON = 0.02
DELTA = 0.05
NOISE = 0.3
REPLICATES = 2048
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def candidate_model(folder: Path) -> Path:
    """The tiny model with seeded noise of NOISE times each MLP matrix's own scale."""
    shutil.copytree(MODEL, folder)
    weights = load_file(MODEL / "model.safetensors")
    rng = np.random.default_rng(0)
    for name in sorted(weights):
        w = weights[name]
        if "mlp" in name and w.ndim == 2:
            weights[name] = (w + NOISE * rng.standard_normal(w.shape).astype(np.float32) * w.std()).astype(np.float32)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def lm_eval(model: Path, tasks: Path, out: Path) -> Path:
    subprocess.run([str(Path(sys.executable).parent / "lm_eval"), "--model", "hf", "--model_args",
                    f"pretrained={model},dtype=float32,add_bos_token=True", "--tasks", "invar_arith",
                    "--include_path", str(tasks), "--device", "cpu", "--batch_size", "32", "--log_samples",
                    "--output_path", str(out)], check=True, env=OFFLINE, capture_output=True)
    (samples,) = out.rglob("samples_invar_arith_*.jsonl")
    return samples


def newcombe_table(both: int, worse: int, better: int, neither: int, confidence: float) -> tuple[float, float]:
    """Newcombe method 10 on the 2x2 table of (reference loss, candidate loss): `both` lost by both, `worse` lost by
    the candidate only, `better` lost by the reference only, `neither`. The difference is candidate − reference."""
    n = both + worse + better + neither
    p1, p2 = (both + worse) / n, (both + better) / n  # candidate's and reference's loss rates
    l1, u1 = proportion_confint(both + worse, n, alpha=1 - confidence, method="wilson")
    l2, u2 = proportion_confint(both + better, n, alpha=1 - confidence, method="wilson")
    denominator = (both + worse) * (better + neither) * (both + better) * (worse + neither)
    numerator = both * neither - worse * better
    phi = 0.0 if denominator == 0 else numerator / math.sqrt(denominator)  # method 10: no continuity correction
    d = p1 - p2
    lower = d - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    upper = d + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return lower, upper


def bootstrap_upper(d: np.ndarray, confidence: float, seed: int = 0) -> tuple[float, float]:
    """Paired percentile bootstrap of the mean difference, REPLICATES resamples of the items."""
    result = stats.bootstrap((d,), np.mean, n_resamples=REPLICATES, confidence_level=confidence,
                             method="percentile", random_state=np.random.default_rng(seed), vectorized=True,
                             batch=128)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def scaled(rates: tuple[float, float, float, float], n: int) -> tuple[int, int, int, int]:
    """The 2x2 table at n items with the observed rates (both, worse, better, neither), rounded, summing to n."""
    both, worse, better = (round(r * n) for r in rates[:3])
    return both, worse, better, n - both - worse - better


def smallest_n(upper_at: Any, start: int, limit: int = 1 << 24) -> int | None:
    """The smallest n from `start` at which `upper_at(n) <= EPSILON`, searched by doubling, then bisection; None past
    `limit`."""
    n = start
    while upper_at(n) > EPSILON:
        n *= 2
        if n > limit:
            return None
    low, high = max(start, n // 2), n
    if high == start:
        return start
    while high - low > 1:
        mid = (low + high) // 2
        if upper_at(mid) <= EPSILON:
            high = mid
        else:
            low = mid
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "imported_anchors.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="invar-anchors-") as scratch:
        work = Path(scratch)
        data = work / "arith.jsonl"
        lines = (ROOT / "data" / "arith-eval.jsonl").read_text(encoding="utf-8").splitlines()[:args.items]
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tasks = work / "tasks"
        tasks.mkdir()
        (tasks / "arith.yaml").write_text("\n".join([
            "task: invar_arith", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {data}",
            "test_split: test", "output_type: generate_until", 'doc_to_text: "{{prompt}}"',
            'doc_to_target: "{{answer}}"', 'target_delimiter: ""', "generation_kwargs:", '  until: ["</s>"]',
            "  do_sample: false", "  max_gen_toks: 5", "metric_list:", "  - metric: exact_match",
            "    aggregation: mean", "    higher_is_better: true", ""]), encoding="utf-8")
        reference = lm_eval(MODEL, tasks, work / "reference")
        candidate = lm_eval(candidate_model(work / "candidate-model"), tasks, work / "candidate")
        decl = work / "anchors.toml"
        decl.write_text("\n".join([
            'name = "anchors"', "[imported]", 'format = "lm-eval"', 'metric = "exact_match"',
            f'reference = {{ path = "{reference}" }}', f'candidate = {{ path = "{candidate}" }}',
            "[requirement]", 'standard = "population"', f'epsilon = "{EPSILON}"', f'confidence = "{1 - DELTA}"',
            'method = "paired-binary-exact"', ""]), encoding="utf-8")
        invar = [sys.executable, "-m", "invar.cli"]
        subprocess.run([*invar, "use", "prepare", str(decl)], check=True, capture_output=True)
        decided = subprocess.run([*invar, "use", "admit", "--contract", str(work / "anchors.contract.json"),
                                  "--json"], capture_output=True, text=True)
        decision = json.loads(decided.stdout)
        ref_rows = {json.loads(x)["doc_id"]: json.loads(x) for x in reference.read_text("utf-8").splitlines()}
        cand_rows = {json.loads(x)["doc_id"]: json.loads(x) for x in candidate.read_text("utf-8").splitlines()}
        ref_loss = np.array([1 - int(ref_rows[k]["exact_match"]) for k in sorted(ref_rows)])
        cand_loss = np.array([1 - int(cand_rows[k]["exact_match"]) for k in sorted(ref_rows)])
    n = len(ref_loss)
    d = (cand_loss - ref_loss).astype(np.float64)
    both = int(((ref_loss == 1) & (cand_loss == 1)).sum())
    worse, better = int((d > 0).sum()), int((d < 0).sum())
    neither = n - both - worse - better
    # one-sided (1 − δ) upper limits, as Invar's bound is: two-sided intervals at confidence 1 − 2δ
    two_sided = 1 - 2 * DELTA
    newcombe = newcombe_table(both, worse, better, neither, two_sided)
    boot = bootstrap_upper(d, two_sided)
    exact = mcnemar([[both, worse], [better, neither]], exact=True)
    rates = (both / n, worse / n, better / n)
    # From the first n at which the rounded table holds a worse and a better item: below it the table would claim no
    # discordant item at all, and the bootstrap's interval collapses to [0, 0] (it "admits" at n = 6).
    start = math.ceil(0.5 / min(rates[1], rates[2]))

    def invar_upper(m: int) -> float:
        _, w, b, _ = scaled((*rates, 0.0), m)
        return paired_binary_exact(w, b, m, DELTA).upper

    def newcombe_upper(m: int) -> float:
        return newcombe_table(*scaled((*rates, 0.0), m), two_sided)[1]

    def bootstrap_at(m: int) -> float:
        _, w, b, _ = scaled((*rates, 0.0), m)
        return bootstrap_upper(np.array([1.0] * w + [-1.0] * b + [0.0] * (m - w - b)), two_sided)[1]

    result = {
        "command": "nice -n 10 .venv/bin/python bench/imported_anchors.py --items " + str(args.items),
        "items": n, "epsilon": EPSILON, "delta": DELTA, "noise": NOISE,
        "table": {"both": both, "worse": worse, "better": better, "neither": neither},
        "mean_increase": float(d.mean()),
        "invar": {"answer": decision["answer"], "method": decision["bound"]["method"],
                  "lower": decision["bound"]["lower"], "upper": decision["bound"]["upper"],
                  "n_to_admit": smallest_n(invar_upper, start)},
        "newcombe_paired": {"lower": newcombe[0], "upper": newcombe[1],
                            "n_to_admit": smallest_n(newcombe_upper, start)},
        "bootstrap_paired": {"replicates": REPLICATES, "lower": boot[0], "upper": boot[1],
                             "n_to_admit": smallest_n(bootstrap_at, start, limit=1 << 17)},
        "mcnemar_exact": {"statistic": float(exact.statistic), "p_two_sided": float(exact.pvalue)},
        "exports": {"reference_sha256": decision["exports"][0]["sha256"] if decision["exports"][0]["role"] ==
                    "reference" else decision["exports"][1]["sha256"]},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
