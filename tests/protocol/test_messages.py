"""Every message's `from_wire` refuses a malformed map with `ProtocolError` alone, wherever the fault is."""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.errors import ProtocolError
from invar.protocol.messages import Call, ErrorInfo, Handshake, Identity, Report, Role

IDENTITY: dict[str, Any] = {
    "engine": "hf", "engine_version": {"torch": "2.13.0"}, "role": "inference",
    "settings": {"device": "cpu", "nested": {"threads": 2, "flags": [1, "x"]}}, "methods": ["generate"], "pid": 7,
}
HANDSHAKE: dict[str, Any] = {"kind": "handshake", "protocol": 1, "identity": IDENTITY}
CALL: dict[str, Any] = {"kind": "call", "call_id": 3, "method": "generate", "params": {"requests": []}}
OK_REPORT: dict[str, Any] = {"kind": "report", "call_id": 3, "call_digest": "a" * 64, "identity_digest": "b" * 64,
                             "ok": True, "result": {"outputs": []}}
ERROR_REPORT: dict[str, Any] = {"kind": "report", "call_id": 3, "call_digest": "a" * 64, "identity_digest": "b" * 64,
                                "ok": False, "error": {"type": "ValueError", "message": "bad"}}

PARSERS: dict[str, Any] = {"handshake": Handshake.from_wire, "call": Call.from_wire, "report": Report.from_wire,
                           "error": ErrorInfo.from_wire, "identity": Identity.from_wire}
VALID: dict[str, dict[str, Any]] = {"handshake": HANDSHAKE, "call": CALL, "report": OK_REPORT,
                                    "error": ERROR_REPORT["error"], "identity": IDENTITY}


def test_valid_messages_parse() -> None:
    hs = Handshake.from_wire(HANDSHAKE)
    assert hs.identity.role is Role.INFERENCE
    assert hs.identity.to_wire() == IDENTITY
    assert Call.from_wire(CALL).params == {"requests": []}
    assert Report.from_wire(OK_REPORT).result == {"outputs": []}
    assert Report.from_wire(ERROR_REPORT).error == ErrorInfo("ValueError", "bad")


def _with(base: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("parser", "message", "match"),
    [
        ("handshake", ["not", "a", "map"], "handshake is a list, expected a map"),
        ("handshake", {1: "x", "kind": "handshake"}, "handshake has the key 1, which is not a string"),
        ("handshake", _with(HANDSHAKE, ("identity",), None), "handshake identity is a NoneType, expected a map"),
        ("handshake", _with(HANDSHAKE, ("identity", "engine_version"), {"torch": 2}),
         "engine_version must map package names to version strings"),
        ("handshake", _with(HANDSHAKE, ("identity", "engine_version"), {b"torch": "2"}),
         "field 'engine_version' has the key b'torch', which is not a string"),
        ("handshake", _with(HANDSHAKE, ("identity", "engine_version"), ["torch"]),
         "field 'engine_version' has type list"),
        ("handshake", _with(HANDSHAKE, ("identity", "settings"), "cpu"), "field 'settings' has type str"),
        ("handshake", _with(HANDSHAKE, ("identity", "settings"), {3: "cpu"}),
         "field 'settings' has the key 3, which is not a string"),
        ("handshake", _with(HANDSHAKE, ("identity", "settings", "nested"), {3: "cpu"}),
         "identity settings have no canonical encoding: map key 3 is not a string"),
        ("handshake", _with(HANDSHAKE, ("identity", "settings", "nested"), {"x": object()}),
         "identity settings have no canonical encoding: type object"),
        ("handshake", _with(HANDSHAKE, ("identity", "methods"), ["generate", 5]), "methods must be strings"),
        ("handshake", _with(HANDSHAKE, ("identity", "worker"), {1: "echo"}),
         "identity worker has the key 1, which is not a string"),
        ("handshake", _with(HANDSHAKE, ("identity", "worker"), ["echo"]), "identity worker is a list, expected a map"),
        ("handshake", _with(HANDSHAKE, ("identity", "worker"), {"module": 1}), "identity worker must map 'module'"),
        ("handshake", _with(HANDSHAKE, ("identity", "role"), ["inference"]), "field 'role' has type list"),
        ("handshake", _with(HANDSHAKE, ("identity", "role"), "x" * 1000), "identity role 'xxxxxx"),
        ("handshake", _with(HANDSHAKE, ("identity", "pid"), 2**70), "field 'pid' is 1180591620717411303424, which"),
        ("handshake", _with(HANDSHAKE, ("protocol",), True), "field 'protocol' has type bool"),
        ("handshake", _with(HANDSHAKE, ("kind",), {"a": 1}), "expected a handshake first, got kind {'a': 1}"),
        ("handshake", _with(HANDSHAKE, ("kind",), np.zeros(0)), "expected a handshake first, got kind array([]"),
        ("call", None, "call is a NoneType, expected a map"),
        ("call", _with(CALL, ("params",), {1: 2}), "field 'params' has the key 1, which is not a string"),
        ("call", _with(CALL, ("params",), [1]), "field 'params' has type list"),
        ("call", _with(CALL, ("call_id",), True), "field 'call_id' has type bool"),
        ("call", _with(CALL, ("call_id",), 2**64), "field 'call_id' is 18446744073709551616, which does not fit"),
        ("call", _with(CALL, ("method",), b"generate"), "field 'method' has type bytes"),
        ("report", "report", "report is a str, expected a map"),
        ("report", _with(OK_REPORT, ("result",), {(1, 2): 3}), "field 'result' has the key (1, 2), which is not"),
        ("report", _with(OK_REPORT, ("ok",), 1), "field 'ok' has type int"),
        ("report", _with(OK_REPORT, ("error",), {"type": "X", "message": "y"}), "says ok but carries an error"),
        ("report", _with(ERROR_REPORT, ("result",), {}), "says not ok but carries a result"),
        ("report", _with(ERROR_REPORT, ("error",), ["ValueError"]), "field 'error' has type list"),
        ("report", _with(ERROR_REPORT, ("error", "type"), 5), "report error field 'type' has type int"),
        ("report", _with(ERROR_REPORT, ("error",), {"type": "X", "message": "y", 9: 1}),
         "field 'error' has the key 9, which is not a string"),
        ("error", 5, "report error is a int, expected a map"),
    ],
)
def test_malformed_message_is_one_protocol_error(parser: str, message: Any, match: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(match)):
        PARSERS[parser](message)


_anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
    | st.builds(object) | st.sampled_from([np.zeros(0), np.arange(3), np.array("report"), np.float32(1)]),
    lambda children: st.lists(children, max_size=3) | st.tuples(children)
    | st.dictionaries(st.text(max_size=4) | st.integers() | st.binary(max_size=4) | st.none(), children, max_size=3),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out.extend(_paths(child, (*prefix, key)))
    return out


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(sorted(PARSERS)), st.data())
def test_any_value_anywhere_parses_or_is_a_protocol_error(parser: str, data: st.DataObject) -> None:
    base = VALID[parser]
    message: Any = base
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(message) if isinstance(message, dict) else []
        value = data.draw(_anything)
        if not paths or data.draw(st.integers(0, 9)) == 0:
            message = value
        else:
            message = _with(message, data.draw(st.sampled_from(paths)), value)
    error = ""
    try:
        PARSERS[parser](message)
    except ProtocolError as exc:
        error = str(exc)
    assert "\n" not in error
    assert len(error) < 400
