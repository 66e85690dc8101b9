"""Reading the per-item scores another harness exported, and pairing the two sides item by item.

Decision: the core reads each format with the standard library (and `zstandard` for Inspect's compressed `.eval`
archives), not through the harness's own package: the harness is what made the scores, the reader is what checks
them, and a reader that imports lm-eval or Inspect would run their code on a file a person handed in. Each reader
returns the items in the file's order, each with the exporter's own id, a digest of its content (prompt and target)
and its score; every defect is one `EvidenceError` line naming the file and the item: a file too large, not a
regular file, truncated or not the format; an item without its id, score or content; a duplicated id; a score that
is not a finite number (or, for 0/1 losses, not 0 or 1). Pairing refuses an item one side lacks and an item whose
content differs between the sides.

lm-eval writes, per sample, `doc_id`, the request `arguments` (the prompt first), `target`, its own sha256 of each
(`prompt_hash`, `target_hash`) and each metric under its name; the reader recomputes both hashes, so a sample
edited after export is refused. Inspect writes each sample's `id`, `epoch`, `input`, `target` and `scores`
(`{scorer: {value}}`); its letter values mean what Inspect's `value_to_float` says (C 1, P 0.5, I and N 0).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar.errors import EvidenceError, one_line
from invar.imported.model import Source
from invar.owner_files import read_regular_file

MAX_EXPORT_BYTES = 1 << 28
"""An export file holds at most 256 MiB (an lm-eval sample or Inspect sample is a few kilobytes: a million items)."""
MAX_ITEMS = 1 << 20
"""Items an export holds."""
MAX_ENTRY_BYTES = 1 << 26
"""Bytes one entry of an Inspect `.eval` archive may hold once decompressed (64 MiB; a sample is kilobytes)."""
MAX_ARCHIVE_BYTES = 1 << 30
"""Bytes all of an Inspect `.eval` archive's entries the reader decompresses may hold together (1 GiB)."""
INSPECT_VALUES = {"C": 1.0, "P": 0.5, "I": 0.0, "N": 0.0}
"""Inspect's letter scores as its `value_to_float` maps them: correct, partial, incorrect, no answer."""


@dataclass(frozen=True)
class Item:
    """One scored item of an export."""

    key: str
    """The exporter's own id (lm-eval `doc_id`; Inspect `id`, with `#epoch` past the first epoch)."""
    content: str
    """sha256 of the item's prompt and target as the exporter recorded them (empty for a `table`)."""
    loss: float
    """The loss the declared mapping gives the exporter's score."""


@dataclass(frozen=True)
class Export:
    """One export file read: its digest and its items in the file's order."""

    path: Path
    sha256: str
    exporter: str
    """Who computed the scores, as the file says (`lm-evaluation-harness`, `inspect_ai 0.3.285`)."""
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Paired:
    """Both sides' losses, item by item in the reference export's order."""

    keys: tuple[str, ...]
    reference: tuple[float, ...]
    candidate: tuple[float, ...]


def _refuse(path: Path, text: str) -> EvidenceError:
    return EvidenceError(one_line(f"{path}: {text}"))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _loss(path: Path, where: str, score: Any, source: Source) -> float:
    """The loss of one score under the declared mapping, refusing what the decision cannot use."""
    if isinstance(score, bool):
        score = float(score)
    if not isinstance(score, int | float):
        raise _refuse(path, f"{where}: the score is {json.dumps(score)[:40]}, not a number; point the declaration "
                            "at the metric that holds the score")
    value = float(score)
    if not math.isfinite(value):
        raise _refuse(path, f"{where}: the score is {value}, not a finite number; the exporter failed on this item")
    loss = 1.0 - value if source.loss == "one-minus" else value
    if source.loss_range is None:
        if loss not in (0.0, 1.0):
            raise _refuse(path, f"{where}: the loss is {loss:g}, not 0 or 1; declare imported.loss_range = [a, b] "
                                "for graded scores")
    elif not source.loss_range[0] <= loss <= source.loss_range[1]:
        raise _refuse(path, f"{where}: the loss is {loss:g}, outside imported.loss_range "
                            f"[{source.loss_range[0]:g}, {source.loss_range[1]:g}]")
    return loss


