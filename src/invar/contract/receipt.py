"""Decision receipts: what a `use admit` decided, bound to the run's head, as an in-toto attestation signed with
Ed25519 inside a DSSE envelope.

A run's records prove nothing about a forger who rewrites a report and recomputes every digest after it: the chain
is only as good as an anchor kept outside the store. A receipt is that anchor, written at decision time. It is a
DSSE envelope (`payloadType` `application/vnd.in-toto+json`) around an in-toto Statement v1 whose subjects are the
digests the decision covers (the contract, the run's chain head, the population, the scorer file, each package's
model folder, tokenizer, adapter, patches and worker code, each premise's basis) and whose predicate
(`PREDICATE_TYPE`) is the decision: the plan, decision and method versions, the answer, its reason and the figures
it rests on, and a digest of every piece of evidence. `verify_receipt` recomputes the decision from the records with
the head as the expected anchor and the whole statement from it and the contract, so a re-chained, cut or extended
run, another contract or another answer are all refused, naming what differs.

The payload is canonical JSON (sorted keys, no spaces, UTF-8), so the same decision gives the same bytes. The
signature is Ed25519 over DSSE's pre-authentication encoding of the payload (`pae`); `keyid` is the sha256 of the
raw public key, and the envelope's signature also carries the raw public key (`publicKey`, an extension field DSSE
lets producers add and other consumers ignore). Without a public key the verifier holds independently, a signature
only shows that the receipt was not changed since it was signed by whoever holds the embedded key: `verify_receipt`
refuses to verify unless given that key or told to trust the embedded one, and says which it did.

Receipts of the older `invar.receipt/1` layout (a JSON body and a signature over its canonical JSON) still verify,
parsed just as strictly. Every refusal is one `InvarError` line naming the file and what is wrong.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from invar import canonical
from invar.contract.admit import Step, admit
from invar.contract.decide import Decision
from invar.contract.model import Contract, read_contract
from invar.contract.outputs import (
    DecisionContract,
    ReceiptBound,
    ReceiptDeterminism,
    ReceiptFigures,
    ReceiptInvariance,
    ReceiptMethod,
    ReceiptPredicate,
    ReceiptRun,
    ReceiptSequential,
)
from invar.errors import EvidenceError, InvarError
from invar.evidence import Difference, first_difference
from invar.owner_files import read_regular_file

PAYLOAD_TYPE = "application/vnd.in-toto+json"
"""The DSSE payload type of an in-toto attestation."""

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
"""The in-toto Statement layer's `_type`."""

PREDICATE_TYPE = "https://invar.dev/use-decision/v1"
"""Names the predicate's layout (`ReceiptPredicate`; docs/records.md, "Decision receipts"); a predicate of another
type is refused, and a change to the layout gets a new version."""

RECEIPT_SCHEMA = "invar.receipt/1"
"""The older receipt layout (a body and a signature over its canonical JSON): still verified, no longer written."""

MAX_RECEIPT_BYTES = 1 << 20
MAX_KEY_BYTES = 64 * 1024

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
_FIX = "give the file `use admit --receipt` wrote"


