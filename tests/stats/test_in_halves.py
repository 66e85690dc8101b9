"""`invar.parallel.in_halves`: a pure item-by-item computation split between this process and one forked helper
(`use admit` derives a plan's call digests so) gives what computing it here gives, raises what computing it here
raises at the same item, and leaves no process behind."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence

import pytest

from invar import parallel

pytestmark = pytest.mark.skipif(parallel.cores() < 2, reason="one core: in_halves computes everything in-process")


def _digests(items: Sequence[int]) -> list[str]:
    return [hashlib.sha256(str(i).encode()).hexdigest() for i in items]


def _children() -> set[int]:
    """This process's live children (a reaped helper is gone from /proc)."""
    own = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[1] == own:
                        found.add(int(entry))
            except OSError:
                continue
    return found


def test_the_halves_give_what_one_process_gives() -> None:
    items = list(range(5001))
    before = _children()
    with parallel.helper():
        split = parallel.in_halves(_digests, items)
    assert split == _digests(items)
    assert parallel.in_halves(_digests, items) == split  # outside helper(): all here
    assert _children() == before


def test_the_helper_computes_the_second_half() -> None:
    parent = os.getpid()

    def where(items: Sequence[int]) -> list[tuple[int, bool]]:
        return [(i, os.getpid() == parent) for i in items]

    with parallel.helper():
        got = parallel.in_halves(where, list(range(10)))
    assert [i for i, _ in got] == list(range(10))
    assert [here for _, here in got] == [True] * 5 + [False] * 5


def test_a_refusal_in_the_second_half_is_raised_here_at_the_same_item() -> None:
    def refuse(items: Sequence[int]) -> list[int]:
        for i in items:
            if i in (7, 9):
                raise ValueError(f"item {i} refused")
        return list(items)

    before = _children()
    with parallel.helper(), pytest.raises(ValueError, match=r"^item 7 refused$"):
        parallel.in_halves(refuse, list(range(10)))
    assert _children() == before


def test_a_refusal_in_the_first_half_is_raised_and_the_helper_reaped() -> None:
    def refuse(items: Sequence[int]) -> list[int]:
        if 0 in items:
            raise ValueError("item 0 refused")
        return list(items)

    before = _children()
    with parallel.helper(), pytest.raises(ValueError, match=r"^item 0 refused$"):
        parallel.in_halves(refuse, list(range(100)))
    assert _children() == before


def test_a_helper_that_dies_is_made_up_for_here() -> None:
    parent = os.getpid()

    def die_in_helper(items: Sequence[int]) -> list[int]:
        if os.getpid() != parent:
            os._exit(3)  # killed, say, for memory
        return [i * 2 for i in items]

    with parallel.helper():
        assert parallel.in_halves(die_in_helper, list(range(9))) == [i * 2 for i in range(9)]


def test_a_helper_that_hangs_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = os.getpid()

    def hang_in_helper(items: Sequence[int]) -> list[int]:
        if os.getpid() != parent:
            time.sleep(3600)  # stopped, say, or starved
        return [i + 1 for i in items]

    monkeypatch.setattr(parallel, "_PATIENCE_S", 0.5)
    before = _children()
    start = time.monotonic()
    with parallel.helper():
        assert parallel.in_halves(hang_in_helper, list(range(9))) == [i + 1 for i in range(9)]
    assert time.monotonic() - start < 30
    assert _children() == before  # killed and reaped