def _json_lines(path: Path, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(path, f"not UTF-8 text (byte {exc.start:,}); give the file the exporter wrote") from None
    if text and not text.endswith("\n"):
        raise _refuse(path, "the last line has no end (the file is truncated); export it again")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise _refuse(path, f"line {number:,}: not JSON (a truncated or edited line); export it again") from None
        if not isinstance(obj, dict):
            raise _refuse(path, f"line {number:,}: not a JSON object; give the file the exporter wrote")
        yield number, obj


def _unique(path: Path, items: list[Item]) -> tuple[Item, ...]:
    seen: set[str] = set()
    for item in items:
        if item.key in seen:
            raise _refuse(path, f"item {item.key!r} appears twice; an export holds each item once")
        seen.add(item.key)
    if not items:
        raise _refuse(path, "holds no scored items; point the declaration at the export of the evaluation")
    if len(items) > MAX_ITEMS:
        raise _refuse(path, f"holds {len(items):,} items, over the {MAX_ITEMS:,} an export may hold")
    return tuple(items)


# --- lm-evaluation-harness ------------------------------------------------------------------------------------------


def _lm_eval_prompt(arguments: Any) -> str | None:
    """The request's first argument (the prompt) in lm-eval's two layouts: {"gen_args_0": {"arg_0": ...}} (0.4.5
    and later) and [[prompt, ...], ...] (earlier)."""
    if isinstance(arguments, dict):
        first = arguments.get("gen_args_0")
        prompt = first.get("arg_0") if isinstance(first, dict) else None
    elif isinstance(arguments, list) and arguments and isinstance(arguments[0], list) and arguments[0]:
        prompt = arguments[0][0]
    else:
        prompt = None
    return prompt if isinstance(prompt, str) else None


def read_lm_eval(path: Path, data: bytes, source: Source) -> list[Item]:
    """The samples of one lm-eval `samples_*.jsonl` under the declared filter."""
    assert source.metric is not None
    items: list[Item] = []
    for number, sample in _json_lines(path, data):
        where = f"line {number:,}"
        if sample.get("filter", "none") != source.filter:
            continue
        doc_id = sample.get("doc_id")
        if isinstance(doc_id, bool) or not isinstance(doc_id, int | str):
            raise _refuse(path, f"{where}: no doc_id; give the samples file lm-eval wrote with --log_samples")
        where = f"doc_id {doc_id}"
        prompt = _lm_eval_prompt(sample.get("arguments"))
        if prompt is None or "target" not in sample:
            raise _refuse(path, f"{where}: no prompt or target; give the samples file lm-eval wrote")
        target = str(sample["target"])
        for name, text in (("prompt_hash", prompt), ("target_hash", target)):
            if name in sample and sample[name] != _sha(text):
                raise _refuse(path, f"{where}: {name} is not the sha256 of the sample's {name[:-5]} (edited after "
                                    "export?); export it again")
        if source.metric not in sample:
            raise _refuse(path, f"{where}: no metric {source.metric!r}; name one of the sample's metrics "
                                f"({', '.join(map(str, sample.get('metrics', []))) or 'none listed'})")
        loss = _loss(path, where, sample[source.metric], source)
        items.append(Item(str(doc_id), _digest(prompt, target), loss))
    return items


# --- Inspect AI -------------------------------------------------------------------------------------------------------


def _inspect_item(path: Path, sample: Any, source: Source) -> Item:
    if not isinstance(sample, dict) or isinstance(sample.get("id"), bool) \
            or not isinstance(sample.get("id"), int | str):
        raise _refuse(path, "a sample has no id; give the log Inspect wrote")
    epoch = sample.get("epoch", 1)
    key = str(sample["id"]) if epoch == 1 else f"{sample['id']}#{epoch}"
    where = f"sample {key}"
    if sample.get("error"):
        raise _refuse(path, f"{where}: Inspect recorded an error for it; rerun the evaluation or retry the errors")
    scores = sample.get("scores")
    if not isinstance(scores, dict) or not isinstance(scores.get(source.metric), dict):
        names = ", ".join(scores) if isinstance(scores, dict) else "none"
        raise _refuse(path, f"{where}: no score {source.metric!r} (scorers: {names}); name the scorer in "
                            "imported.metric")
    value = scores[source.metric].get("value")
    if isinstance(value, str) and value in INSPECT_VALUES:
        value = INSPECT_VALUES[value]
    if "input" not in sample or "target" not in sample:
        raise _refuse(path, f"{where}: no input or target; give the log Inspect wrote")
    return Item(key, _digest(sample["input"], sample["target"]), _loss(path, where, value, source))


def _inspect_version(log: Mapping[str, Any]) -> str:
    version = log.get("eval", {}).get("packages", {}).get("inspect_ai") if isinstance(log.get("eval"), dict) \
        else None
    return f"inspect_ai {version}" if isinstance(version, str) else "inspect_ai"


def _check_status(path: Path, header: Any) -> None:
    status = header.get("status") if isinstance(header, dict) else None
    if status != "success":
        raise _refuse(path, f"the evaluation's status is {json.dumps(status)}, not \"success\" (it stopped or failed "
                            "before scoring every sample); decide from a finished evaluation")


def _read_entry(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: list[int]) -> Any:
    if info.file_size > MAX_ENTRY_BYTES or info.file_size > budget[0]:
        raise _refuse(path, f"entry {info.filename} would hold {info.file_size:,} bytes, over what a log entry "
                            "may hold; give the log Inspect wrote")
    if info.compress_type == 93:  # zstd, which Inspect writes and the standard zipfile cannot read
        try:
            import zstandard
        except ImportError:
            raise _refuse(path, "is compressed with zstd; install invar[evals] (zstandard) to read it") from None
        raw = archive.fp
        assert raw is not None
        raw.seek(info.header_offset)
        header = raw.read(30)
        offset = info.header_offset + 30 + int.from_bytes(header[26:28], "little") \
            + int.from_bytes(header[28:30], "little")
        raw.seek(offset)
        compressed = raw.read(info.compress_size)
        try:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed)) as reader:
                data = reader.read(info.file_size + 1)
        except zstandard.ZstdError:
            raise _refuse(path, f"entry {info.filename} is damaged; export the log again") from None
    else:
        try:
            with archive.open(info) as f:
                data = f.read(info.file_size + 1)
        except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError):
            raise _refuse(path, f"entry {info.filename} is damaged; export the log again") from None
    if len(data) != info.file_size:
        raise _refuse(path, f"entry {info.filename} is not the size the archive states; export the log again")
    budget[0] -= len(data)
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise _refuse(path, f"entry {info.filename} is not JSON; export the log again") from None


