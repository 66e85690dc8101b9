"""Decision receipts: what a `use admit` decided, bound to the run's head, optionally signed with Ed25519.

A run's records prove nothing about a forger who rewrites a report and recomputes every digest after it: the chain
is only as good as an anchor kept outside the store. A receipt is that anchor, written at decision time: the
contract's sha256, the run's head and record count, the plan, decision and bound versions, the answer and the
figures it rests on. `verify_receipt` recomputes the decision from the records with the head as the expected anchor,
so a re-chained, cut or extended run, another contract or another answer are all refused, naming what differs.

A signature says who issued the receipt. Its key pair is Ed25519 (`cryptography`); the signed bytes are the
receipt body as canonical JSON (sorted keys, no spaces, UTF-8), so anyone can re-derive them. Without a public key
that the verifier holds independently, a signature only shows that the receipt was not changed since it was signed
by whoever holds the embedded key; `verify_receipt` says which of the two was checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from invar import canonical
from invar.contract.admit import Decision, admit
from invar.errors import EvidenceError, InvarError
from invar.owner_files import read_regular_file

RECEIPT_SCHEMA = "invar.receipt/1"
"""Names the receipt's layout and the signed bytes' derivation; a receipt of another schema is refused."""

MAX_RECEIPT_BYTES = 1 << 20
MAX_KEY_BYTES = 64 * 1024


def _canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def receipt_body(decision: Decision) -> dict[str, Any]:
    """The receipt's body for a decision: everything `verify_receipt` recomputes and compares. Pure."""
    d = decision.to_json()
    bound = d["bound"]
    body: dict[str, Any] = {
        "schema": RECEIPT_SCHEMA,
        "contract": d["contract"],
        "run": {"head": decision.chain_head, "records": decision.records},
        "plan_version": d["plan_version"],
        "decision_version": d["decision_version"],
        "method": None if bound is None else {"name": bound["method"], "version": bound["version"]},
        "answer": d["answer"],
        "reason": d["reason"],
        "figures": {
            "standard": d["standard"],
            "epsilon": d["epsilon"],
            "delta": d["delta"],
            "task_loss": d["task_loss"],
            "bound": None if bound is None else {k: bound[k] for k in ("n", "delta", "estimate", "lower", "upper")},
            "invariance": {k: d["invariance"][k] for k in ("required", "layouts", "holds", "units_differing")},
            "premises_held": [p["holds"] for p in d["premises"]],
        },
        "evidence": canonical.digest([[e["call"], e["call_digest"], e["report_digest"]] for e in d["evidence"]]),
    }
    if "sequential" in d:  # plan /4 only, so receipts of fixed-n decisions keep their bytes
        seq = d["sequential"]
        body["figures"]["sequential"] = {k: seq[k] for k in ("version", "answer", "look", "stop", "n_max")}
    return body


# --- keys ----------------------------------------------------------------------------------------------------------


def fingerprint(public: Ed25519PublicKey) -> str:
    """sha256 of the raw 32-byte public key, hex: how receipts and messages name a key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return canonical.sha256(raw)


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


# --- writing and verifying ---------------------------------------------------------------------------------------


def make_receipt(decision: Decision, key: Ed25519PrivateKey | None = None) -> dict[str, Any]:
    """The receipt of `decision`: its body, and a signature over the body's canonical JSON when a key is given."""
    body = receipt_body(decision)
    signature = None
    if key is not None:
        signature = {"algorithm": "ed25519", "public_key_sha256": fingerprint(key.public_key()),
                     "public_key": key.public_key().public_bytes(serialization.Encoding.Raw,
                                                                 serialization.PublicFormat.Raw).hex(),
                     "value": key.sign(_canonical_json(body)).hex()}
    return {"receipt": body, "signature": signature}


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


