"""Independent calls spread over the machine's cores, for the commands that opt in.

The statistics call `map_calls` wherever their work splits into independent pieces (several methods to plan, two
exact power evaluations, the blocks of a simulation), and it runs them in order in this process: the statistics
stay pure functions with no process of their own. A command that wants the cores (`invar use plan`) runs its work
inside `forked()`, and then `map_calls` runs the pieces in forked processes, one per core. The results are the same
numbers either way, in the same order: each piece is a pure function of its arguments.

A command may also opt in to helper processes of a reader's own (`helper()`): `use admit`, `use verify` and
`compare numerical RUN` let the run store check its records' bytes in a second process while this one binds and
scores them (`invar.records.store`), and do three pieces of their work half here, half in a forked process
(`in_halves`): the plan's call digests, its units' sampling seeds, and the scoring of the responses once the pass
ends; what they print is the same either way.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar, cast

T = TypeVar("T")
Item = TypeVar("Item")

_ENABLED = [False]  # set by `forked()`; a forked worker inherits it
_HELPER = [False]  # set by `helper()`
_PENDING: list[Callable[[], object]] = []  # the calls the next pool's workers run (they see them by fork)
_CALLS: list[Callable[[], object]] = []  # in a worker: the calls its pool was started for
_DEPTH = [0]  # 0: the main process; 1: a worker; 2: a worker's worker


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


@contextlib.contextmanager
def forked() -> Iterator[None]:
    """Within this block, `map_calls` may fork one process per core."""
    before = _ENABLED[0]
    _ENABLED[0] = True
    try:
        yield
    finally:
        _ENABLED[0] = before


@contextlib.contextmanager
def helper() -> Iterator[None]:
    """Within this block, a reader may fork helper processes of its own where there are several cores
    (`helper_allowed`): the run store's checking process and `in_halves`' second half, which `use admit` and `use
    verify` opt in to. Nothing else forks (`map_calls` still runs in this process)."""
    before = _HELPER[0]
    _HELPER[0] = True
    try:
        yield
    finally:
        _HELPER[0] = before


def helper_allowed() -> bool:
    """Whether the running command opted in to a helper process (`helper()`) or to the cores (`forked()`), and this
    process may fork one: the main process, on a machine with several cores, where fork exists."""
    return (_HELPER[0] or _ENABLED[0]) and _DEPTH[0] == 0 and cores() >= 2 and hasattr(os, "fork") and \
        not multiprocessing.current_process().daemon


_PATIENCE_S = 60.0
"""How long `in_halves` waits for its helper beyond twice the time its own half took."""


def fork_writer(body: Callable[[int], None]) -> tuple[int, int] | None:
    """A forked helper process running `body` on the write end of a new pipe: its pid and the read end, or None where
    no pipe or process could be made. The helper ends when `body` returns (exit status 0) or raises (1), without
    running this process's exit handlers, and forks no helper of its own."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the helper: it ends here, whatever happens
        code = 1
        try:
            os.close(read)
            _DEPTH[0] = 1
            body(write)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def kill_and_reap(pid: int) -> None:
    """End a helper process, done or not, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def in_halves(compute: Callable[[Sequence[Item]], list[T]], items: Sequence[Item]) -> list[T]:
    """`compute(items)`, a pure function computed item by item: where `helper_allowed`, the second half of `items` in
    a forked process while this one computes the first, else all here. A second half the process does not give back
    whole (it raised, died, was killed, or stayed silent far longer than this process's half took) is computed here
    again, so an exception is raised here, at the same item, as if all were computed here. The results travel back
    pickled."""
    half = len(items) // 2
    if half < 1 or not helper_allowed():
        return compute(items)

    def second_half(write: int) -> None:
        out = memoryview(pickle.dumps(compute(items[half:]), protocol=pickle.HIGHEST_PROTOCOL))
        while out:
            out = out[os.write(write, out):]

    started = fork_writer(second_half)
    if started is None:
        return compute(items)
    pid, read = started
    data = bytearray()
    status = 1 << 8  # an exit status of 1: what a helper not reaped here counts as
    try:
        start = time.monotonic()
        first = compute(items[:half])
        # A helper silent for twice as long as this half took, and _PATIENCE_S more (stopped, or starved on a busy
        # machine), is not waited for: its half is computed here.
        patience = _PATIENCE_S + 2 * (time.monotonic() - start)
        ended = False
        with contextlib.suppress(OSError):
            while select.select([read], [], [], patience)[0]:
                chunk = os.read(read, 1 << 20)
                if not chunk:
                    ended = True
                    break
                data += chunk
        if ended:
            _, status = os.waitpid(pid, 0)
            pid = 0
    finally:
        os.close(read)
        if pid:  # this half raised, or the helper was not waited for: its work is not wanted
            kill_and_reap(pid)
    second = pickle.loads(data) if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and data else None
    if not isinstance(second, list) or len(second) != len(items) - half:
        second = compute(items[half:])
    return first + second


def _run_pending(index: int) -> object:
    return _CALLS[index]()


def _start_worker(depth: int) -> None:
    _CALLS[:] = _PENDING
    _PENDING.clear()
    _DEPTH[0] = depth


def map_calls(calls: Sequence[Callable[[], T]], done: Callable[[int, T], None] | None = None) -> list[T]:
    """The results of `calls`, in order: computed in forked processes (one per core) inside `forked()` where there
    are several cores and calls, in this process otherwise. The calls reach the workers by fork, not by pickling
    (closures are fine); their results are pickled back, and their side effects stay in the workers. A worker may
    use workers of its own (so a core whose piece is done helps with another's), theirs may not. `done(i, result)`
    is called in this process as each call ends, in the order they end (to show progress)."""
    workers = min(len(calls), cores())
    if (
        not _ENABLED[0]
        or workers < 2
        or _DEPTH[0] >= 2
        or _PENDING
        or multiprocessing.current_process().daemon  # a daemonic process may not start children
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        results: list[T] = []
        for i, call in enumerate(calls):
            results.append(call())
            if done is not None:
                done(i, results[-1])
        return results
    _PENDING.extend(calls)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_start_worker, initargs=(_DEPTH[0] + 1,)
        ) as pool:
            futures = [pool.submit(_run_pending, i) for i in range(len(calls))]
            if done is not None:
                index = {future: i for i, future in enumerate(futures)}
                for future in as_completed(futures):
                    done(index[future], cast(T, future.result()))
            return [cast(T, future.result()) for future in futures]
    finally:
        _PENDING.clear()
