"""Pin the worker code in the shipped declarations: set each package's `worker_digest` in contracts/*.toml to the
digest of its engine's worker here (`invar.engines.worker_digest`, what `invar use package ENGINE` prints).

Any change to a worker module, or to a core module a worker imports, gives new worker code, which no contract
prepared before names; this re-pins the shipped declarations after such a change. `--check` changes nothing and
exits 1 naming each declaration whose pin is stale.

    .venv/bin/python scripts/pin_worker_code.py [--check]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from invar.engines import worker_digest

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
_SECTION = re.compile(r"^\[(reference|candidate)\]\s*$")
_ENGINE = re.compile(r'^engine\s*=\s*"([a-z]+)"\s*$')
_PIN = re.compile(r'^worker_digest\s*=.*$')


def pinned(text: str) -> str:
    """`text` with a `worker_digest` line in each package section, right after its `engine` line."""
    out: list[str] = []
    in_package = False
    for line in text.splitlines():
        if line.startswith("["):
            in_package = bool(_SECTION.match(line))
        if in_package and _PIN.match(line):
            continue  # written again after the engine line
        out.append(line)
        engine = _ENGINE.match(line) if in_package else None
        if engine:
            out.append(f'worker_digest = "{worker_digest(engine.group(1))}"')
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if argv in (["--help"], ["-h"]):  # asked what it does: it must not re-pin on the way
        print(__doc__.strip())
        return 0
    check = argv == ["--check"]
    if argv and not check:
        print("usage: pin_worker_code.py [--check]", file=sys.stderr)
        return 2
    stale = []
    declarations = sorted(CONTRACTS.rglob("*.toml"))  # contracts/real-model/ too
    for path in declarations:
        text = path.read_text(encoding="utf-8")
        new = pinned(text)
        if new != text:
            stale.append(str(path.relative_to(CONTRACTS)))
            if not check:
                path.write_text(new, encoding="utf-8")
    if check and stale:
        print(f"stale worker_digest in {', '.join(stale)}: run scripts/pin_worker_code.py", file=sys.stderr)
        return 1
    total = len(declarations)
    print(f"every one of {total} declarations pins this worker code" if check else
          f"re-pinned {len(stale)} of {total} declarations")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