def _canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, the bytes a signature covers: "DSSEv1" SP LEN(type) SP type SP LEN(body)
    SP body, each LEN the ASCII decimal byte length."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def predicate(decision: Decision) -> ReceiptPredicate:
    """The receipt's predicate for a decision: everything `verify_receipt` recomputes and compares. Pure.

    A part only some decisions have (invariance relative to the reference, a sequential stop, a non-finite call,
    determinism) is set only when the decision has it, so the receipts of other decisions keep their bytes."""
    b, inv = decision.bound, decision.invariance
    invariance = ReceiptInvariance(required=inv.required, layouts=list(inv.layouts), holds=inv.holds,
                                   units_differing=inv.units_differing)
    if inv.relative is not None:  # which units gained layout dependence
        invariance = ReceiptInvariance(
            required=inv.required, layouts=list(inv.layouts), holds=inv.holds, units_differing=inv.units_differing,
            relative_to="reference", reference_units_differing=inv.relative.reference_units_differing,
            gained_units=list(inv.relative.gained_units))
    optional: dict[str, Any] = {}
    if (s := decision.sequential) is not None:
        optional["sequential"] = ReceiptSequential(version=s.version, answer=s.answer, look=len(s.looks), stop=s.stop,
                                                   n_max=s.n_max)
    if decision.nonfinite is not None:  # the error record that decided
        optional["nonfinite"] = decision.nonfinite.output()
    if (t := decision.determinism) is not None:  # which units differed between runs
        optional["determinism"] = ReceiptDeterminism(
            layout=t.layout, runs=t.runs, holds=t.holds, units_differing=t.units_differing,
            reference_units_differing=t.reference_units_differing, differing_units=list(t.differing_units))
    calls = [[e.key, e.call_digest, e.report_digest] for e in decision.evidence]
    calls += [[m.key, m.call_digest, m.report_digest] for m in decision.measurement_evidence]
    return ReceiptPredicate(
        contract=DecisionContract(name=decision.contract_name, sha256=decision.contract_sha256),
        run=ReceiptRun(head=decision.chain_head, records=decision.records),
        plan_version=decision.plan_version, decision_version=decision.decision_version,
        method=None if b is None else ReceiptMethod(name=b.method, version=b.version),
        answer=decision.answer.value, reason=decision.reason,
        figures=ReceiptFigures(
            standard=decision.standard, epsilon=str(decision.epsilon),
            delta=None if decision.delta is None else str(decision.delta), task_loss=decision.task_loss.output(),
            bound=None if b is None else ReceiptBound(n=b.n, delta=b.delta, estimate=b.estimate, lower=b.lower,
                                                      upper=b.upper),
            invariance=invariance, premises_held=[p.holds for p in decision.premises], **optional),
        evidence=canonical.digest(calls))


def predicate_json(decision: Decision) -> dict[str, Any]:
    """The predicate as the receipt holds it (JSON values; the parts the decision lacks left out)."""
    return predicate(decision).model_dump(mode="json", exclude_unset=True)


def receipt_body(decision: Decision) -> dict[str, Any]:
    """The `invar.receipt/1` body for a decision: the predicate and its `schema`. Pure."""
    return {"schema": RECEIPT_SCHEMA, **predicate_json(decision)}


def subjects(decision: Decision, contract: Contract) -> list[dict[str, Any]]:
    """The statement's subjects: one {name, digest: {sha256}} per digest the decision covers, in a fixed order."""
    out: list[tuple[str, str]] = [("contract", decision.contract_sha256), ("run/chain-head", decision.chain_head),
                                  ("population", contract.population.sha256)]
    if contract.scorer.sha256 is not None:
        out.append(("scorer", contract.scorer.sha256))
    for role in ("reference", "candidate"):
        p = contract.reference if role == "reference" else contract.candidate
        out += [(f"{role}/model", p.model_digest), (f"{role}/tokenizer", p.tokenizer_digest)]
        if p.adapter is not None:
            out.append((f"{role}/adapter", p.adapter.digest))
        out += [(f"{role}/patch/{name}", sha) for name, sha in sorted(p.patches.items())]
        if p.worker_digest is not None:  # contracts prepared before worker code was pinned keep their statements
            out.append((f"{role}/worker", p.worker_digest))
    out += [(f"premise/{i}/basis", p.basis_sha256) for i, p in enumerate(contract.premises)]
    return [{"name": name, "digest": {"sha256": sha}} for name, sha in out]


def statement(decision: Decision, contract: Contract) -> dict[str, Any]:
    """The in-toto Statement v1 of a decision under `contract` (the contract the decision names). Pure."""
    return {"_type": STATEMENT_TYPE, "subject": subjects(decision, contract), "predicateType": PREDICATE_TYPE,
            "predicate": predicate_json(decision)}


