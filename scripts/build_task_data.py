"""Write the arithmetic task's populations into data/, with their sha256 files.

    python scripts/build_task_data.py [--out data] [--check]

`data/arith-eval.jsonl` is the evaluation population (20,000 distinct prompts of the `eval` split, seed 1);
`data/arith-train.jsonl` holds 20,000 distinct prompts of the `train` split (seed 2) for training loops that
declare a prompt file. The two are disjoint by construction (see `invar.tasks.arithmetic.split_of`). Each file's
digest is written beside it as `<name>.sha256` in `sha256sum` format. `--check` rebuilds in memory and fails if
the committed files differ.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from invar.tasks.arithmetic import Split, population, population_bytes

POPULATIONS: tuple[tuple[str, Split, int, int], ...] = (
    # (file stem, split, seed, count)
    ("arith-eval", "eval", 1, 20_000),
    ("arith-train", "train", 2, 20_000),
)


def write_or_check(out: Path, stem: str, data: bytes, check: bool, what: str) -> bool:
    """Write `out/<stem>.jsonl` and its `.sha256` (sha256sum's format), or with `check` compare the file on disk
    with `data`; prints one line either way and returns whether the file is (now) `data`."""
    digest = hashlib.sha256(data).hexdigest()
    path = out / f"{stem}.jsonl"
    if check:
        same = path.is_file() and path.read_bytes() == data
        print(f"{'ok' if same else 'DIFFERS'}  {digest}  {path}")
        return same
    out.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    (out / f"{stem}.sha256").write_text(f"{digest}  {path.name}\n")
    print(f"{digest}  {path}  ({what})")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data")
    parser.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = parser.parse_args()
    ok = True
    for stem, split, seed, count in POPULATIONS:
        data = population_bytes(population(split, seed, count, id_prefix=split))
        ok &= write_or_check(args.out, stem, data, args.check, f"{count} problems")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
