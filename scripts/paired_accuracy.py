"""Pair two `invar evaluate` runs problem by problem and test whether the second is more accurate.

    python scripts/paired_accuracy.py BASE_RUN ADAPTER_RUN [--json]

Both runs must have evaluated the same problems with the same seed (`invar evaluate --count N --seed S
--sample-seed K`, the second with `--adapter DIR`), so each problem's request seed is the same on both sides and
the comparison is paired. Every response is re-read from the runs' verified records and re-scored by the core; per
problem kind and overall it prints the accuracy of each run, the problems that got better and worse, and the exact
one-sided McNemar p-value for "the second run is better" (`invar.stats.diagnostics.mcnemar_exact_one_sided`, with
the roles of worse and better swapped).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from invar.records import RunStore
from invar.stats.diagnostics import mcnemar_exact_one_sided
from invar.tasks import ModelTokenizer
from invar.tasks.population import load_units
from invar.tasks.scorers import load_scorer


def losses(run: Path) -> tuple[dict[str, Any], dict[str, tuple[str, int]]]:
    """The run's metadata and, per problem id, (kind, task loss) re-scored from the recorded tokens.

    Each response is decoded by the core's tokenizer reader and scored by the scorer the run recorded (its name and
    settings; a user scorer `path.py:function` is read relative to the current folder, as `invar evaluate` read it,
    and checked against its recorded sha256) against the
    unit of the run's population it answers, so any task `invar evaluate` takes can be paired, not only arithmetic.
    """
    with RunStore.open(run) as store:
        store.verify()
        meta = store.meta()["run"]
        calls = store.calls()
    if meta.get("command") != "evaluate":
        raise SystemExit(f"{run}: not an `invar evaluate` run")
    vocab = ModelTokenizer.from_model_dir(meta["model"])
    identity = meta.get("scorer") or {"name": "arithmetic-exact", "settings": {}}
    scorer = load_scorer(identity["name"], identity.get("settings", {}), Path("."), identity.get("sha256"))
    if not scorer.binary:
        raise SystemExit(f"{run}: the scorer {identity['name']!r} does not give 0/1 losses; McNemar pairs 0/1 losses")
    units = {u.id: u for u in load_units(meta["population"], meta["population_sha256"])}
    out: dict[str, tuple[str, int]] = {}
    for c in calls:
        if c.call.method != "generate":
            continue
        if c.report is None or not c.report.report.ok:
            raise SystemExit(f"{run}: {c.name} has no successful report; the run is incomplete")
        result = c.report.report.result or {}
        for req, o in zip(c.call.params["requests"], result["outputs"], strict=True):
            unit = units.get(req["request_id"])
            if unit is None:
                raise SystemExit(f"{run}: request {req['request_id']!r} is not a unit of {meta['population']}")
            out[unit.id] = (unit.kind or "?", int(scorer.loss(unit, vocab.decode(o["tokens"]))))
    return meta, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("adapter", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    meta_a, a = losses(args.base)
    meta_b, b = losses(args.adapter)
    for key in ("seed", "sample_seed", "count", "temperature", "max_tokens", "population_sha256", "model_digest",
                "scorer"):
        if meta_a.get(key) != meta_b.get(key):
            raise SystemExit(f"the runs differ in {key} ({meta_a.get(key)!r} vs {meta_b.get(key)!r}): they are not "
                             "paired")
    if sorted(a) != sorted(b):
        raise SystemExit("the runs evaluated different problems")
    rows: dict[str, Counter[str]] = {}
    for pid in a:
        for group in (a[pid][0], "all"):
            row = rows.setdefault(group, Counter())
            row["n"] += 1
            row["base_correct"] += 1 - a[pid][1]
            row["adapter_correct"] += 1 - b[pid][1]
            row["better"] += int(a[pid][1] == 1 and b[pid][1] == 0)
            row["worse"] += int(a[pid][1] == 0 and b[pid][1] == 1)
    table = {g: {**r, "p_value": mcnemar_exact_one_sided(r["better"], r["worse"])} for g, r in sorted(rows.items())}
    summary = {"base": str(args.base), "adapter": str(args.adapter), "adapter_dir": meta_b.get("adapter"),
               "adapter_digest": meta_b.get("adapter_digest"), "seed": meta_a.get("seed"),
               "temperature": meta_a.get("temperature"), "rows": table}
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return 0
    print(f"paired on {table['all']['n']} problems, seed {meta_a.get('seed')}, T={meta_a.get('temperature')}; "
          f"adapter {(meta_b.get('adapter_digest') or 'none')[:16]}…")
    print(f"{'kind':<8} {'n':>5} {'base':>7} {'adapter':>8} {'better':>7} {'worse':>6} {'McNemar p':>10}")
    for g, r in table.items():
        print(f"{g:<8} {r['n']:>5} {r['base_correct'] / r['n']:>7.3f} {r['adapter_correct'] / r['n']:>8.3f} "
              f"{r['better']:>7} {r['worse']:>6} {r['p_value']:>10.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