# --- keys ----------------------------------------------------------------------------------------------------------


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public: Ed25519PublicKey) -> str:
    """sha256 of the raw 32-byte public key, hex: how receipts (`keyid`) and messages name a key."""
    return canonical.sha256(_raw(public))


KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A key's name is a plain file name: no folder part (`../x` would write outside `--out`), not hidden, not empty."""


def new_key_pair(out_dir: Path, name: str) -> tuple[Path, Path, str]:
    """Write `<name>.key` (PKCS#8 PEM, readable by its owner only) and `<name>.pub`; refuse to overwrite either."""
    if not KEY_NAME.fullmatch(name):
        raise InvarError(f"--name {canonical.show(name, 60)}: a key's name is a plain file name of 1-64 letters, "
                         "digits, '_', '.' or '-', starting with a letter or digit; choose another (--out picks the "
                         "folder)")
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    pub = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        with open(pub_path, "xb") as f:
            f.write(pub)
    except FileExistsError as exc:
        raise InvarError(f"{exc.filename}: a key already exists there and keys are never overwritten; choose "
                         "another --name or folder") from None
    except OSError as exc:
        raise InvarError(f"{exc.filename or out_dir}: cannot write the key ({exc.strerror}); choose another "
                         "folder") from None
    return key_path, pub_path, fingerprint(private.public_key())


def _read_pem(path: Path, what: str) -> bytes:
    # A key file is a few hundred bytes; a device or a pipe given for it must not be read without end.
    return read_regular_file(path, what, limit=MAX_KEY_BYTES, error=InvarError,
                             fix=f"give the {'.key' if what == 'private key' else '.pub'} file `invar keys new` wrote")


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(_read_pem(path, "private key"), password=None)
    except (ValueError, TypeError) as exc:
        raise InvarError(f"{path}: not an unencrypted PEM private key ({exc}); give the .key file `invar keys new` "
                         "wrote") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvarError(f"{path}: not an Ed25519 key; make one with `invar keys new`")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(_read_pem(path, "public key"))
    except (ValueError, TypeError) as exc:
        raise InvarError(f"{path}: not a PEM public key ({exc}); give the .pub file `invar keys new` wrote") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InvarError(f"{path}: not an Ed25519 public key; give the .pub file `invar keys new` wrote")
    return key


# --- writing -------------------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _decided_under(decision: Decision, contract: Path) -> Contract:
    """The contract at `contract`, which must still be the one `decision` was made under."""
    fixed, sha = read_contract(contract)
    if sha != decision.contract_sha256:
        raise InvarError(f"{contract}: its sha256 is now {sha[:16]}…, but the decision was made under "
                         f"{decision.contract_sha256[:16]}…: the contract changed while deciding; decide again")
    return fixed


def make_receipt(decision: Decision, key: Ed25519PrivateKey | None = None, *, contract: Path) -> dict[str, Any]:
    """The receipt of `decision` under the contract file `contract` (the one it was decided under): a DSSE envelope
    around its in-toto statement, signed with `key` when one is given (`signatures` is empty otherwise)."""
    try:
        payload = _canonical_json(statement(decision, _decided_under(decision, contract)))
    except ValueError as exc:  # a figure JSON cannot state (NaN, an infinity): a bug, said in one line
        raise InvarError(f"the decision holds a figure JSON cannot state ({exc}); no receipt was written") from None
    signatures = []
    if key is not None:
        public = key.public_key()
        signatures.append({"keyid": fingerprint(public), "publicKey": _b64(_raw(public)),
                           "sig": _b64(key.sign(pae(PAYLOAD_TYPE, payload)))})
    return {"payload": _b64(payload), "payloadType": PAYLOAD_TYPE, "signatures": signatures}