def read_inspect(path: Path, data: bytes, source: Source) -> tuple[list[Item], str]:
    """The samples of one Inspect log: a `.eval` archive (zip of `header.json` and `samples/*.json`) or a `.json`
    log (one object with `status`, `eval` and `samples`). Returns the items and who computed them."""
    if data[:4] == b"PK\x03\x04":
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile:
            raise _refuse(path, "is not a complete .eval archive (truncated?); export the log again") from None
        with archive:
            entries = {info.filename: info for info in archive.infolist()}
            if "header.json" not in entries:
                raise _refuse(path, "has no header.json: the evaluation did not finish; decide from a finished log")
            budget = [MAX_ARCHIVE_BYTES]
            header = _read_entry(path, archive, entries["header.json"], budget)
            _check_status(path, header)
            names = sorted(n for n in entries if n.startswith("samples/") and n.endswith(".json"))
            if len(names) > MAX_ITEMS:
                raise _refuse(path, f"holds {len(names):,} samples, over the {MAX_ITEMS:,} an export may hold")
            items = [_inspect_item(path, _read_entry(path, archive, entries[n], budget), source) for n in names]
        return items, _inspect_version(header)
    try:
        log = json.loads(data)
    except (ValueError, RecursionError):
        raise _refuse(path, "is neither a .eval archive nor a JSON log (truncated?); export the log again") from None
    _check_status(path, log)
    samples = log.get("samples")
    if not isinstance(samples, list):
        raise _refuse(path, "holds no samples; export the log with its samples")
    return [_inspect_item(path, s, source) for s in samples], _inspect_version(log)


# --- a plain table ----------------------------------------------------------------------------------------------------


