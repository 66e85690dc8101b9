"""Receipts are parsed strictly: every malformed, tampered or ambiguous receipt is refused in one line naming what is
wrong, for the in-toto/DSSE layout `use admit --receipt` writes and for the older `invar.receipt/1`, which still
verifies where it is valid. The CLI prints each refusal as that one line and exits 2."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from contract_runs import RunWriter, make_workspace, unit_ids
from cryptography.hazmat.primitives import serialization

from invar.contract.admit import admit
from invar.contract.decide import Decision
from invar.contract.receipt import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    RECEIPT_SCHEMA,
    fingerprint,
    load_private_key,
    make_receipt,
    new_key_pair,
    pae,
    receipt_body,
    verify_receipt,
)
from invar.errors import InvarError

Doc = dict[str, Any]


@dataclass(frozen=True)
class Case:
    run: Path
    contract: Path
    key: Path
    pub: Path
    other_pub: Path
    decision: Decision
    signed: Doc
    unsigned: Doc


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    root = tmp_path_factory.mktemp("refusals")
    ws = make_workspace(root / "ws", units=300, requirement={"epsilon": "0.1"})
    run = RunWriter(ws, root / "run", keep_inputs=True).complete(candidate_wrong=unit_ids(ws, 120)).close()
    key, pub, _ = new_key_pair(root / "keys", "owner")
    _, other_pub, _ = new_key_pair(root / "keys", "other")
    decision = admit(ws.contract_path, run)
    return Case(run, ws.contract_path, key, pub, other_pub, decision,
                make_receipt(decision, load_private_key(key), contract=ws.contract_path),
                make_receipt(decision, contract=ws.contract_path))


def _copy(doc: Doc) -> Doc:
    return json.loads(json.dumps(doc))  # type: ignore[no-any-return]


def _statement(envelope: Doc) -> Doc:
    return json.loads(base64.b64decode(envelope["payload"]))  # type: ignore[no-any-return]


def _signed_payload(case: Case, envelope: Doc, payload: bytes) -> Doc:
    """`envelope` with `payload`, signed again by the issuer's key: only the records can refuse it then."""
    out = _copy(envelope)
    out["payload"] = base64.b64encode(payload).decode()
    out["signatures"][0]["sig"] = base64.b64encode(load_private_key(case.key).sign(pae(PAYLOAD_TYPE, payload))).decode()
    return out


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _legacy(case: Case, signed: bool = True) -> Doc:
    """An `invar.receipt/1` receipt, as `use admit --receipt` wrote them before receipts were in-toto statements."""
    body = receipt_body(case.decision)
    if not signed:
        return {"receipt": body, "signature": None}
    key = load_private_key(case.key)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"receipt": body, "signature": {"algorithm": "ed25519", "public_key_sha256": fingerprint(key.public_key()),
                                           "public_key": raw.hex(), "value": key.sign(_canonical(body)).hex()}}


def _refused(case: Case, tmp_path: Path, text: str | bytes, message: str, *, key: str = "pub") -> str:
    """Verify a receipt holding `text`; it must be refused in one line holding `message`. Returns the line."""
    path = tmp_path / "receipt.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    given = case.pub if key == "pub" else None
    with pytest.raises(InvarError) as caught:
        verify_receipt(path, case.run, case.contract, given, trust_embedded_key=given is None)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"{path}: "), line
    assert message in line, line
    return line


def _dumps(doc: Doc) -> str:
    return json.dumps(doc, indent=2)


# --- the envelope and the statement -----------------------------------------------------------------------------


def test_the_receipt_is_deterministic_and_verifies(case: Case, tmp_path: Path) -> None:
    again = make_receipt(case.decision, load_private_key(case.key), contract=case.contract)
    assert again == case.signed  # Ed25519 signs deterministically; the payload is canonical JSON
    assert case.unsigned["payload"] == case.signed["payload"]
    assert case.unsigned["signatures"] == []
    st = _statement(case.signed)
    assert (st["_type"], st["predicateType"]) == ("https://in-toto.io/Statement/v1", PREDICATE_TYPE)
    assert [s["name"] for s in st["subject"]][:3] == ["contract", "run/chain-head", "population"]
    (tmp_path / "r.json").write_text(_dumps(case.signed))
    check = verify_receipt(tmp_path / "r.json", case.run, case.contract, case.pub)
    assert (check.signed, check.key_checked, check.trust, check.warning) == (True, True, "public-key", None)


