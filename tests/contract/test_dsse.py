"""An independent verifier of invar's receipts, written from the DSSE envelope and protocol specifications
(github.com/secure-systems-lab/dsse, envelope.md and protocol.md) and the in-toto Statement v1 specification
(github.com/in-toto/attestation, spec/v1/statement.md), with only `cryptography` and the standard library: it
imports nothing of invar's receipt code. The receipt it checks is made by `invar use admit --receipt --key`, the
command an owner runs; the key pair is made here with `cryptography`, not with `invar keys new`.

It accepts the receipt as written, checks the statement's subjects against digests it computes itself (the
contract's file bytes, the population's, the run's last chain value read from the store with sqlite3), and refuses
the receipt after any single byte of its payload or its signature changes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

IN_TOTO = "application/vnd.in-toto+json"
STATEMENT_V1 = "https://in-toto.io/Statement/v1"


class Refused(Exception):
    """The verifier does not accept the envelope; the message says why."""


def _pae(payload_type: str, body: bytes) -> bytes:
    """protocol.md: PAE(type, body) = "DSSEv1" + SP + LEN(type) + SP + type + SP + LEN(body) + SP + body, where LEN
    is the ASCII decimal length in bytes and SP a single space."""
    t = payload_type.encode("utf-8")
    return b"".join([b"DSSEv1", b" ", str(len(t)).encode("ascii"), b" ", t, b" ", str(len(body)).encode("ascii"),
                     b" ", body])


def _b64decode(text: str) -> bytes:
    """envelope.md: Base64 (RFC 4648), standard or URL-safe."""
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(text.encode("ascii"))
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise Refused(f"not base64: {exc}") from None


@dataclass(frozen=True)
class Verified:
    keyid: str
    statement: dict[str, Any]


def dsse_verify(envelope_bytes: bytes, public_key: Ed25519PublicKey) -> Verified:
    """Verify a DSSE envelope holding an in-toto statement, signed by `public_key` with Ed25519.

    protocol.md, "Protocol": receive the envelope, reject unless a signature verifies over PAE(payloadType,
    payload) with a trusted key, reject unless payloadType is one this verifier supports, and only then parse the
    payload by its type. The keyid is an unauthenticated hint: it selects the key (here: the sha256 of the raw
    public key, as invar documents) and decides nothing by itself.
    """
    envelope = json.loads(envelope_bytes)
    if not isinstance(envelope, dict):
        raise Refused("the envelope is not a JSON object")
    for field in ("payload", "payloadType", "signatures"):
        if field not in envelope:
            raise Refused(f"the envelope lacks {field}")
    payload_type, signatures = envelope["payloadType"], envelope["signatures"]
    if not isinstance(payload_type, str) or not isinstance(envelope["payload"], str) or not isinstance(signatures,
                                                                                                        list):
        raise Refused("payload and payloadType are strings, signatures an array")
    body = _b64decode(envelope["payload"])
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    wanted = hashlib.sha256(raw).hexdigest()
    signed = _pae(payload_type, body)
    good = None
    for sig in signatures:
        if not isinstance(sig, dict) or not isinstance(sig.get("sig"), str):
            raise Refused("each signature has a string sig")
        if sig.get("keyid", "") not in ("", wanted):
            continue  # a hint naming another key
        try:
            public_key.verify(_b64decode(sig["sig"]), signed)
        except InvalidSignature:
            continue
        good = wanted
    if good is None:
        raise Refused("no signature verifies with the trusted key")
    if payload_type != IN_TOTO:
        raise Refused(f"unsupported payloadType {payload_type!r}")
    statement = json.loads(body)  # parsed only after the signature verified
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_V1:
        raise Refused("not an in-toto Statement v1")
    subject = statement.get("subject")
    if not isinstance(subject, list) or not subject:
        raise Refused("statement.subject: a non-empty list")
    for s in subject:
        digest = s.get("digest") if isinstance(s, dict) else None
        if not isinstance(digest, dict) or not digest or not all(
                isinstance(v, str) and v == v.lower() and all(c in "0123456789abcdef" for c in v)
                for v in digest.values()):
            raise Refused("statement.subject: each a digest set of lowercase hex")
    if not isinstance(statement.get("predicateType"), str) or "predicate" not in statement:
        raise Refused("statement: predicateType (a URI) and predicate")
    return Verified(good, statement)


# --- a receipt made by `invar use admit --receipt --key` -------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    ws: Workspace
    run: Path
    envelope: bytes
    public: Ed25519PublicKey


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    root = tmp_path_factory.mktemp("dsse")
    ws = make_workspace(root / "ws", units=300, requirement={"epsilon": "0.1"})
    run = RunWriter(ws, root / "run", keep_inputs=True).complete(candidate_wrong=unit_ids(ws, 120)).close()
    private = Ed25519PrivateKey.generate()
    (root / "owner.key").write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    out = subprocess.run([sys.executable, "-m", "invar.cli", "use", "admit", str(run), "--contract",
                          str(ws.contract_path), "--receipt", str(root / "receipt.json"), "--key",
                          str(root / "owner.key")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 10, out.stderr  # Violated: 120 more units wrong, a loss increase of 0.4 > ε = 0.1
    return Issued(ws, run, (root / "receipt.json").read_bytes(), private.public_key())


def _with(envelope: bytes, **changes: Any) -> bytes:
    doc = json.loads(envelope)
    for key, value in changes.items():
        if key == "sig":
            doc["signatures"][0]["sig"] = value
        else:
            doc[key] = value
    return json.dumps(doc).encode()


def test_the_receipt_invar_writes_verifies_and_its_subjects_are_the_digests_of_what_was_decided(
        issued: Issued) -> None:
    verified = dsse_verify(issued.envelope, issued.public)
    raw = issued.public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert verified.keyid == hashlib.sha256(raw).hexdigest()
    st = verified.statement
    assert st["predicateType"] == "https://invar.dev/use-decision/v1"
    assert st["predicate"]["answer"] == "Violated"
    subjects = {s["name"]: s["digest"] for s in st["subject"]}
    assert len(subjects) == len(st["subject"])  # each name once
    assert all(list(d) == ["sha256"] for d in subjects.values())
    assert subjects["contract"]["sha256"] == hashlib.sha256(issued.ws.contract_path.read_bytes()).hexdigest()
    population = issued.ws.contract_path.parent / "population.jsonl"
    assert subjects["population"]["sha256"] == hashlib.sha256(population.read_bytes()).hexdigest()
    with sqlite3.connect(f"file:{issued.run / 'records.sqlite'}?mode=ro", uri=True) as conn:
        (head,) = conn.execute("SELECT chain FROM log ORDER BY seq DESC LIMIT 1").fetchone()
    assert subjects["run/chain-head"]["sha256"] == head
    assert {"reference/model", "reference/tokenizer", "candidate/model", "candidate/tokenizer"} <= set(subjects)
    # The payload is canonical JSON: sorted keys, no spaces, so the same decision gives the same bytes.
    body = base64.b64decode(json.loads(issued.envelope)["payload"])
    assert body == json.dumps(st, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_another_key_is_refused(issued: Issued) -> None:
    with pytest.raises(Refused, match="no signature verifies"):
        dsse_verify(issued.envelope, Ed25519PrivateKey.generate().public_key())


@pytest.mark.parametrize("where", [0, 1, 100, "middle", -2, -1])
def test_one_changed_byte_of_the_payload_is_refused(issued: Issued, where: int | str) -> None:
    body = bytearray(base64.b64decode(json.loads(issued.envelope)["payload"]))
    i = len(body) // 2 if where == "middle" else int(where)
    body[i] ^= 0x01  # one bit of one byte: decoded, changed, encoded again
    with pytest.raises(Refused, match="no signature verifies"):
        dsse_verify(_with(issued.envelope, payload=base64.b64encode(bytes(body)).decode()), issued.public)


def test_a_changed_answer_is_refused(issued: Issued) -> None:
    body = base64.b64decode(json.loads(issued.envelope)["payload"])
    changed = body.replace(b'"answer":"Violated"', b'"answer":"Admitted"')
    assert changed != body
    with pytest.raises(Refused, match="no signature verifies"):
        dsse_verify(_with(issued.envelope, payload=base64.b64encode(changed).decode()), issued.public)


@pytest.mark.parametrize("where", [0, 1, 31, 32, 62, 63])
def test_one_changed_byte_of_the_signature_is_refused(issued: Issued, where: int) -> None:
    sig = bytearray(base64.b64decode(json.loads(issued.envelope)["signatures"][0]["sig"]))
    assert len(sig) == 64
    sig[where] ^= 0x80
    with pytest.raises(Refused, match="no signature verifies"):
        dsse_verify(_with(issued.envelope, sig=base64.b64encode(bytes(sig)).decode()), issued.public)


def test_another_payload_type_is_refused(issued: Issued) -> None:
    # The type is inside the PAE: changing it breaks the signature before the type is even looked at.
    with pytest.raises(Refused, match="no signature verifies"):
        dsse_verify(_with(issued.envelope, payloadType="application/json"), issued.public)