def write_receipt(path: Path, receipt: dict[str, Any]) -> None:
    """Write a receipt as indented JSON; refuse to overwrite an existing file (receipts are records too).

    The receipt appears whole or not at all: it is written to a temporary file in the same folder, synced, and
    linked to its name (a link, unlike a rename, refuses a name that exists), so a full disk or a kill mid-write
    never leaves a cut receipt under the name, which could then never be written again.
    """
    data = (json.dumps(receipt, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    exists = InvarError(f"{path}: a file is already there and receipts are never overwritten; choose another "
                        "--receipt path")
    if os.path.lexists(path):
        raise exists
    folder = path.parent
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # as an ordinary file; mkstemp makes it owner-only
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise exists from None
        _sync_folder(folder)
    except OSError as exc:
        raise InvarError(f"{path}: cannot write the receipt ({exc.strerror or exc}); nothing was written under "
                         "that name: free space or choose another path, and decide again") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _sync_folder(folder: Path) -> None:
    """Make a new name in `folder` durable (a crash after this keeps the receipt)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- strict reading ------------------------------------------------------------------------------------------------


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def strict_json(data: bytes, where: str, what: str) -> Any:
    """Parse JSON refusing duplicate keys (at any depth), NaN and infinities, and bytes that are not UTF-8."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Duplicate as exc:
        raise InvarError(f"{where}: {what} holds the key {canonical.show(exc.args[0], 40)} twice in one object; "
                         f"a receipt has each key once: {_FIX}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvarError(f"{where}: {what} is not JSON ({str(exc)[:120]}); {_FIX}") from None


def read_receipt(path: Path) -> dict[str, Any]:
    """A receipt file's JSON object, read with a bound and parsed strictly (its layout is checked by
    `verify_receipt`)."""
    raw = read_regular_file(path, "receipt", limit=MAX_RECEIPT_BYTES, error=InvarError, fix=_FIX)
    data = strict_json(raw, str(path), "the receipt")
    if not isinstance(data, dict):
        raise InvarError(f"{path}: not a receipt (a JSON {_type_name(data)}, not an object); {_FIX}")
    return data


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


class _Shape:
    """Refusals of one receipt file: each names the file, the field (a dotted path) and what is wrong."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def refuse(self, text: str) -> NoReturn:
        raise InvarError(f"{self.path}: {text}; {_FIX}")

    def fields(self, obj: Any, where: str, required: set[str], optional: frozenset[str] = frozenset()) -> \
            dict[str, Any]:
        if not isinstance(obj, dict):
            self.refuse(f"{where} is a JSON {_type_name(obj)}, not an object")
        unknown = sorted(set(obj) - required - optional)
        if unknown:
            self.refuse(f"{where} has the unknown field {canonical.show(unknown[0], 40)}"
                        + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
        missing = sorted(required - set(obj))
        if missing:
            self.refuse(f"{where} lacks the field {missing[0]!r}")
        return obj

    def text(self, obj: dict[str, Any], key: str, where: str, pattern: re.Pattern[str] | None = None,
             what: str = "") -> str:
        value = obj[key]
        if not isinstance(value, str):
            self.refuse(f"{where}.{key} is a JSON {_type_name(value)}, not a string")
        if pattern is not None and not pattern.fullmatch(value):
            self.refuse(f"{where}.{key} is {canonical.show(value, 40)}, not {what}")
        return value

    def base64(self, obj: dict[str, Any], key: str, where: str) -> bytes:
        value = self.text(obj, key, where)
        try:
            data = base64.b64decode(value.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error, ValueError):
            data = None
        if data is None or _b64(data) != value:
            self.refuse(f"{where}.{key} is not standard base64 (RFC 4648, '+/' alphabet, padded, as invar writes it)")
        return data


def _first_difference(expected: Any, actual: Any, where: str) -> str | None:
    """The first place `actual` differs from `expected`, comparing keys, JSON types and values (1, 1.0 and true are
    three different things here)."""
    diff = first_difference(expected, actual, where)
    return None if diff is None else diff.said(_RECEIPT_WORDS)


_RECEIPT_WORDS: dict[str, Callable[[Difference], str]] = {
    "missing": lambda d: f"{d.where} is missing from the receipt, {d.expected!r} recomputed from the records",
    "unexpected": lambda d: f"{d.where} is an unknown field (the records give no such field)",
    "length": lambda d: f"{d.where} holds {len(d.actual)} entries in the receipt, {len(d.expected)} recomputed from "
                        "the records",
    "type": lambda d: (f"{d.where} is a JSON {_type_name(d.actual)} ({canonical.show(d.actual, 60)}) in the receipt, "
                       f"a JSON {_type_name(d.expected)} ({canonical.show(d.expected, 60)}) recomputed from the "
                       "records"),
    "other": lambda d: (f"{d.where} is {canonical.show(d.actual, 100)} in the receipt, "
                        f"{canonical.show(d.expected, 100)} recomputed from the records"),
}
"""How receipt verification says where a receipt differs from what the records give."""


# --- verifying -----------------------------------------------------------------------------------------------------


Trust = Literal["public-key", "embedded-key"]


@dataclass(frozen=True)
class ReceiptCheck:
    """What `verify_receipt` established."""

    decision: Decision
    signed: bool
    key_fingerprint: str | None
    key_checked: bool
    """True when the signature was checked against a public key the verifier supplied."""
    format: str = PREDICATE_TYPE
    """`PREDICATE_TYPE` for an in-toto receipt, `RECEIPT_SCHEMA` for one of the older layout."""

    @property
    def trust(self) -> Trust:
        return "public-key" if self.key_checked else "embedded-key"

    @property
    def warning(self) -> str | None:
        """What the verification does not show, when no trusted key was given."""
        if self.key_checked:
            return None
        if not self.signed:
            return "the receipt is not signed: anyone could have written it"
        return ("anyone could have signed it (checked only against the key the receipt carries); pass --public-key "
                "with the issuer's .pub to know who did")


@dataclass(frozen=True)
class _Signer:
    key: Ed25519PublicKey
    keyid: str
    value: bytes


def _choose_key(shape: _Shape, signer: _Signer | None, given: Ed25519PublicKey | None, public_key: Path | None,
                trust_embedded_key: bool) -> Ed25519PublicKey | None:
    """The key to check the signature with: the given one (which must be the signer's), or with
    `trust_embedded_key` the embedded one; None for an unsigned receipt the caller agreed to take unsigned."""
    if signer is None:
        if given is not None:
            raise InvarError(f"{shape.path}: the receipt is not signed, but --public-key asks for a signature; ask its "
                             "issuer for a signed receipt")
        if not trust_embedded_key:
            raise InvarError(f"{shape.path}: the receipt is not signed, so anyone could have written it; pass "
                             "--trust-embedded-key to verify what it states anyway")
        return None
    if given is not None:
        if fingerprint(given) != signer.keyid:
            raise InvarError(f"{shape.path}: signed by key {signer.keyid[:16]}…, not by the key in {public_key} "
                             f"({fingerprint(given)[:16]}…)")
        return given
    if not trust_embedded_key:
        raise InvarError(f"{shape.path}: signed by key {signer.keyid[:16]}…; pass --public-key with the issuer's .pub "
                         "file to check who signed it, or --trust-embedded-key to accept that anyone could have")
    return signer.key


def _embedded(shape: _Shape, raw: bytes, keyid: str, where: str, key_field: str, id_field: str) -> Ed25519PublicKey:
    if len(raw) != 32:
        shape.refuse(f"{where}.{key_field} holds {len(raw)} bytes, not the 32 of a raw Ed25519 public key")
    key = Ed25519PublicKey.from_public_bytes(raw)
    if fingerprint(key) != keyid:
        raise InvarError(f"{shape.path}: {where}.{id_field} is {keyid[:16]}…, but the embedded public key's sha256 is "
                         f"{fingerprint(key)[:16]}…: the signature names another key than it carries; do not trust "
                         "the receipt")
    return key


def _dsse(shape: _Shape, data: dict[str, Any]) -> tuple[bytes, _Signer | None]:
    """The envelope's payload bytes and its signer, every field checked."""
    env = shape.fields(data, "envelope", {"payload", "payloadType", "signatures"})
    kind = shape.text(env, "payloadType", "envelope")
    if kind != PAYLOAD_TYPE:
        shape.refuse(f"envelope.payloadType is {canonical.show(kind, 60)}, not {PAYLOAD_TYPE!r}")
    payload = shape.base64(env, "payload", "envelope")
    sigs = env["signatures"]
    if not isinstance(sigs, list):
        shape.refuse(f"envelope.signatures is a JSON {_type_name(sigs)}, not an array")
    if len(sigs) > 1:
        shape.refuse(f"envelope.signatures holds {len(sigs)} signatures; invar writes at most one")
    if not sigs:
        return payload, None
    where = "envelope.signatures[0]"
    sig = shape.fields(sigs[0], where, {"keyid", "publicKey", "sig"})
    keyid = shape.text(sig, "keyid", where, _HEX64, "a sha256 in 64 lowercase hex digits")
    raw = shape.base64(sig, "publicKey", where)
    value = shape.base64(sig, "sig", where)
    if len(value) != 64:
        shape.refuse(f"{where}.sig holds {len(value)} bytes, not the 64 of an Ed25519 signature")
    return payload, _Signer(_embedded(shape, raw, keyid, where, "publicKey", "keyid"), keyid, value)


def _statement_head(shape: _Shape, doc: Any) -> str:
    """Check the statement's layers (the predicate's fields are compared whole later) and return the run's head."""
    st = shape.fields(doc, "statement", {"_type", "subject", "predicateType", "predicate"})
    if shape.text(st, "_type", "statement") != STATEMENT_TYPE:
        shape.refuse(f"statement._type is {canonical.show(st['_type'], 60)}, not {STATEMENT_TYPE!r}")
    if shape.text(st, "predicateType", "statement") != PREDICATE_TYPE:
        shape.refuse(f"statement.predicateType is {canonical.show(st['predicateType'], 60)}, not {PREDICATE_TYPE!r} "
                     "(a receipt of another Invar?)")
    subject = st["subject"]
    if not isinstance(subject, list) or not subject:
        shape.refuse("statement.subject is not a non-empty array")
    for i, s in enumerate(subject):
        entry = shape.fields(s, f"statement.subject[{i}]", {"name", "digest"})
        shape.text(entry, "name", f"statement.subject[{i}]")
        digest = shape.fields(entry["digest"], f"statement.subject[{i}].digest", {"sha256"})
        shape.text(digest, "sha256", f"statement.subject[{i}].digest", _HEX64, "a sha256 in 64 lowercase hex digits")
    return _head(shape, st["predicate"], "statement.predicate")


def _head(shape: _Shape, body: Any, where: str) -> str:
    """The run's head a body states (its other fields are compared whole with what the records give)."""
    if not isinstance(body, dict):
        shape.refuse(f"{where} is a JSON {_type_name(body)}, not an object")
    if "run" not in body:
        shape.refuse(f"{where} lacks the field 'run'")
    part = shape.fields(body["run"], f"{where}.run", {"head", "records"})
    return shape.text(part, "head", f"{where}.run", _HEX64, "a chain head (64 lowercase hex digits)")


def _legacy(shape: _Shape, data: dict[str, Any]) -> tuple[dict[str, Any], _Signer | None]:
    """An `invar.receipt/1` receipt's body and signer, every field checked."""
    doc = shape.fields(data, "the receipt", {"receipt", "signature"})
    body = doc["receipt"]
    if not isinstance(body, dict) or body.get("schema") != RECEIPT_SCHEMA:
        shape.refuse(f"receipt.schema is not {RECEIPT_SCHEMA!r}")
    sig = doc["signature"]
    if sig is None:
        return body, None
    where = "signature"
    sig = shape.fields(sig, where, {"algorithm", "public_key", "public_key_sha256", "value"})
    if shape.text(sig, "algorithm", where) != "ed25519":
        shape.refuse(f"signature.algorithm is {canonical.show(sig['algorithm'], 40)}, not 'ed25519'")
    raw = shape.text(sig, "public_key", where, _HEX64, "a raw Ed25519 public key in 64 lowercase hex digits")
    keyid = shape.text(sig, "public_key_sha256", where, _HEX64, "a sha256 in 64 lowercase hex digits")
    value = shape.text(sig, "value", where, _HEX128, "an Ed25519 signature in 128 lowercase hex digits")
    key = _embedded(shape, bytes.fromhex(raw), keyid, where, "public_key", "public_key_sha256")
    return body, _Signer(key, keyid, bytes.fromhex(value))


def _check_signature(shape: _Shape, key: Ed25519PublicKey, signer: _Signer, signed: bytes) -> None:
    try:
        key.verify(signer.value, signed)
    except InvalidSignature:
        raise InvarError(f"{shape.path}: the signature does not match the receipt's contents: the receipt was "
                         "changed after it was signed (or signed by another key)") from None


def verify_receipt(receipt_path: Path, run: Path, contract: Path, public_key: Path | None = None, *,
                   trust_embedded_key: bool = False, progress: Callable[[Step], object] = lambda step: None
                   ) -> ReceiptCheck:
    """Check a receipt's envelope and signature, then recompute the decision from the run with the receipt's head as
    anchor and compare every field. Raises `InvarError` (naming what is wrong) unless everything matches.

    Strict by default: give `public_key` (the issuer's key, held independently), or `trust_embedded_key` to check the
    signature against the key the receipt carries (or to take an unsigned receipt), which shows only that the receipt
    is unchanged since whoever holds that key signed it. `progress` is told the phases of the recomputation (`admit`'s).
    """
    if public_key is not None and trust_embedded_key:
        raise InvarError("--public-key and --trust-embedded-key: give one; --public-key checks who signed, "
                         "--trust-embedded-key accepts that anyone could have")
    given = None if public_key is None else load_public_key(public_key)  # a bad key fails before the long part
    data = read_receipt(receipt_path)
    shape = _Shape(receipt_path)
    legacy = "receipt" in data and "payloadType" not in data
    if legacy:
        body, signer = _legacy(shape, data)
        key = _choose_key(shape, signer, given, public_key, trust_embedded_key)
        head = _head(shape, body, "receipt")
        if key is not None and signer is not None:
            try:
                signed = _canonical_json(body)
            except ValueError:
                shape.refuse("the receipt holds a number JSON cannot state")
            _check_signature(shape, key, signer, signed)
        decision = admit(contract, run, expect_head=head, progress=progress)
        diff = _first_difference(receipt_body(decision), body, "receipt")
    else:
        payload, signer = _dsse(shape, data)
        key = _choose_key(shape, signer, given, public_key, trust_embedded_key)
        if key is not None and signer is not None:  # DSSE: the signature is checked before the payload is parsed
            _check_signature(shape, key, signer, pae(PAYLOAD_TYPE, payload))
        doc = strict_json(payload, str(receipt_path), "the envelope's payload")
        head = _statement_head(shape, doc)
        decision = admit(contract, run, expect_head=head, progress=progress)
        expected = statement(decision, _decided_under(decision, contract))
        diff = _first_difference(expected, doc, "statement")
        if diff is None and payload != _canonical_json(expected):
            raise EvidenceError(f"{receipt_path}: the payload states what the records give, but not in canonical JSON "
                                "(sorted keys, no spaces, UTF-8) as invar writes it; do not trust the receipt")
    if diff is not None:
        raise EvidenceError(f"{receipt_path}: does not match the records: {diff}")
    return ReceiptCheck(decision, signed=signer is not None, key_fingerprint=None if signer is None else signer.keyid,
                        key_checked=given is not None, format=RECEIPT_SCHEMA if legacy else PREDICATE_TYPE)