def test_duplicate_keys_are_refused(case: Case, tmp_path: Path) -> None:
    text = _dumps(case.signed)
    doubled = text.replace('"payloadType"', f'"payloadType": "{PAYLOAD_TYPE}",\n  "payloadType"', 1)
    _refused(case, tmp_path, doubled, "the receipt holds the key 'payloadType' twice in one object")
    # Inside the signed payload: a second answer, signed by the issuer, is still refused.
    body = base64.b64decode(case.signed["payload"])
    twice = body.replace(b'"answer":"Violated"', b'"answer":"Admitted","answer":"Violated"', 1)
    assert twice != body
    _refused(case, tmp_path, _dumps(_signed_payload(case, case.signed, twice)),
             "the envelope's payload holds the key 'answer' twice in one object")


@pytest.mark.parametrize(("where", "message"), [
    ("envelope", "envelope has the unknown field 'note'"),
    ("signature", "envelope.signatures[0] has the unknown field 'note'"),
])
def test_unknown_fields_of_the_envelope_are_refused(case: Case, tmp_path: Path, where: str, message: str) -> None:
    env = _copy(case.signed)
    (env if where == "envelope" else env["signatures"][0])["note"] = None
    _refused(case, tmp_path, _dumps(env), message)


@pytest.mark.parametrize(("part", "message"), [
    ("statement", "statement has the unknown field 'note'"),
    ("subject", "statement.subject[1] has the unknown field 'note'"),
    ("digest", "statement.subject[0].digest has the unknown field 'sha512'"),
    ("figures", "statement.predicate.figures.note is an unknown field"),
    ("run", "statement.predicate.run has the unknown field 'note'"),
])
def test_unknown_fields_of_the_statement_are_refused_even_when_signed(case: Case, tmp_path: Path, part: str,
                                                                      message: str) -> None:
    st = _statement(case.signed)
    target = {"statement": st, "subject": st["subject"][1], "figures": st["predicate"]["figures"],
              "run": st["predicate"]["run"]}.get(part)
    if part == "digest":
        st["subject"][0]["digest"]["sha512"] = "ab" * 64
    else:
        assert target is not None
        target["note"] = None  # null: a field the records lack is refused whatever its value
    _refused(case, tmp_path, _dumps(_signed_payload(case, case.signed, _canonical(st))), message)


@pytest.mark.parametrize(("change", "message"), [
    (lambda e: e.update(signatures={}), "envelope.signatures is a JSON object, not an array"),
    (lambda e: e.update(payloadType=1), "envelope.payloadType is a JSON integer, not a string"),
    (lambda e: e["signatures"][0].update(keyid=None), "envelope.signatures[0].keyid is a JSON null, not a string"),
    (lambda e: e["signatures"].append(e["signatures"][0]), "envelope.signatures holds 2 signatures"),
])
def test_wrong_types_in_the_envelope_are_refused(case: Case, tmp_path: Path, change: Callable[[Doc], None],
                                                 message: str) -> None:
    env = _copy(case.signed)
    change(env)
    _refused(case, tmp_path, _dumps(env), message)


@pytest.mark.parametrize(("change", "message"), [
    (lambda st: st["predicate"]["run"].update(records=float(st["predicate"]["run"]["records"])),
     "statement.predicate.run.records is a JSON number ("),
    (lambda st: st["predicate"]["figures"]["invariance"].update(holds=1),
     "statement.predicate.figures.invariance.holds is a JSON integer (1) in the receipt, a JSON boolean"),
    (lambda st: st.update(subject={}), "statement.subject is not a non-empty array"),
    (lambda st: st.update(predicateType="https://invar.dev/use-decision/v2"),
     "statement.predicateType is 'https://invar.dev/use-decision/v2', not 'https://invar.dev/use-decision/v1'"),
])
def test_wrong_types_in_the_statement_are_refused_even_when_signed(case: Case, tmp_path: Path,
                                                                   change: Callable[[Doc], None], message: str) -> None:
    st = _statement(case.signed)
    change(st)
    _refused(case, tmp_path, _dumps(_signed_payload(case, case.signed, _canonical(st))), message)


