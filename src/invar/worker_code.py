"""The worker code digest: what names the code of a worker, as a contract's package pins it.

A worker is a module run as its own process (`python -P -m MODULE`). What answers is that module's file and every
module of the `invar` package it imports, directly or through others. `code_files` finds them statically: it reads
each file with `ast` (nothing is imported or run) and follows every import it names, at module level, inside
functions and under `if TYPE_CHECKING:` alike, so a lazy import counts. Importing `invar.a.b` runs `invar/__init__.py`
and `invar/a/__init__.py` too, so those count as well.

The digest is `invar.canonical.digest` of {path: file sha256}, each path relative to the folder on the search path
the module was found in (`invar/workers/hf_worker.py`): a source checkout and an installed wheel of the same code
give the same digest, and bytecode never counts. The core computes it from the files it is about to start, before
the worker exists, and refuses a worker whose digest is not the package's; the worker reports its own in its
handshake identity, so the records say which code answered.

Pure Python: no engine library, no import of the code it hashes.
"""

from __future__ import annotations

import ast
import os
import threading
from collections.abc import Sequence
from importlib.machinery import PathFinder
from pathlib import Path

from invar import canonical
from invar.errors import InvarError

FOLLOWED = "invar"
"""The package whose modules a worker's code digest follows: the core's own code, which every worker imports."""


_PARSE = threading.Lock()
"""One `ast.parse` at a time: `use run` starts its packages' workers from threads, and CPython 3.11 before 3.11.8
can fail two parses running at once with "SystemError: AST constructor recursion depth mismatch"."""


class WorkerCodeError(InvarError):
    """A worker's code cannot be found, or is not the code a package names."""


def _locate(module: str, path: Sequence[str]) -> tuple[Path, Path] | None:
    """(file, search-path folder it was found under) of `module` on `path`, or None where it is not there."""
    top, _, _ = module.partition(".")
    spec = PathFinder.find_spec(top, list(path))
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:
        roots = [Path(p) for p in spec.submodule_search_locations]
        base = roots[0].parent if roots else None
    else:
        if spec.origin is None:
            return None
        base = Path(spec.origin).parent
        return (Path(spec.origin), base) if module == top else None
    if base is None:
        return None
    rel = Path(*module.split("."))
    for candidate in (base / rel / "__init__.py", base / rel.with_suffix(".py")):
        if candidate.is_file():
            return candidate, base
    return None


def _imports(source: Path, name: str) -> set[str]:
    """The absolute names of every module `source` (the module `name`) imports, and of each `from X import Y` also
    X.Y (Y may be a submodule; whether it is, is decided by the files)."""
    try:
        data = source.read_bytes()
        with _PARSE:
            tree = ast.parse(data, filename=str(source))
    except (OSError, SyntaxError, ValueError) as exc:
        raise WorkerCodeError(f"{source}: cannot be read as Python ({exc}); the worker's code must be readable "
                              "source") from None
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            if base:
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def code_files(module: str, path: Sequence[str]) -> dict[str, Path]:
    """The files of worker `module` as it would run with `path` as its search path: relative path → file.

    `WorkerCodeError` if the module is not there."""
    located = _locate(module, path)
    if located is None:
        raise WorkerCodeError(f"worker module {module} is not on the workers' search path; install invar with its "
                              "workers")
    files: dict[str, Path] = {}
    todo = [(module, located)]
    seen = {module}
    while todo:
        name, (file, base) = todo.pop()
        files[file.relative_to(base).as_posix()] = file
        wanted = set(_imports(file, name))
        parts = name.split(".")
        wanted.update(".".join(parts[:i]) for i in range(1, len(parts)))  # the packages above it run first
        for imported in sorted(wanted):
            if imported in seen or imported.partition(".")[0] != FOLLOWED:
                continue
            seen.add(imported)
            where = _locate(imported, path)
            if where is not None:  # else `from invar.x import name` named no module: invar.x counts already
                todo.append((imported, where))
    return files


def code_digest(module: str, path: Sequence[str]) -> str:
    """The worker code digest of `module` on search path `path`: canonical digest of {relative path: sha256}."""
    return canonical.digest({rel: canonical.file_sha256(f) for rel, f in sorted(code_files(module, path).items())})


def search_path(pythonpath: str | None, default: Sequence[str]) -> list[str]:
    """The search path of a worker started with PYTHONPATH `pythonpath` and `-P`: those folders, then the
    interpreter's own (`default`, this process's `sys.path` less the working directory, which `-P` leaves out)."""
    first = [p for p in (pythonpath or "").split(os.pathsep) if p]
    return first + [p for p in default if p and p not in first]
