"""The arithmetic task: problems whose integer answers the core checks exactly, and their scorer.

Decisions this module embodies:

- **The answer comes from the prompt.** `score` parses the prompt (integers joined by `+`, `-`, `*`, ending in
  `=`; `*` binds tighter) and computes the answer itself, so scoring needs no lookup table and trusts no file.
- **Response format.** A response is the text the model generated after the prompt, cut at (and excluding) the
  first end-of-sequence token; `ModelTokenizer.decode` does that cut from token ids. It scores loss 0 exactly when it
  is the canonical decimal of the answer: an optional `-`, no leading zeros, nothing before or after it (no
  spaces, no newline, no special-token text). Anything else, including the empty response, is loss 1.
- **Generation is counter based.** Problem `i` of a stream is a pure function of (stream seed, `i`) through
  sha256, so the populations are the same bytes on every Python and numpy version.
- **Populations are samples.** A population file is the first draws of a stream, so its kinds follow the mix and
  a prompt may repeat under another id.
- **Disjoint by construction.** Every prompt belongs to exactly one split, `eval` or `train`, decided by a hash of
  its text. Evaluation populations draw only `eval` prompts and training draws only `train` prompts, so no seed or
  count can make them overlap.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

from invar.canonical import file_sha256
from invar.errors import ContractError

Split = Literal["eval", "train"]

SCORER_NAME = "arithmetic-exact"
"""The name contracts use for `score`."""

MAX_ANSWER_CHARS = 4
"""Longest answer any kind below produces (`999+999=` gives `1998`); a response budget of
`MAX_ANSWER_CHARS + 1` tokens always leaves room for the end-of-sequence token."""


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem: `prompt` is what the model sees, `answer` the canonical decimal it must emit."""

    id: str
    prompt: str
    answer: str
    kind: str


@dataclass(frozen=True)
class _Kind:
    name: str
    weight: int
    """Share of draws, in percent."""
    make: Callable[[list[int]], str]
    """Builds the prompt from uniform 32-bit words."""


def _pick(word: int, lo: int, hi: int) -> int:
    """An integer in [lo, hi] from a uniform 32-bit word (bias below 1e-6 for these ranges)."""
    return lo + word % (hi - lo + 1)


def _add(lo: int, hi: int) -> Callable[[list[int]], str]:
    def make(w: list[int]) -> str:
        return f"{_pick(w[0], lo, hi)}+{_pick(w[1], lo, hi)}="

    return make


def _sub(lo: int, hi: int) -> Callable[[list[int]], str]:
    """Larger minus smaller: answers are never negative."""

    def make(w: list[int]) -> str:
        a, b = _pick(w[0], lo, hi), _pick(w[1], lo, hi)
        return f"{max(a, b)}-{min(a, b)}="

    return make


def _mul(w: list[int]) -> str:
    small, large = _pick(w[0], 2, 9), _pick(w[1], 2, 99)
    return f"{small}*{large}=" if w[2] % 2 == 0 else f"{large}*{small}="


def _muladd(w: list[int]) -> str:
    return f"{_pick(w[0], 2, 9)}*{_pick(w[1], 2, 9)}+{_pick(w[2], 1, 99)}="


# The mix: two-digit items and small products a small model learns to get nearly always right, and three-digit
# items it often gets wrong, so sampling gives a real spread of right and wrong answers. Answers are never
# negative: measured here, allowing negative differences slowed the tiny model's learning of every kind several
# times over. Kinds with few distinct prompts (mul, sub2) are under-represented in a population of distinct
# prompts relative to these weights.
_KINDS: tuple[_Kind, ...] = (
    _Kind("add2", 25, _add(10, 99)),
    _Kind("sub2", 20, _sub(10, 99)),
    _Kind("mul", 15, _mul),
    _Kind("muladd", 10, _muladd),
    _Kind("add3", 15, _add(100, 999)),
    _Kind("sub3", 15, _sub(100, 999)),
)

KINDS: tuple[str, ...] = tuple(k.name for k in _KINDS)
"""The problem kinds, in the order of the mix."""

_PROMPT = re.compile(r"(0|[1-9][0-9]*)([-+*](0|[1-9][0-9]*))*=")
_TERM = re.compile(r"0|[1-9][0-9]*|[-+*]")
_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]*)")


def answer_of(prompt: str) -> int:
    """The integer value of an arithmetic prompt such as `"3*4+5="` (`*` before `+` and `-`, left to right).

    Raises `ContractError` when the prompt is not integers joined by `+`, `-`, `*` and ending in `=`.
    """
    if _PROMPT.fullmatch(prompt) is None:
        raise ContractError(
            f"prompt {prompt!r} is not an arithmetic problem: expected non-negative integers joined by "
            "'+', '-' or '*' and ending in '=', like '37+58='"
        )
    parts = _TERM.findall(prompt[:-1])
    # Sum of products: each '+'/'-' closes a product, '*' extends the current one.
    total, sign, product = 0, 1, int(parts[0])
    for op, value in zip(parts[1::2], parts[2::2], strict=True):
        if op == "*":
            product *= int(value)
        else:
            total += sign * product
            sign, product = (1 if op == "+" else -1), int(value)
    return total + sign * product