def test_a_payload_not_in_canonical_json_is_refused(case: Case, tmp_path: Path) -> None:
    spaced = json.dumps(_statement(case.signed), sort_keys=True).encode()  # the same statement, with spaces
    _refused(case, tmp_path, _dumps(_signed_payload(case, case.signed, spaced)),
             "the payload states what the records give, but not in canonical JSON")


def test_a_keyid_that_is_not_the_key_is_refused(case: Case, tmp_path: Path) -> None:
    env = _copy(case.signed)
    other = fingerprint(load_private_key(case.key.with_name("other.key")).public_key())
    env["signatures"][0]["keyid"] = other
    line = _refused(case, tmp_path, _dumps(env), f"envelope.signatures[0].keyid is {other[:16]}…, but the embedded "
                                                 "public key's sha256 is")
    assert "the signature names another key than it carries" in line
    _refused(case, tmp_path, _dumps(env), "envelope.signatures[0].keyid is", key="embedded")
    # The key given is not the signer's.
    (tmp_path / "r.json").write_text(_dumps(case.signed))
    with pytest.raises(InvarError, match=r"signed by key [0-9a-f]{16}…, not by the key in .*other\.pub"):
        verify_receipt(tmp_path / "r.json", case.run, case.contract, case.other_pub)


def test_another_payload_type_is_refused(case: Case, tmp_path: Path) -> None:
    env = _copy(case.signed)
    env["payloadType"] = "application/json"
    _refused(case, tmp_path, _dumps(env),
             "envelope.payloadType is 'application/json', not 'application/vnd.in-toto+json'")


@pytest.mark.parametrize(("field", "value"), [
    ("payload", "not base64!"),
    ("payload", "url-safe"),
    ("payload", "unpadded"),
    ("sig", "%%%%"),
    ("publicKey", "AAAA"),
])
def test_bad_base64_is_refused(case: Case, tmp_path: Path, field: str, value: str) -> None:
    env = _copy(case.signed)
    if value == "url-safe":  # DSSE allows it; invar writes the standard alphabet and reads nothing else
        value = base64.urlsafe_b64encode(base64.b64decode(env["payload"]) + b"\xfb\xff").decode()
    elif value == "unpadded":
        value = env["payload"].rstrip("=") if env["payload"].endswith("=") else env["payload"] + "="
    if field == "payload":
        env["payload"] = value
        message = "envelope.payload is not standard base64"
    else:
        env["signatures"][0][field] = value
        message = f"envelope.signatures[0].{field} is not standard base64" if value != "AAAA" else \
            "envelope.signatures[0].publicKey holds 3 bytes, not the 32 of a raw Ed25519 public key"
    _refused(case, tmp_path, _dumps(env), message)


@pytest.mark.parametrize("where", [0, 57, -1])
def test_a_signature_over_another_payload_is_refused(case: Case, tmp_path: Path, where: int) -> None:
    body = bytearray(base64.b64decode(case.signed["payload"]))
    body[where] ^= 0x20
    env = _copy(case.signed)
    env["payload"] = base64.b64encode(bytes(body)).decode()
    _refused(case, tmp_path, _dumps(env), "the signature does not match the receipt's contents: the receipt was "
                                          "changed after it was signed")


