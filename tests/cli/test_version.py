"""`invar --version` (and `version --json`): the core's, the decision arithmetic's and each engine's versions, read
without importing an engine; shell completion is offered; every command's help ends with examples."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

import typer.main
from support.cli_batch import InvarSession

from invar import __version__
from invar.cli.app import EXAMPLES, app
from invar.contract.decide import DECISION_VERSION
from invar.stats.bounds import VERSIONS


def _invar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True, timeout=120)


def test_version_names_the_core_the_arithmetic_and_the_engines(cli: InvarSession) -> None:
    started = time.perf_counter()
    out = _invar("--version")  # a process of its own: the start-up is what is measured
    print(f"measured: invar --version in {time.perf_counter() - started:.2f} s")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"invar {__version__}"
    assert DECISION_VERSION in out.stdout
    assert "invar.plan/1" in out.stdout
    for version in VERSIONS.values():
        assert version in out.stdout
    assert any(line.startswith("engine   hf: torch ") for line in lines), out.stdout
    doc = json.loads(cli.run("--version", "--json").stdout)
    assert doc["invar"] == __version__
    assert doc["decision"] == DECISION_VERSION
    assert doc["methods"]["paired-binary-exact"] == VERSIONS["paired-binary-exact"]
    assert doc["engines"]["hf"]["packages"]["torch"] == metadata.version("torch")
    assert doc["engines"]["mlx"]["installed"] is True
    assert json.loads(cli.run("version", "--json").stdout) == doc
    assert cli.run("version").stdout.strip() == __version__


def test_versions_are_read_without_importing_an_engine() -> None:
    code = ("import sys\nfrom invar.cli.app import versions\nv = versions()\n"
            "assert v.engines['hf'].installed, v\n"
            "print(sorted({'torch', 'vllm', 'mlx', 'transformers', 'peft'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_help_offers_completion_and_version(cli: InvarSession) -> None:
    out = cli.run("--help")
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout
    assert "--install-completion" in out.stdout
    assert "--version" in out.stdout


def _leaves(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every command under a group, by its full name (typer's groups and commands)."""
    found: dict[str, Any] = {}
    ctx = typer.Context(group)
    for name in group.list_commands(ctx):  # the root builds its commands on first use: ask, don't read `.commands`
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "commands"):
            found.update(_leaves(cmd, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = cmd
    return found


def test_every_command_help_ends_with_examples_of_itself(cli: InvarSession) -> None:
    leaves = _leaves(typer.main.get_command(app))
    assert sorted(leaves) == sorted(EXAMPLES), "every command has examples, and every example a command"
    for name, cmd in leaves.items():
        assert cmd.epilog is not None, name
        assert cmd.epilog.startswith("Examples:"), name
        assert all(line.startswith(f"invar {name}") or line.startswith("invar --version")
                   for line in EXAMPLES[name]), name
    out = cli.run("use", "admit", "--help")
    assert "Examples:" in out.stdout
    assert "invar use admit" in out.stdout.split("Examples:")[1]


def test_help_imports_no_command_module_and_no_heavy_library() -> None:
    # `invar --help` lists every command from the root's table: what it must not import is what made it slow.
    code = ("import sys\nsys.argv = ['invar', '--help']\nfrom invar.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'numpy', 'pydantic', 'rich', 'scipy', "
            "'msgpack'} or m.startswith('invar.cli.') and m != 'invar.cli.app'), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == "[]"
    for name in ("infer", "evaluate", "score", "train", "inspect", "use", "keys", "compare", "version"):
        assert f"\n  {name} " in out.stdout, name


# What a `use` command's help must not import: the contract model and the output models (pydantic classes), numpy
# and msgpack (the arrays and the protocol's encoding), the statistics (scipy), receipts (cryptography), the tokenizer
# and the progress display (rich), and other commands. pydantic itself stays (typer 0.29 builds every command's
# parameters through it).
_NOT_FOR_USE_HELP = ("numpy", "msgpack", "scipy", "cryptography", "tokenizers", "jinja2", "rich", "invar.cli.outputs",
                     "invar.contract", "invar.stats", "invar.tasks", "invar.evidence", "invar.runner.use_run",
                     "invar.runner.evaluate", "invar.cli.evaluate", "invar.cli.progress")


def test_use_help_imports_neither_the_contract_model_nor_the_statistics() -> None:
    for args in (["use", "--help"], ["use", "plan", "--help"], ["use", "prepare", "--help"],
                 ["use", "run", "--help"], ["use", "init", "--help"]):
        code = (f"import sys\nsys.argv = ['invar', *{args!r}]\nfrom invar.cli.app import main\n"
                "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
                f"print(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') "
                f"for n in {_NOT_FOR_USE_HELP!r})), file=sys.stderr)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (args, out.stderr)
        assert out.stderr.strip() == "[]", args
        assert "Usage: invar use" in out.stdout, (args, out.stdout)


def test_use_init_names_the_shipped_scorer_as_the_task_does() -> None:
    from invar.cli.use_init import ARITHMETIC
    from invar.tasks.arithmetic import SCORER_NAME

    assert ARITHMETIC == SCORER_NAME


def test_a_mistake_in_the_command_line_is_one_line(cli: InvarSession) -> None:
    for args, message in ((["infer", "--nosuch"], "No such option: --nosuch"),
                          (["use", "admit"], "Missing option '--contract'"),  # an imported contract needs no run
                          (["nosuch"], "No such command 'nosuch'")):
        out = cli.run(*args)
        assert out.returncode == 2, (args, out.stdout)
        assert out.stderr.startswith("invar: error: "), out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        assert message in out.stderr, out.stderr
        assert "--help" in out.stderr, out.stderr