def score(prompt: str, response: str) -> int:
    """Task loss of one response: 0 if `response` is exactly the canonical decimal answer to `prompt`, else 1.

    `response` is the generated text after the prompt, already cut at the end-of-sequence token (see the module
    docstring for the exact format). Pure; raises `ContractError` only for a prompt that is not a problem.
    """
    return answer_loss(answer_of(prompt), response)


def answer_loss(expected: int, response: str) -> int:
    """`score` given the prompt's value `expected` (`answer_of`): 0 if `response` is exactly its canonical decimal."""
    if _CANONICAL_INT.fullmatch(response) is None or response == "-0":
        return 1
    return 0 if int(response) == expected else 1


SCORERS: Mapping[str, Callable[[str, str], int]] = {SCORER_NAME: score}
"""Scorers by the name a contract gives; each maps (prompt, response text) to a loss of 0 or 1."""


def split_of(prompt: str) -> Split:
    """The split a prompt belongs to: half of all prompts (by a sha256 of the text) are `eval`, the rest `train`."""
    return "eval" if hashlib.sha256(b"invar-arith-split/" + prompt.encode()).digest()[0] < 128 else "train"


def draw(seed: int, index: int) -> Problem:
    """Draw `index` of stream `seed`: a problem of a kind chosen by the mix, whatever its split.

    A pure function of (seed, index) through sha256; `id` is `"{seed}:{index}"`.
    """
    raw = hashlib.sha256(f"invar-arith/{seed}/{index}".encode()).digest()
    words = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, 32, 4)]
    roll = words[0] % 100
    for kind in _KINDS:
        if roll < kind.weight:
            prompt = kind.make(words[1:])
            return Problem(id=f"{seed}:{index}", prompt=prompt, answer=str(answer_of(prompt)), kind=kind.name)
        roll -= kind.weight
    raise AssertionError("the mix weights sum to 100")


def stream(split: Split, seed: int, start: int = 0) -> Iterator[Problem]:
    """The endless stream of draws of `seed` from index `start` on, keeping only prompts of `split`.

    The draws are independent, so a prompt may repeat. Training reads this stream directly.
    """
    index = start
    while True:
        problem = draw(seed, index)
        if split_of(problem.prompt) == split:
            yield problem
        index += 1


def population(split: Split, seed: int, count: int, id_prefix: str) -> list[Problem]:
    """The first `count` problems of `stream(split, seed)`, with ids `"{id_prefix}-{i:06d}"`.

    A population is an independent sample of the task's distribution, so its kinds follow the mix weights and a
    prompt may appear more than once (under different ids). Keeping only distinct prompts instead would exhaust
    the kinds with few distinct prompts (two-digit items, small products) and fill the population with
    three-digit items, far from the mix the model was trained on.
    """
    if count < 1:
        raise ContractError(f"population count must be at least 1, got {count}")
    return [
        Problem(id=f"{id_prefix}-{i:06d}", prompt=p.prompt, answer=p.answer, kind=p.kind)
        for i, p in enumerate(islice(stream(split, seed), count))
    ]


def population_bytes(problems: list[Problem]) -> bytes:
    """The canonical JSON-lines bytes of a population: one sorted-key object per line, `\\n` after each."""
    lines = [
        json.dumps({"id": p.id, "prompt": p.prompt, "answer": p.answer, "kind": p.kind},
                   sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        for p in problems
    ]
    return ("\n".join(lines) + "\n").encode("ascii")


def load_population(path: str | Path, expected_sha256: str) -> list[Problem]:
    """Read a population file, after checking its sha256 against `expected_sha256` (the declared digest).

    Every line must be `{"id", "prompt", "answer"[, "kind"]}` with a unique id and the answer `score` accepts.
    Raises `ContractError` naming the file and what to change on any mismatch.
    """
    path = Path(path)
    if not path.is_file():
        raise ContractError(f"population file {path} does not exist: point the declaration at the population file")
    actual = file_sha256(path)
    if actual != expected_sha256.lower():
        raise ContractError(
            f"population file {path} has sha256 {actual} but {expected_sha256} was declared: "
            "use the file the digest names, or declare this file's digest"
        )
    problems: list[Problem] = []
    ids: set[str] = set()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"population file {path} is not UTF-8 text (byte {exc.start}): write it as UTF-8 JSON "
                            "lines") from None
    except OSError as exc:
        raise ContractError(f"population file {path} cannot be read ({exc.strerror})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"population file {path} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ContractError(f"{where} is not JSON ({exc.msg}): write one JSON object per line") from None
        if not isinstance(row, dict) or not {"id", "prompt", "answer"} <= row.keys() <= {
            "id", "prompt", "answer", "kind"
        }:
            raise ContractError(f"{where}: expected an object with keys id, prompt, answer and optionally kind")
        if not all(isinstance(row[key], str) for key in row):
            raise ContractError(f"{where}: id, prompt, answer and kind must be strings")
        if row["id"] in ids:
            raise ContractError(f"{where}: id {row['id']!r} repeats an earlier line: give every problem its own id")
        ids.add(row["id"])
        if score(row["prompt"], row["answer"]) != 0:
            raise ContractError(
                f"{where}: answer {row['answer']!r} is not the canonical answer {answer_of(row['prompt'])} "
                f"to {row['prompt']!r}"
            )
        problems.append(Problem(id=row["id"], prompt=row["prompt"], answer=row["answer"], kind=row.get("kind", "")))
    if not problems:
        raise ContractError(f"population file {path} holds no problems")
    return problems
