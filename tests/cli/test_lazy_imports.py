"""A command's start imports only what the command needs: numpy, the canonical codec, the run store, the worker
transport and the statistics are imported where they are used, never at a `--help` (the start every command pays).
What is checked is which modules a fresh process holds, not how long it took (timings: bench/startup.py)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

# Not for any `use` command's help, nor for the start of the family.
_HEAVY = ("numpy", "scipy", "msgpack", "invar.canonical", "invar.records", "invar.transport", "invar.protocol",
          "invar.stats", "invar.contract", "invar.runner.engine", "invar.worker_code")


def _held_after(args: list[str], names: tuple[str, ...]) -> list[str]:
    code = (f"import sys\nsys.argv = ['invar', *{args!r}]\nfrom invar.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            f"print(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in {names!r})), "
            "file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (args, out.stderr)
    held: list[str] = ast.literal_eval(out.stderr.strip().splitlines()[-1])  # the printed list of module names
    return held


@pytest.mark.parametrize("args", [["use", "--help"], ["use", "plan", "--help"], ["use", "admit", "--help"],
                                  ["use", "verify", "--help"], ["use", "init", "--help"],
                                  ["use", "package", "--help"]])
def test_a_use_command_starts_without_numpy_the_store_or_the_statistics(args: list[str]) -> None:
    assert _held_after(args, _HEAVY) == []


def test_the_engine_table_is_read_without_the_transport_or_numpy() -> None:
    code = ("import sys\nimport invar.engines\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'numpy', 'msgpack'} "
            "or m.startswith(('invar.transport', 'invar.protocol', 'invar.worker_code', 'invar.canonical'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_engine_tables_names_are_the_runners_and_the_digests() -> None:
    from invar import engines, worker_code
    from invar.runner import engine

    assert engines.FOLLOWED == worker_code.FOLLOWED
    assert engine.Dtype is engines.Dtype
    assert engine.Quantization is engines.Quantization
    assert engine.Engine is engines.Engine


# Not for the help of a command that runs an engine, inspects a run or compares runs.
_NOT_FOR_HELP = ("numpy", "scipy", "msgpack", "rich", "cryptography", "invar.canonical", "invar.records",
                 "invar.transport", "invar.protocol", "invar.runner", "invar.contract", "invar.stats", "invar.tasks",
                 "invar.cli.outputs", "invar.compare", "invar.loop")


@pytest.mark.parametrize("args", [["evaluate", "--help"], ["infer", "--help"], ["inspect", "--help"],
                                  ["inspect", "records", "--help"], ["compare", "--help"],
                                  ["compare", "numerical", "--help"], ["keys", "new", "--help"], ["score", "--help"],
                                  ["train", "--help"]])
def test_a_command_help_imports_neither_numpy_nor_the_store_nor_the_models(args: list[str]) -> None:
    assert _held_after(args, _NOT_FOR_HELP) == []


def test_the_defaults_written_out_for_a_quick_start_are_the_modules() -> None:
    from invar import tasks
    from invar.cli import compare, evaluate
    from invar.compare import numerical
    from invar.tasks import arithmetic

    assert evaluate.ARITHMETIC == arithmetic.SCORER_NAME
    assert evaluate.MAX_ANSWER_CHARS == tasks.MAX_ANSWER_CHARS
    assert compare.DEFAULT_LARGE_STEP == numerical.DEFAULT_LARGE_STEP