def read_table(path: Path, data: bytes, source: Source) -> tuple[list[Item], list[Item]]:
    """`id, reference_loss, candidate_loss` per line, as JSONL (one object per line) or CSV (with that header).
    Returns the reference's items and the candidate's, in the file's order."""
    rows: list[tuple[str, Any, Any]] = []
    if data.lstrip()[:1] == b"{":
        for number, obj in _json_lines(path, data):
            missing = [k for k in ("id", "reference_loss", "candidate_loss") if k not in obj]
            if missing or isinstance(obj["id"], bool) or not isinstance(obj["id"], int | str):
                raise _refuse(path, f"line {number:,}: needs id, reference_loss and candidate_loss")
            rows.append((str(obj["id"]), obj["reference_loss"], obj["candidate_loss"]))
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(path, f"not UTF-8 text (byte {exc.start:,}); give the table as UTF-8") from None
        reader = csv.reader(io.StringIO(text))
        header = next(reader, None)
        if header != ["id", "reference_loss", "candidate_loss"]:
            raise _refuse(path, "the first line must be the header id,reference_loss,candidate_loss")
        for number, row in enumerate(reader, 2):
            if len(row) != 3:
                raise _refuse(path, f"line {number:,}: has {len(row)} fields, not 3 (truncated?)")
            rows.append((row[0], _number(path, number, row[1]), _number(path, number, row[2])))
    ref = [Item(key, "", _loss(path, f"id {key} reference_loss", r, source)) for key, r, _ in rows]
    cand = [Item(key, "", _loss(path, f"id {key} candidate_loss", c, source)) for key, _, c in rows]
    return ref, cand


def _number(path: Path, line: int, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _refuse(path, f"line {line:,}: {text[:20]!r} is not a number") from None


# --- reading and pairing ---------------------------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    """The bytes of one export, refused in one line if it is not a regular file of at most MAX_EXPORT_BYTES."""
    return read_regular_file(path, "export", limit=MAX_EXPORT_BYTES, error=EvidenceError,
                             fix="point the declaration at the file the exporter wrote")


def read_exports(source: Source, files: Mapping[str, tuple[Path, bytes, str]]) -> dict[str, Export]:
    """The exports by role (`reference`, `candidate`), from `files`: role → (path, bytes, sha256)."""
    if source.format == "table":
        path, data, sha = files["table"]
        ref, cand = read_table(path, data, source)
        return {"reference": Export(path, sha, "the table's author", _unique(path, ref)),
                "candidate": Export(path, sha, "the table's author", _unique(path, cand))}
    out: dict[str, Export] = {}
    for role in ("reference", "candidate"):
        path, data, sha = files[role]
        if source.format == "lm-eval":
            items, exporter = read_lm_eval(path, data, source), "lm-evaluation-harness"
        else:
            items, exporter = read_inspect(path, data, source)
        out[role] = Export(path, sha, exporter, _unique(path, items))
    return out


def pair(reference: Export, candidate: Export) -> Paired:
    """Both sides item by item, in the reference's order: every item on both sides with the same content."""
    theirs = {item.key: item for item in candidate.items}
    ours = {item.key for item in reference.items}
    for item in candidate.items:
        if item.key not in ours:
            raise EvidenceError(one_line(f"item {item.key!r} is in the candidate's export {candidate.path} but not in "
                                         f"the reference's {reference.path}; export the same items on both sides"))
    keys: list[str] = []
    ref: list[float] = []
    cand: list[float] = []
    for item in reference.items:
        other = theirs.get(item.key)
        if other is None:
            raise EvidenceError(one_line(f"item {item.key!r} is in the reference's export {reference.path} but not in "
                                         f"the candidate's {candidate.path}; export the same items on both sides"))
        if other.content != item.content:
            raise EvidenceError(one_line(f"item {item.key!r} has a different prompt or target in {candidate.path} "
                                         f"than in {reference.path}; pair exports of the same task and data"))
        keys.append(item.key)
        ref.append(item.loss)
        cand.append(other.loss)
    return Paired(tuple(keys), tuple(ref), tuple(cand))


__all__ = [
    "INSPECT_VALUES",
    "MAX_EXPORT_BYTES",
    "Export",
    "Item",
    "Paired",
    "pair",
    "read_bytes",
    "read_exports",
    "read_inspect",
    "read_lm_eval",
    "read_table",
]
