"""Generated declarations (TOML text) through `prepare` and contracts (JSON) through `load_contract`: each either
works or fails with one `ContractError` line; nothing else escapes, and nothing hangs.

Each example starts from a valid declaration or contract over a real workspace (a model folder, a population, a
few other files whose digests are known) and changes it: fields replaced by hostile values (wrong types, huge or
deep values, NUL and newlines, datetimes, NaN, paths to other files and folders, valid alternatives), deleted or
added, then written as text and sometimes damaged byte by byte (invalid UTF-8, cut, deep nesting, over 1 MiB).
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fuzz_scale import scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.char_model import write_char_model

from invar import canonical
from invar.contract.prepare import load_contract, prepare
from invar.errors import ContractError
from invar.tasks.arithmetic import population, population_bytes

HANG_S = 30
"""No single prepare or load may take this long: the examples are a few kilobytes over a tiny workspace."""

FAST, SLOW = scaled(300), scaled(2_000)
"""Examples per run of each kind; what the search found before is tried on every run (`FOUND`), so the slow count
sizes the search for what it has not found yet (INVAR_FUZZ_SCALE=5 runs the 10,000 it ran before)."""


# --- the workspace -------------------------------------------------------------------------------------------------


def _make_model(folder: Path) -> str:
    """A model folder holding a character-level tokenizer (all the core reads); returns its tree digest."""
    return write_char_model(folder, ("<pad>", "<s>", "</s>"), "0123456789+-*=")


@dataclass(frozen=True)
class Workspace:
    root: Path
    declaration: dict[str, Any]
    contract: dict[str, Any]
    digests: tuple[str, ...]
    """sha256 and tree digests of the files and folders in the workspace, so a field may name a real one."""


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    # Each example writes a file, and a prepared one writes a contract and deletes it: in memory where the machine
    # has a tmpfs, since on the project's disk those writes and deletes were a quarter of the declarations' wall
    # time at scale (docs/testing.md). Where the files live changes nothing the examples check.
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)
    root = Path(tempfile.mkdtemp(prefix="invar-fuzz-contracts-", dir=shm)) if in_memory \
        else tmp_path_factory.mktemp("fuzz-contracts")
    try:
        yield _workspace(root)
    finally:
        if in_memory:
            shutil.rmtree(root, ignore_errors=True)


def _workspace(root: Path) -> Workspace:
    """The model folders, population and other files the examples may name, and the valid declaration and contract
    over them that each example starts from."""
    model = _make_model(root / "model")
    other = _make_model(root / "other-model")
    (root / "other-model" / "extra.txt").write_text("changes the digest")
    other = canonical.tree_digest(root / "other-model")
    data = population_bytes(population("eval", seed=11, count=40, id_prefix="u"))
    (root / "population.jsonl").write_bytes(data)
    (root / "latin1.jsonl").write_bytes('{"id": "é", "prompt": "1+1=", "answer": "2"}\n'.encode("latin-1"))
    (root / "basis.txt").write_text("the owner's memo\n")
    (root / "empty").mkdir()
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    os.mkfifo(root / "fifo")
    decl: dict[str, Any] = {
        "name": "fuzz",
        "description": "generated",
        "population": {"path": "population.jsonl", "sha256": canonical.sha256(data), "sample": 20},
        "scorer": {"name": "arithmetic-exact"},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 5},
        "requirement": {"standard": "population", "epsilon": 0.05, "confidence": 0.95, "method": "maurer-pontil"},
        "pairing": {"seed": 7, "layout": "solo"},
        "layouts": {"solo": {"batch_size": 1}, "b4r": {"batch_size": 4, "order": "reverse"}},
        "invariance": {"required": True, "layouts": ["solo", "b4r"]},
        "reference": {"engine": "hf", "engine_version": {"torch": "2.13.0"}, "settings": {"device": "cpu"},
                      "model_dir": "model", "model_digest": model, "dtype": "float32"},
        "candidate": {"engine": "hf", "engine_version": {"torch": "2.13.0", "bitsandbytes": "0.50.2"},
                      "settings": {"device": "cpu", "threads": 1}, "patches": {"fix": "c" * 64},
                      "model_dir": "model", "model_digest": model, "dtype": "float32", "quantization": "nf4"},
        "premises": [{"statement": "the population is the use", "party": "owner", "reliance": "checked",
                      "basis_sha256": canonical.file_sha256(root / "basis.txt"), "basis_path": "basis.txt"},
                     {"statement": "vouched", "party": "team", "reliance": "vouched", "basis_sha256": "d" * 64}],
    }
    (root / "decl.toml").write_text(toml_text(decl))
    prepared = prepare(root / "decl.toml")
    contract = json.loads(prepared.path.read_bytes())
    prepared.path.unlink()
    prepared.digest_path.unlink()
    digests = (model, other, canonical.sha256(data), *(canonical.file_sha256(root / f) for f in (
        "latin1.jsonl", "basis.txt", "binary.bin", "model/tokenizer.json", "decl.toml")))
    return Workspace(root, decl, contract, digests)


# --- TOML text for any value ---------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")) if not math.isfinite(value) \
            else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # TOML basic strings take JSON's escapes; a lone surrogate is invalid TOML
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_text(data: dict[str, Any]) -> str:
    """A TOML document: top-level values first, then a table per map, an array of tables per list of maps."""
    head: list[str] = []
    body: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            body.append(f"\n[{json.dumps(key)}]")
            body.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
        elif isinstance(value, list) and value and all(isinstance(v, dict) and v for v in value):
            for item in value:
                body.append(f"\n[[{json.dumps(key)}]]")
                body.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in item.items())
        else:
            head.append(f"{json.dumps(key)} = {_toml_value(value)}")
    return "\n".join(head + body) + "\n"


# --- changes ---------------------------------------------------------------------------------------------------------


def _nested(depth: int, leaf: Any, as_map: bool) -> Any:
    for _ in range(depth):
        leaf = {"k": leaf} if as_map else [leaf]
    return leaf


_texts = st.sampled_from([
    "", " ", "\x00", "a\nb", "x" * 5000, "é" * 3000, "0.05", "5E-2", "1E-999999999", "1E+999999999",
    "0.0100000000000000000000000000001", "NaN", "-0", "population", "finite-domain", "vllm", "mlx", "bfloat16",
    "nf4", "shuffled", "reverse", "forward", "checked", "vouched", "hoeffding", "maurer-pontil", "betting",
    "paired-binary-exact", "arithmetic-exact", "solo", "b4r", "prompt", "invar.contract/1", "invar.contract/0",
    "model", "other-model", "empty", "fifo", "binary.bin", "latin1.jsonl", "basis.txt", "decl.toml",
    "population.jsonl", "model/tokenizer.json", "missing", "p" * 300 + "/x", "../", ".", "/nonexistent/x",
    "/dev/null", "e" * 64, "E" * 64, "solo\nb4r",
])
_scalars = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2, 30, 41, 2**20 + 1, 2**63 - 1, 2**63, 2**64]),
    st.floats(), st.sampled_from([0.0, 0.5, 1.0, 1.5, 1e-300, 0.05, 0.95, 11.0]),
    st.text(max_size=12), _texts, st.booleans(), st.datetimes(), st.dates(), st.times(),
)
# Two levels of lists and maps, not st.recursive: as varied here, and several times cheaper to draw.
_keys = st.text(max_size=8) | _texts
_shallow = st.lists(_scalars, max_size=3) | st.dictionaries(_keys, _scalars, max_size=3)
_values = _scalars | _shallow | st.lists(_shallow, max_size=2) | st.dictionaries(_keys, _shallow, max_size=2)
_DIGESTS: dict[Path, st.SearchStrategy[Any]] = {}


def _hostile(ws: Workspace) -> st.SearchStrategy[Any]:
    """Any value, sometimes deep or long, sometimes a digest of a real file: built once per workspace."""
    if ws.root not in _DIGESTS:
        _DIGESTS[ws.root] = st.one_of(
            _values, _values, _values, st.sampled_from(ws.digests),
            st.builds(_nested, st.integers(20, 300), _scalars, st.booleans()),
            st.builds(lambda n: {f"k{i}": i for i in range(n)}, st.integers(15, 100)),
            st.builds(lambda n: [{"statement": "s", "party": "p", "reliance": "vouched",
                                  "basis_sha256": "d" * 64}] * n, st.integers(0, 70)),
        )
    return _DIGESTS[ws.root]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out.extend(_paths(child, (*prefix, i)))
    return out


def _edit(value: Any, path: tuple[Any, ...], change: Any, key: Any = None) -> Any:
    """`value` with the node at `path` replaced by `change`, deleted (`change` is _DELETE) or, for a map, given
    the entry `key` = `change` (`path` names the map and `key` is set)."""
    if not path:
        if key is not None and isinstance(value, dict):
            return {**value, key: change}
        return change
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        if not rest and change is _DELETE and key is None:
            return {k: v for k, v in value.items() if k != head}
        return {k: (_edit(v, rest, change, key) if k == head else v) for k, v in value.items()}
    if not rest and change is _DELETE and key is None:
        return [v for i, v in enumerate(value) if i != head]
    return [(_edit(v, rest, change, key) if i == head else v) for i, v in enumerate(value)]


_DELETE = object()


_BASE_PATHS: dict[int, list[tuple[Any, ...]]] = {}


def _changed(data: st.DataObject, ws: Workspace, base: dict[str, Any]) -> dict[str, Any]:
    doc: Any = base
    paths = _BASE_PATHS.setdefault(id(base), _paths(base))  # the bases live as long as the module's workspace
    for _ in range(data.draw(st.integers(0, 3), label="changes")):
        paths = paths if doc is base else _paths(doc)
        path = paths[data.draw(st.integers(0, len(paths) - 1), label="path")]
        action = data.draw(_ACTIONS, label="action")
        if action == "delete" and path:
            doc = _edit(doc, path, _DELETE)
        elif action == "add" and isinstance(_at(doc, path), dict):
            key = data.draw(_keys, label="key")
            doc = _edit(doc, path, data.draw(_hostile(ws), label="value"), key=key)
        else:
            doc = _edit(doc, path, data.draw(_hostile(ws), label="value"))
    return doc if isinstance(doc, dict) else {"name": doc}


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


# Strategies are built once: building one per draw costs more than the draw.
_ACTIONS = st.sampled_from(["replace", "replace", "delete", "add"])
_DAMAGE = st.integers(0, 2).flatmap(lambda n: st.none() if n else st.randoms(use_true_random=False))
"""One example in three is damaged, by a generator hypothesis draws (the byte-level choices need no shrinking)."""
_INSERTS = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\n[", b"\"", b"{", b"= ", b"\x00", b"\r\n", b"\\u", b"\\", b"'''"]


def _damaged(rnd: random.Random | None, text: bytes) -> bytes:
    """`text` with 1-3 byte-level changes: bits flipped, bytes inserted or cut, deep nesting, 1 MiB, a BOM."""
    if rnd is None:
        return text
    out = bytearray(text)
    for _ in range(rnd.randint(1, 3)):
        op = rnd.choice(["flip", "insert", "insert", "delete", "cut", "deep", "huge", "bom"])
        pos = rnd.randrange(len(out)) if out else 0
        if op == "flip" and out:
            out[pos] ^= 1 << rnd.randrange(8)
        elif op == "insert":
            out[pos:pos] = rnd.choice([rnd.randbytes(rnd.randint(1, 6)), rnd.choice(_INSERTS)])
        elif op == "delete":
            del out[pos:pos + rnd.randint(1, 16)]
        elif op == "cut":
            del out[pos:]
        elif op == "deep":
            n = rnd.choice([31, 33, 200, 500, 5000])
            opener, closer = rnd.choice([(b"[", b"]"), (b'{"a":', b"}"), (b"{a=", b"}")])
            out[pos:pos] = b"\nzz = " + opener * n + b"1" + closer * n + b"\n"
        elif op == "huge":  # just under the limit, then just over it
            out += b"\n# " + b"x" * rnd.choice([max(0, (1 << 20) - len(out) - 4), 1 << 20]) + b"\n"
        else:
            out[0:0] = b"\xef\xbb\xbf"
    return bytes(out)


# --- running one example -------------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: collections.Counter[str]
    slowest: float = 0.0


def _hang(signum: int, frame: object) -> None:
    raise TimeoutError(f"one example ran past {HANG_S} s")


@pytest.fixture
def tally() -> Iterator[Tally]:
    previous = signal.signal(signal.SIGALRM, _hang)
    yield Tally(collections.Counter())
    signal.signal(signal.SIGALRM, previous)


def _attempt(tally: Tally, kind: str, run: Any) -> None:
    """Run one example: it must succeed or raise one `ContractError` line; nothing else, and within HANG_S."""
    t0 = time.perf_counter()
    signal.alarm(HANG_S)
    error = None
    try:
        run()
    except ContractError as exc:
        error = str(exc)
    finally:
        signal.alarm(0)
    tally.slowest = max(tally.slowest, time.perf_counter() - t0)
    if error is not None:
        assert "\n" not in error, error[:300]
        assert "\r" not in error, error[:300]
        assert len(error) < 2500, error[:300]
    tally.outcomes[f"{kind} {'refused' if error else 'ok'}"] += 1


def _declaration_example(ws: Workspace, tally: Tally, data: st.DataObject) -> None:
    decl = _changed(data, ws, ws.declaration)
    _try_declaration(ws, tally, decl, lambda: data.draw(_DAMAGE, label="damage"))


def _try_declaration(ws: Workspace, tally: Tally, decl: dict[str, Any],
                     damage: Callable[[], random.Random | None]) -> None:
    try:
        text = toml_text(decl).encode("utf-8", "surrogatepass")
    except TypeError:  # a value TOML has no spelling for (cannot happen with these strategies; kept honest)
        raise AssertionError(decl) from None
    path = ws.root / "decl.toml"
    path.write_bytes(_damaged(damage(), text))
    out = ws.root / "out"

    def run() -> None:
        try:
            prepared = prepare(path, out)
            assert prepared.path.read_bytes() == prepared.contract.canonical_json()
        finally:
            shutil.rmtree(out, ignore_errors=True)  # the next example may reuse the name with another contract

    _attempt(tally, "declaration", run)


def _contract_example(ws: Workspace, tally: Tally, data: st.DataObject) -> None:
    doc = _changed(data, ws, ws.contract)
    indented = data.draw(st.integers(0, 4), label="layout") == 0
    _try_contract(ws, tally, doc, indented, lambda: data.draw(_DAMAGE, label="damage"))


def _try_contract(ws: Workspace, tally: Tally, doc: dict[str, Any], indented: bool,
                  damage: Callable[[], random.Random | None]) -> None:
    if indented:
        text = json.dumps(doc, indent=1, default=str)  # not canonical: must be refused, never guessed at
    else:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"
    path = ws.root / "fuzz.contract.json"
    path.write_bytes(_damaged(damage(), text.encode("utf-8", "surrogatepass")))
    _attempt(tally, "contract", lambda: load_contract(path))


FOUND: dict[str, list[tuple[tuple[str, ...], Any]]] = {
    "declaration": [(("population", "path"), "\r")],
    "contract": [(("reference", "model_dir"), "\r")],
}
"""What the fuzz found (a field and the value that broke the one line), tried first on every run at any scale: a
population path of "\r" echoed raw by the population reader, a model folder of "\r" echoed raw by the tokenizer's.
The search itself need not draw either again: with both defects put back, a 10,000-example run of each drew neither
(docs/testing.md)."""


def _found(ws: Workspace, tally: Tally, which: str) -> None:
    for path, value in FOUND[which]:
        if which == "declaration":
            _try_declaration(ws, tally, _edit(ws.declaration, path, value), lambda: None)
        else:
            _try_contract(ws, tally, _edit(ws.contract, path, value), False, lambda: None)


def _run(ws: Workspace, tally: Tally, examples: int, which: str) -> None:
    example = _declaration_example if which == "declaration" else _contract_example

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        example(ws, tally, data)

    t0 = time.perf_counter()
    _found(ws, Tally(collections.Counter()), which)  # kept out of the search's tally, which the asserts below count
    check()
    seconds = time.perf_counter() - t0
    total = sum(tally.outcomes.values())
    print(f"\n{total:,} {which}s in {seconds:.1f} s, slowest {tally.slowest:.2f} s: "
          + ", ".join(f"{k}: {v:,}" for k, v in sorted(tally.outcomes.items())))
    assert total >= examples
    # Both outcomes occur: the changes are not all fatal, and not all harmless.
    assert tally.outcomes[f"{which} ok"] > 0
    assert tally.outcomes[f"{which} refused"] > 0


def test_generated_declarations_prepare_or_are_one_line(ws: Workspace, tally: Tally) -> None:
    _run(ws, tally, FAST, "declaration")


def test_generated_contracts_load_or_are_one_line(ws: Workspace, tally: Tally) -> None:
    _run(ws, tally, FAST, "contract")


@pytest.mark.slow
def test_generated_declarations_at_scale(ws: Workspace, tally: Tally) -> None:
    _run(ws, tally, SLOW, "declaration")


@pytest.mark.slow
def test_generated_contracts_at_scale(ws: Workspace, tally: Tally) -> None:
    _run(ws, tally, SLOW, "contract")