@dataclass(frozen=True)
class ReceiptCheck:
    """What `verify_receipt` established."""

    decision: Decision
    signed: bool
    key_fingerprint: str | None
    key_checked: bool
    """True when the signature was checked against a public key the verifier supplied."""

    def to_json(self) -> dict[str, Any]:
        return {"verified": True, "answer": self.decision.answer.value, "chain_head": self.decision.chain_head,
                "contract_sha256": self.decision.contract_sha256, "signed": self.signed,
                "key_sha256": self.key_fingerprint, "key_checked": self.key_checked}


def _first_difference(expected: Any, actual: Any, where: str) -> str | None:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for k in sorted(set(expected) | set(actual)):
            found = _first_difference(expected.get(k), actual.get(k), f"{where}.{k}")
            if found:
                return found
        return None
    if expected != actual:
        return f"{where} is {actual!r} in the receipt, {expected!r} recomputed from the records"
    return None


def read_receipt(path: Path) -> dict[str, Any]:
    raw = read_regular_file(path, "receipt", limit=MAX_RECEIPT_BYTES, error=InvarError,
                            fix="give the file `use admit --receipt` wrote")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvarError(f"{path}: not a JSON receipt ({exc}); give the file `use admit --receipt` wrote") from None
    if not isinstance(data, dict) or not isinstance(data.get("receipt"), dict) \
            or data["receipt"].get("schema") != RECEIPT_SCHEMA:
        raise InvarError(f"{path}: not an {RECEIPT_SCHEMA} receipt; give the file `use admit --receipt` wrote")
    return data


def verify_receipt(receipt_path: Path, run: Path, contract: Path, public_key: Path | None = None) -> ReceiptCheck:
    """Recompute the decision from the run with the receipt's head as anchor, compare every field, check the
    signature. Raises `InvarError` (naming what differs) unless everything matches."""
    data = read_receipt(receipt_path)
    given = None if public_key is None else load_public_key(public_key)  # a bad key fails before the long part
    body = data["receipt"]
    run_part = body.get("run")
    head = run_part.get("head") if isinstance(run_part, dict) else None
    if not isinstance(head, str):
        raise InvarError(f"{receipt_path}: the receipt names no run head; give the file `use admit --receipt` wrote")
    decision = admit(contract, run, expect_head=head)
    expected = receipt_body(decision)
    diff = _first_difference(expected, body, "receipt")
    if diff is not None:
        raise EvidenceError(f"{receipt_path}: does not match the records: {diff}")
    sig = data.get("signature")
    if sig is None:
        if public_key is not None:
            raise InvarError(f"{receipt_path}: the receipt is not signed, but --public-key asks for a signature; "
                             "ask its issuer for a signed receipt")
        return ReceiptCheck(decision, signed=False, key_fingerprint=None, key_checked=False)
    if not isinstance(sig, dict) or sig.get("algorithm") != "ed25519" or not isinstance(sig.get("value"), str) \
            or not isinstance(sig.get("public_key"), str):
        raise InvarError(f"{receipt_path}: malformed signature; expected algorithm ed25519 with public_key and value")
    try:
        embedded = Ed25519PublicKey.from_public_bytes(bytes.fromhex(sig["public_key"]))
        value = bytes.fromhex(sig["value"])
    except ValueError:
        raise InvarError(f"{receipt_path}: malformed signature: public_key and value must be hex") from None
    key = embedded
    if given is not None:
        key = given
        if fingerprint(key) != fingerprint(embedded):
            raise InvarError(f"{receipt_path}: signed by key {fingerprint(embedded)[:16]}…, not by the key in "
                             f"{public_key} ({fingerprint(key)[:16]}…)")
    try:
        key.verify(value, _canonical_json(body))
    except InvalidSignature:
        raise InvarError(f"{receipt_path}: the signature does not match the receipt's contents: the receipt was "
                         "changed after it was signed") from None
    return ReceiptCheck(decision, signed=True, key_fingerprint=fingerprint(key), key_checked=public_key is not None)
