"""A real `use plan` imports what planning needs and no more: not the preparation of a run (its tokenizers, chat
templates, worker protocol and scorers), nor the decision of imported evidence. What is checked is which modules a
fresh process holds after the command, not how long it took (timings: bench/startup.py, bench/plan_speed.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from contract_runs import make_workspace

_NOT_FOR_A_PLAN = ("invar.contract.prepare", "invar.contract.plan", "invar.contract.decide", "invar.imported.decide",
                   "invar.tasks", "invar.formats.tokenizer", "invar.formats.chat", "invar.protocol",
                   "invar.transport", "invar.records", "invar.runner", "tokenizers", "jinja2")


def test_a_plan_reads_the_contract_without_preparing_a_run(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=600)
    args = ["use", "plan", str(ws.contract_path), "--assume", "worse=0.01 better=0.01", "--method", "hoeffding",
            "--json"]
    code = (f"import sys\nsys.argv = ['invar', *{args!r}]\nfrom invar.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
            f"print(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in "
            f"{_NOT_FOR_A_PLAN!r})), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"method": "hoeffding"' in out.stdout or '"method":"hoeffding"' in out.stdout
    assert ast.literal_eval(out.stderr.strip().splitlines()[-1]) == []
