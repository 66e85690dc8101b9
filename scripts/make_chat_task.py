"""Write the chat task for the real model (SmolLM2-135M-Instruct) into data/, with its sha256 files.

    python scripts/make_chat_task.py [--out data] [--check]

Each unit is a chat: a short system message, two worked examples of the same kind as earlier user/assistant turns
(each answered "The answer is N."), then the question. Every answer is a whole number, so one scorer reads them all:
`numeric` with `which = "last"` (the last number of the reply). The kinds:

- `add`: one-digit addition, "What is 14 + 7?" (a in 1..99, b in 1..9);
- `next`: the next number of an arithmetic sequence, "What number comes next: 3, 7, 11, 15, ?" (start 1..99,
  step 1..9, four terms shown);
- `count`: letter counting, "How many times does the letter "s" appear in "glasses"?" (common words; the letter
  is one of the word's in three cases of four, else one it lacks, whose answer is 0);
- `lookup`: a fact from a table the unit ships, "Price list: apple 12, ... How much does a pear cost?" (five items
  with prices 2..99 drawn per unit).

`data/chat-eval.jsonl` holds 400 units (100 per kind, seed 1), `data/chat-train.jsonl` 2,000 (500 per kind, seed
2). The splits are disjoint: a question (the last user message) used by an evaluation unit is never a training
question. Both files are written from fixed seeds, so every run gives the same bytes; `--check` rebuilds in memory
and fails if the committed files differ. Each file's digest is written beside it as `<name>.sha256` in `sha256sum`
format.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from build_task_data import write_or_check  # this folder's: one way to write a population and its sha256

KINDS: tuple[str, ...] = ("add", "next", "count", "lookup")
SYSTEM = "You are a careful assistant. Answer with one number."
SHOTS = 2
NEWLINE = b"\n"

WORDS: tuple[str, ...] = (
    "apple", "banana", "letter", "coffee", "balloon", "bottle", "school", "summer", "kitten", "rabbit",
    "pepper", "window", "yellow", "garden", "doctor", "mirror", "butter", "cherry", "paper", "little",
    "happy", "grass", "glasses", "tomato", "potato", "orange", "button", "dinner", "common", "sweet",
    "street", "green", "cookie", "puppy", "tennis", "river", "silver", "sister", "banner", "hello",
    "pizza", "jelly", "bubble", "carrot", "teacher", "middle", "flower", "travel", "season", "possess",
    "rocket", "planet", "marble", "pillow", "ladder", "basket", "saucer", "forest", "island", "jacket",
    "monkey", "parrot", "pocket", "saddle", "ticket", "valley", "wallet", "zipper", "anchor", "bridge",
    "castle", "dragon", "engine", "finger", "hammer", "kettle", "melon", "market", "needle", "office",
    "pebble", "puzzle", "rubber", "shadow", "tunnel", "velvet", "winter", "attic", "cotton", "goose",
    "moon", "spoon", "book", "tree", "sheep", "toffee", "giraffe", "umbrella", "elephant", "library",
    "chocolate", "mississippi", "cassette", "address", "success", "committee", "raccoons", "accept", "horse", "cabbage",
    "summit", "muffin", "lobster", "napkin", "orchard", "pumpkin", "quarrel", "raccoon", "scissors", "tissue",
    "village", "waffle", "yogurt", "zebra", "beetle", "cinnamon", "dessert", "eagle", "falcon", "gallery",
)
ITEMS: tuple[str, ...] = (
    "apple", "pear", "lemon", "bread", "cheese", "milk", "rice", "tea", "soap", "candle",
    "pencil", "book", "lamp", "chair", "towel", "plate", "spoon", "cup", "hat", "shirt",
)

Exchange = tuple[str, int]
"""A question and its answer."""


def _add(rng: random.Random) -> Exchange:
    a, b = rng.randint(1, 99), rng.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def _next(rng: random.Random) -> Exchange:
    start, step = rng.randint(1, 99), rng.randint(1, 9)
    terms = ", ".join(str(start + i * step) for i in range(4))
    return f"What number comes next: {terms}, ?", start + 4 * step


def _count(rng: random.Random) -> Exchange:
    word = rng.choice(WORDS)
    present = sorted(set(word))
    absent = [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in present]
    letter = rng.choice(absent if rng.random() < 0.25 else present)
    return f'How many times does the letter "{letter}" appear in "{word}"?', word.count(letter)


def _lookup(rng: random.Random) -> Exchange:
    items = rng.sample(ITEMS, 5)
    prices = [rng.randint(2, 99) for _ in items]
    table = ", ".join(f"{item} {price}" for item, price in zip(items, prices, strict=True))
    k = rng.randrange(5)
    return f"Price list: {table}. How much does the {items[k]} cost?", prices[k]


MAKERS: dict[str, Callable[[random.Random], Exchange]] = {
    "add": _add, "next": _next, "count": _count, "lookup": _lookup,
}


def _reply(answer: int) -> str:
    return f"The answer is {answer}."


def _units(kind: str, rng: random.Random, count: int, banned: set[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """`count` units of `kind`, each a question not in `banned` nor earlier in this run (added to `banned`)."""
    make = MAKERS[kind]
    made = tries = 0
    while made < count:
        tries += 1
        if tries > 100 * count:
            raise RuntimeError(f"kind {kind}: too few distinct questions for {count} units")
        question, answer = make(rng)
        if question in banned:
            continue
        shots: list[Exchange] = []
        while len(shots) < SHOTS:
            shot = make(rng)
            if shot[0] != question and shot[0] not in (s[0] for s in shots):
                shots.append(shot)
        banned.add(question)
        messages = [{"role": "system", "content": SYSTEM}]
        for q, a in shots:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": _reply(a)}]
        messages.append({"role": "user", "content": question})
        made += 1
        yield question, {"answer": str(answer), "kind": kind, "messages": messages}


def population(split: str, seed: int, per_kind: int, banned: set[str]) -> list[dict[str, Any]]:
    """The units of a split: `per_kind` of each kind, interleaved (add, next, count, lookup, add, …)."""
    rng = random.Random(f"invar.chat-task/1:{split}:{seed}")
    columns = [[row for _, row in _units(kind, rng, per_kind, banned)] for kind in KINDS]
    rows: list[dict[str, Any]] = []
    for i in range(per_kind):
        for column in columns:
            rows.append({"id": f"{split}-{len(rows):05d}", **column[i]})
    return rows


def population_bytes(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode() + b"\n"
                    for row in rows)


POPULATIONS: tuple[tuple[str, str, int, int], ...] = (
    # (file stem, split, seed, units per kind); eval first, so train avoids its questions
    ("chat-eval", "eval", 1, 100),
    ("chat-train", "train", 2, 500),
)


def build() -> dict[str, bytes]:
    """Each file stem's bytes."""
    banned: set[str] = set()
    return {stem: population_bytes(population(split, seed, per_kind, banned))
            for stem, split, seed, per_kind in POPULATIONS}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data")
    parser.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = parser.parse_args()
    ok = True
    for stem, data in build().items():
        ok &= write_or_check(args.out, stem, data, args.check, f"{data.count(NEWLINE)} units")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