def test_without_a_key_or_trust_in_the_embedded_one_verify_refuses(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(_dumps(case.signed))
    with pytest.raises(InvarError, match=re.escape("pass --public-key with the issuer's .pub file to check who signed "
                                                   "it, or --trust-embedded-key to accept that anyone could have")):
        verify_receipt(path, case.run, case.contract)
    with pytest.raises(InvarError, match="--public-key and --trust-embedded-key: give one"):
        verify_receipt(path, case.run, case.contract, case.pub, trust_embedded_key=True)
    check = verify_receipt(path, case.run, case.contract, trust_embedded_key=True)
    assert (check.signed, check.key_checked, check.trust) == (True, False, "embedded-key")
    assert check.warning is not None
    assert "anyone could have signed it" in check.warning
    (tmp_path / "u.json").write_text(_dumps(case.unsigned))
    with pytest.raises(InvarError, match="the receipt is not signed, so anyone could have written it; pass "
                                         "--trust-embedded-key"):
        verify_receipt(tmp_path / "u.json", case.run, case.contract)
    with pytest.raises(InvarError, match="the receipt is not signed, but --public-key asks for a signature"):
        verify_receipt(tmp_path / "u.json", case.run, case.contract, case.pub)
    check = verify_receipt(tmp_path / "u.json", case.run, case.contract, trust_embedded_key=True)
    assert (check.signed, check.warning) == (False, "the receipt is not signed: anyone could have written it")


# --- the older invar.receipt/1 ----------------------------------------------------------------------------------


def test_an_old_receipt_still_verifies_where_valid(case: Case, tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(json.dumps(_legacy(case), indent=2, sort_keys=True))
    check = verify_receipt(tmp_path / "old.json", case.run, case.contract, case.pub)
    assert (check.format, check.signed, check.key_checked) == (RECEIPT_SCHEMA, True, True)
    assert check.decision.answer.value == "Violated"
    assert verify_receipt(tmp_path / "old.json", case.run, case.contract, trust_embedded_key=True).trust == \
        "embedded-key"
    (tmp_path / "unsigned.json").write_text(json.dumps(_legacy(case, signed=False)))
    assert not verify_receipt(tmp_path / "unsigned.json", case.run, case.contract, trust_embedded_key=True).signed


def test_an_old_receipt_with_a_duplicate_answer_is_refused(case: Case, tmp_path: Path) -> None:
    text = json.dumps(_legacy(case), indent=2, sort_keys=True)
    # A parser keeping the last value would read Admitted; the signature covers the first one.
    doubled = text.replace('"answer": "Violated"', '"answer": "Violated",\n    "answer": "Admitted"', 1)
    assert doubled != text
    _refused(case, tmp_path, doubled, "the receipt holds the key 'answer' twice in one object")


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(note="trust me"), "the receipt has the unknown field 'note'"),
    (lambda d: d["signature"].update(note=None), "signature has the unknown field 'note'"),
    (lambda d: d["receipt"].update(extra=None), "receipt.extra is an unknown field"),  # null once matched "absent"
    (lambda d: d["receipt"]["run"].update(records=float(d["receipt"]["run"]["records"])),
     "receipt.run.records is a JSON number ("),
    (lambda d: d["signature"].update(value=d["signature"]["value"].upper()),
     "signature.value is"),
])
def test_an_old_receipt_with_extra_fields_or_wrong_types_is_refused(case: Case, tmp_path: Path,
                                                                    change: Callable[[Doc], None],
                                                                    message: str) -> None:
    doc = _legacy(case)
    change(doc)
    if "extra" in doc["receipt"] or isinstance(doc["receipt"]["run"]["records"], float):  # signed again: the records
        key = load_private_key(case.key)  # refuse it, not the signature
        doc["signature"]["value"] = key.sign(_canonical(doc["receipt"])).hex()
    _refused(case, tmp_path, json.dumps(doc), message)


def test_an_old_receipt_whose_key_hash_is_not_its_key_is_refused(case: Case, tmp_path: Path) -> None:
    doc = _legacy(case)
    doc["signature"]["public_key_sha256"] = "0" * 64
    line = _refused(case, tmp_path, json.dumps(doc), "signature.public_key_sha256 is 0000000000000000…, but the "
                                                     "embedded public key's sha256 is")
    assert "do not trust the receipt" in line
    _refused(case, tmp_path, json.dumps(doc), "signature.public_key_sha256 is", key="embedded")


# --- the command line -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["duplicate", "keyid", "old-extra", "no-key"])
def test_use_verify_prints_each_refusal_as_one_line_and_exits_2(case: Case, tmp_path: Path, kind: str) -> None:
    env = _copy(case.signed)
    args = ["--public-key", str(case.pub)]
    if kind == "duplicate":
        text = _dumps(env).replace('"payload"', '"payload": "",\n  "payload"', 1)
        message = "holds the key 'payload' twice in one object"
    elif kind == "keyid":
        env["signatures"][0]["keyid"] = "f" * 64
        text, message = _dumps(env), "envelope.signatures[0].keyid is ffffffffffffffff…, but the embedded public key"
    elif kind == "old-extra":
        text, message = json.dumps({**_legacy(case), "note": 1}), "the receipt has the unknown field 'note'"
    else:
        text, message, args = _dumps(env), "or --trust-embedded-key to accept that anyone could have", []
    (tmp_path / "r.json").write_text(text)
    out = subprocess.run([sys.executable, "-m", "invar.cli", "use", "verify", str(tmp_path / "r.json"), "--run",
                          str(case.run), "--contract", str(case.contract), *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr, out.stderr
