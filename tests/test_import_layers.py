"""The core's packages form layers: every import goes down `LAYERS`, none goes up, and no two packages import each
other, directly or round a loop.

Decision: the unit is a child of `invar`, a sub-package (`invar.contract`) or a top-level module
(`invar.evidence`), and every import counts, read from the source with `ast` so that nothing has to be imported to
check it: at module level, inside functions (lazy imports are still dependencies), under `if TYPE_CHECKING:`
(a type is a dependency too), relative or absolute. A rule that is needed by two layers moves down to the lower
one's level or below (`invar.evidence.check_patches_active`, `invar.stats.intervals`, `invar.owner_files`), never
up into the higher.

The core also never imports an engine's libraries, however lazily: they are the workers' (`invar.workers`, each run
as its own process), and the core must install and run without them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = [
    "invar",  # the package's own __init__: the version, nothing else
    "errors",
    "lazy",  # the package facades whose names are imported when first used (PEP 562)
    "interrupts",  # Ctrl-C and SIGTERM as the commands stop at them (out of errors, whose bytes the workers run)
    "canonical",
    "regular_files",  # bounded, non-blocking reads of whole files: the owner's files and a model folder's (tasks)
    "worker_code",  # the digest naming a worker's code: the workers' protocol server reports it
    "home",
    "parallel",  # independent calls over the cores, for the commands that opt in (stats calls it)
    "docstrings",  # field docstrings read from the source where they are shown (outputs, training config)
    "printed",  # the base of the models a command prints, which the core returns
    "patches",  # the candidate patches' digest rule: the workers check it before they load a patch
    "formats",  # the tokenizer, the chat template and the checkpoint format: files both sides read
    "protocol",  # the wire: frames, messages, payloads, the worker-side server
    "workers",  # directly on the wire: a worker's code digest holds only what is below this line
    "transport",  # the core's side of the wire: the client, the fork server, the Ray relay, the shared process
    "records",
    "stats",
    "evidence",
    "engines",
    "owner_files",
    "tasks",
    "loop",
    "compare",
    "contract",
    "imported",  # decisions from exported scores: the contract's requirement, premises and decision rules
    "runner",
    "cli",  # with cli/outputs.py: the printed models the core does not return, and the table of every --json model
]
"""Lowest first: a unit may import only units before it."""

PENDING: dict[tuple[str, str], str] = {}
"""Known upward imports being moved, each (importing file, imported module): tolerated, and reported once gone."""

ENGINE_LIBRARIES = frozenset({"torch", "vllm", "mlx", "transformers", "peft", "bitsandbytes"})
ENGINE_SIDE = "workers"
"""The one unit that may import them: the workers, which the core starts as separate processes."""

SKIPPED = {"_home"}
"""Folders under invar that hold shipped data (a wheel's copy of models and patches), not the core's code."""


@dataclass(frozen=True)
class Import:
    file: str
    """Relative to src/, e.g. invar/loop/history.py."""
    line: int
    module: str
    """The imported module, absolute (invar.contract.prepare, torch)."""
    importer: str
    imported: str | None
    """Units; `imported` is None for a module outside invar."""

    def __str__(self) -> str:
        return f"src/{self.file}:{self.line}: {self.importer} -> {self.imported or self.module} ({self.module})"


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted((root / "invar").rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED & set(rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imported_names(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = module if is_package else module.rpartition(".")[0]
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        yield target
        # `from invar import canonical` imports the module invar.canonical, not only the package invar
        yield from (f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
    elif isinstance(node, ast.Call):
        # importlib.import_module("x") and __import__("x"): an import all the same
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value


def imports(root: Path = SRC) -> list[Import]:
    """Every import in every module under root/invar, with its file, line and units."""
    known = _modules(root)
    out = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        importer = _unit(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for name in _imported_names(node, module, is_package, known):
                if not name:
                    continue
                inside = name == "invar" or name.startswith("invar.")
                out.append(Import(path.relative_to(root).as_posix(), getattr(node, "lineno", 0), name, importer,
                                  _unit(name) if inside else None))
    return out


def layer_violations(found: list[Import]) -> list[str]:
    """Imports of a unit at or above the importer's layer (other than itself), and units `LAYERS` does not name."""
    rank = {unit: i for i, unit in enumerate(LAYERS)}
    problems = []
    for imp in found:
        if imp.imported is None or imp.imported == imp.importer or (imp.file, imp.module) in PENDING:
            continue
        for unit in (imp.importer, imp.imported):
            if unit not in rank:
                problems.append(f"{imp}: {unit!r} is not in LAYERS; add it where its imports put it")
        if imp.importer in rank and imp.imported in rank and rank[imp.imported] > rank[imp.importer]:
            problems.append(f"{imp}: imports upward ({imp.imported} is above {imp.importer} in LAYERS)")
    return sorted(set(problems))


def cycles(found: list[Import]) -> list[str]:
    """Each group of units that import one another round a loop (a strongly connected component), with the imports
    that close it."""
    edges: dict[str, dict[str, list[Import]]] = {}
    for imp in found:
        if imp.imported is not None and imp.imported != imp.importer and (imp.file, imp.module) not in PENDING:
            edges.setdefault(imp.importer, {}).setdefault(imp.imported, []).append(imp)
            edges.setdefault(imp.imported, {})
    # Tarjan's algorithm; the graph has a few dozen nodes, so recursion depth is no concern.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(u: str) -> None:
        index[u] = low[u] = len(index)
        stack.append(u)
        for v in sorted(edges[u]):
            if v not in index:
                visit(v)
                low[u] = min(low[u], low[v])
            elif v in stack:
                low[u] = min(low[u], index[v])
        if low[u] == index[u]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == u:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for u in sorted(edges):
        if u not in index:
            visit(u)
    out = []
    for group in groups:
        inner = [str(imp) for u in group for v in group if v in edges[u] for imp in edges[u][v]]
        out.append(f"cycle between {', '.join(group)}:\n    " + "\n    ".join(inner))
    return out


def engine_imports(found: list[Import]) -> list[str]:
    return [f"{imp}: the core must not import {imp.module.split('.')[0]}; only {ENGINE_SIDE} may"
            for imp in found if imp.module.split(".")[0] in ENGINE_LIBRARIES and imp.importer != ENGINE_SIDE]


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    # Guards the checker itself, on a made-up tree: each kind of import, an upward one, a loop, an engine library.
    files = {
        "invar/__init__.py": "",
        "invar/errors.py": "from invar import stats\n",  # from invar import <module>: goes up, closes a loop
        "invar/stats/__init__.py": "from . import bounds\n",  # relative, in a package's __init__
        "invar/stats/bounds.py": "from ..errors import X\nfrom typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    import invar.tasks.arithmetic\n",
        "invar/tasks/__init__.py": "def f() -> None:\n    import torch\n",  # inside a function
        "invar/cli/__init__.py": "__import__('invar.runner.x')\nimport importlib\nimportlib.import_module('vllm')\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = imports(tmp_path)
    edges = {(imp.file, imp.module, imp.imported) for imp in found}
    assert ("invar/errors.py", "invar.stats", "stats") in edges
    assert ("invar/stats/__init__.py", "invar.stats.bounds", "stats") in edges
    assert ("invar/stats/bounds.py", "invar.errors", "errors") in edges
    assert ("invar/stats/bounds.py", "invar.tasks.arithmetic", "tasks") in edges
    assert ("invar/cli/__init__.py", "invar.runner.x", "runner") in edges
    assert [c.splitlines()[0] for c in cycles(found)] == ["cycle between errors, stats:"]
    assert any("src/invar/errors.py:1: errors -> stats" in v and "upward" in v for v in layer_violations(found))
    assert sorted(v.split(": the core")[0].rsplit(" ", 1)[-1] for v in engine_imports(found)) == ["(torch)", "(vllm)"]


def test_no_package_imports_one_that_imports_it_back() -> None:
    found = cycles(imports())
    assert not found, "\n".join(found)


def test_every_import_goes_down_the_layers() -> None:
    found = layer_violations(imports())
    assert not found, "\n".join(found)


def test_pending_moves_are_still_pending() -> None:
    # An entry whose import is gone would tolerate the next upward import at that place: delete it.
    found = {(imp.file, imp.module) for imp in imports()}
    stale = [f"{file} no longer imports {module}: delete its PENDING entry" for file, module in PENDING
             if (file, module) not in found]
    assert not stale, "\n".join(stale)


def test_the_core_never_imports_an_engine_library() -> None:
    found = engine_imports(imports())
    assert not found, "\n".join(found)


WIRE = ["invar/__init__.py", "invar/canonical.py", "invar/errors.py", "invar/protocol/__init__.py",
        "invar/protocol/frames.py", "invar/protocol/messages.py", "invar/protocol/server.py", "invar/worker_code.py",
        "invar/workers/__init__.py"]
"""What every worker runs: the wire (without the client) and the digest it reports in its handshake."""
ENGINE_SIDE_FILES = ["invar/formats/__init__.py", "invar/formats/chat.py", "invar/formats/checkpoint.py",
                     "invar/formats/tokenizer.py", "invar/home.py", "invar/patches.py", "invar/protocol/methods.py",
                     "invar/protocol/payloads.py", "invar/regular_files.py", "invar/workers/common.py",
                     "invar/workers/kernel_host.py"]
"""What an engine's worker adds: the method table and its typed payloads, the tokenizer and checkpoint formats, the
patches' digest rule, the function kernels' host and the workers' shared checks."""
EFFECTIVE = ["invar/workers/effective.py"]
"""The readers of an engine's effective configuration: the workers of engines whose model modules can be read."""
PINNED = {
    "echo": sorted([*WIRE, "invar/workers/echo.py"]),
    "hf": sorted([*WIRE, *ENGINE_SIDE_FILES, *EFFECTIVE, "invar/workers/hf_worker.py"]),
    "llamacpp": sorted([*WIRE, *ENGINE_SIDE_FILES, "invar/workers/llamacpp_worker.py"]),
    "mlx": sorted([*WIRE, *ENGINE_SIDE_FILES, *EFFECTIVE, "invar/workers/mlx_worker.py"]),
    "openai": sorted([*WIRE, *ENGINE_SIDE_FILES, "invar/workers/openai_worker.py"]),
    "vllm": sorted([*WIRE, *ENGINE_SIDE_FILES, *EFFECTIVE, "invar/workers/vllm_worker.py"]),
}
"""Engine → exactly the files its worker code digest covers. A file the core alone runs is in none of them, so an
edit to it moves no contract's pin; a change here is a change to what every contract of that engine pins."""


def test_each_worker_pins_exactly_its_files() -> None:
    from invar.engines import ENGINE_TABLE
    from invar.worker_code import code_files

    found = {name: sorted(code_files(engine.module, [str(SRC)])) for name, engine in ENGINE_TABLE.items()}
    assert found == PINNED


def test_the_workers_stand_directly_on_the_wire() -> None:
    # Every unit a worker imports is below `protocol` (`test_every_import_goes_down_the_layers`), and nothing of the
    # core's own sits between the wire and the workers.
    assert LAYERS.index("workers") == LAYERS.index("protocol") + 1
