"""The one concurrency kit every command drives its workers with: start them together, hold every call until each
worker's identity is checked and its model loaded, let calls through a gate, halt on the first failure, give the
calls under way a grace at a signal, replace a lost worker.

Decisions:
- **One thread per worker slot; the first failure halts all.** A halt sets the stop flag and breaks every barrier,
  so no thread waits for a worker that will never come; a thread released that way is not a failure of its own.
- **No call after a halt.** A call waits its turn at the gate and checks the stop flag *after* the gate lets it
  through: a signal that came while it waited stops it there (a call was once issued about a call's length after
  the signal).
- **A signal gives the calls under way a grace.** At Ctrl-C no new call starts and the calls under way may answer
  (and be recorded) for `INTERRUPT_GRACE_S`, at SIGTERM for `TERMINATE_GRACE_S` (schedulers send SIGKILL about 30 s
  after it); then, or at a second Ctrl-C, the workers still computing are stopped. A worker still loading its model
  is stopped at once: a load has no answer worth the wait.
- **Start-ups overlap.** Spawn, imports, handshake and model load of independent workers overlap, so starting costs
  about the slowest one's; a start-up that fails stops every other, and no worker outlives the command.
- **A lost worker is replaced** through its `invar.runner.engine.Lease`, a bounded number of times.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from invar.interrupts import Stopped, Terminated, interruption
from invar.protocol.methods import Method, Wire
from invar.runner.engine import Lease, Session
from invar.transport import Answer, WorkerClient

T = TypeVar("T")
Start = Callable[[Callable[[], object]], contextlib.AbstractContextManager[Session]]
"""How a slot's worker starts: `start(ready)` enters a session (`invar.runner.engine.engine_session`), calling
`ready` after the identity check and before the model load."""

INTERRUPT_GRACE_S = 30.0
"""After Ctrl-C, how long the calls under way may take to answer (and be recorded) before their workers are stopped;
a second Ctrl-C stops them at once."""
TERMINATE_GRACE_S = 10.0
"""At SIGTERM the calls under way get this long to answer: schedulers send SIGKILL about 30 s after SIGTERM (Slurm's
KillWait, Kubernetes' grace period), and stopping the workers and closing the store must fit before it."""


class Halted(Exception):
    """Work given up because the pool halted (another worker failed, or a signal came): never the cause itself."""


class Gate:
    """At most `slots` holders at once, admitted in the order they asked: a worker that finishes a call and asks
    again waits behind the workers already waiting (a plain semaphore lets it take the slot back at once, so a
    package's second worker could wait out the whole run)."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: collections.deque[object] = collections.deque()
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        ticket = object()
        with self._cond:
            self._waiting.append(ticket)
            try:
                self._cond.wait_for(lambda: self._free > 0 and self._waiting[0] is ticket)
            except BaseException:  # interrupted while waiting: out of the line, which moves on without it
                self._waiting.remove(ticket)
                self._cond.notify_all()
                raise
            self._waiting.popleft()
            self._free -= 1
            self._cond.notify_all()  # the next in line may fit too

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


def _wait(thread: threading.Thread, ended: threading.Event, timeout: float | None) -> bool:
    """Whether the thread ended within `timeout` (None: however long it takes). An Event, not `join`: an interrupted
    `Thread.join` can mark a running thread as ended (Python 3.11). A thread that is not alive and has not ended
    never ran (its start failed)."""
    if timeout is None:
        while thread.is_alive() and not ended.is_set():
            ended.wait(0.5)
        return True
    return ended.wait(timeout) or not thread.is_alive()


class WorkerPool:
    """The workers of one command: `parties` slots, each driven by a thread of `run` (or started by `start`).

    `calls_at_once`: at most this many calls computing at once over all workers (None: no gate).
    `checked` runs once every slot's worker has shown its identity, `loaded` once every one has loaded its model
    (a command shows them as phases)."""

    def __init__(self, parties: int, *, calls_at_once: int | None = None,
                 checked: Callable[[], object] = lambda: None, loaded: Callable[[], object] = lambda: None) -> None:
        self.stop = threading.Event()
        self._gate: contextlib.AbstractContextManager[object] = (contextlib.nullcontext() if calls_at_once is None
                                                                 else Gate(calls_at_once))
        self._barriers: list[threading.Barrier] = []
        self._live: set[WorkerClient] = set()  # the workers now serving, stopped once a signal's grace has passed
        self._starting: set[WorkerClient] = set()  # the workers still loading, stopped at once at a signal
        self._lock = threading.Lock()
        self._failures: list[BaseException] = []  # what a barrier's action raised, reported by its parties
        # No call is made until every worker has shown the identity the command names, nor before every worker has
        # loaded its model: a package's workers share its calls, and one that loaded first would otherwise take them
        # all while another still loads (an NF4 load is slower than a tiny model's calls).
        self.checked = self.barrier(parties, checked)
        self.loaded = self.barrier(parties, loaded)

    def barrier(self, parties: int, action: Callable[[], object] = lambda: None) -> threading.Barrier:
        """A barrier the pool breaks when it halts; what `action` raises is what its parties report."""
        def run_action() -> None:
            try:
                action()
            except BaseException as exc:
                with self._lock:
                    self._failures.append(exc)
                raise

        made = threading.Barrier(parties, action=run_action)
        self._barriers.append(made)
        return made

    def wait(self, barrier: threading.Barrier) -> None:
        """Wait at `barrier`; `Halted` when the pool halted, or the failure of its action."""
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            with self._lock:
                failure = self._failures[0] if self._failures else None
            if failure is not None:
                raise failure from None
            raise Halted from None

    def halt(self) -> None:
        """No new call starts and every barrier breaks."""
        self.stop.set()
        for barrier in self._barriers:
            barrier.abort()

    def ready(self) -> None:
        """A start-up's check between its handshake and its model load: `Halted` once the pool halted."""
        if self.stop.is_set():
            raise Halted

    @contextlib.contextmanager
    def starting(self, client: WorkerClient) -> Iterator[WorkerClient]:
        """Keep `client` among the workers stopped at once at a signal while it loads (`engine_session`'s
        `watch`)."""
        with self._lock:
            self._starting.add(client)
        try:
            yield client
        finally:
            with self._lock:
                self._starting.discard(client)

    @contextlib.contextmanager
    def serving(self, session: Session) -> Iterator[Session]:
        """Keep `session`'s worker among those stopped when a signal's grace has passed."""
        with self._lock:
            self._live.add(session.client)
        try:
            yield session
        finally:
            with self._lock:
                self._live.discard(session.client)

    def served(self, start: Start) -> Start:
        """`start`, each session it starts kept `serving`."""
        @contextlib.contextmanager
        def served(ready: Callable[[], object]) -> Iterator[Session]:
            with start(ready) as session, self.serving(session):
                yield session
        return served

    @contextlib.contextmanager
    def lease(self, start: Start, restarts: int, who: str) -> Iterator[Lease]:
        """One slot's worker, from a thread of `run`: started by `start` (its first session waits at the identity
        barrier before loading), replaced at most `restarts` times when lost; entered once every slot has loaded."""
        with Lease(self.served(start), lambda: self.wait(self.checked), restarts, who) as lease:
            self.wait(self.loaded)
            yield lease

    def ask(self, lease: Lease, method: str | Method[Any, Any], params: Mapping[str, Any] | Wire) -> Answer | None:
        """`method` answered by the slot's worker (issued again to a replacement if it is lost), or None when the
        pool halted while this thread waited its turn at the gate: no call is issued after a halt."""
        with self._gate:  # never held across a barrier: a lease starts its first session before any call
            if self.stop.is_set():
                return None
            return lease.ask(method, params)

    def start(self, stack: contextlib.ExitStack, managers: Sequence[contextlib.AbstractContextManager[Any]]) \
            -> list[Any]:
        """Enter every context manager at once, one thread each, and return what each entered, in order; each is
        exited by `stack` (in reverse order, as if entered one after the other).

        A failure halts the pool (the managers' start-ups check `ready` before loading a model) and, once every
        thread is done, is raised after whatever did start is on `stack`, so the caller's unwinding stops it: no
        worker outlives the command. The first failure in `managers` order is raised, never a start-up given up
        because of it. An interrupt (Ctrl-C) while waiting does the same: every thread is waited for, so nothing is
        recorded into a closed store and no process is left running; a worker still loading its model (kept by
        `starting`) is stopped at once, as in `run`."""
        entered: list[tuple[contextlib.AbstractContextManager[Any], Any] | None] = [None] * len(managers)
        failed: list[BaseException | None] = [None] * len(managers)
        ended = [threading.Event() for _ in managers]

        def enter(i: int) -> None:
            try:
                entered[i] = (managers[i], managers[i].__enter__())
            except BaseException as exc:
                failed[i] = exc
                self.halt()
            finally:
                ended[i].set()

        threads = [threading.Thread(target=enter, args=(i,), name=f"invar-start-{i}") for i in range(len(managers))]
        interrupted: BaseException | None = None
        try:
            for t in threads:
                t.start()
        except BaseException as exc:
            interrupted = exc
            self.halt()
            self._stop_loading()
        for t, end in zip(threads, ended, strict=True):
            while True:
                try:
                    _wait(t, end, None)
                    break
                except BaseException as exc:  # an interrupt: let every start-up end, then stop what started
                    interrupted = interrupted or exc
                    self.halt()
                    self._stop_loading()  # a load has no answer worth the wait
        for got in entered:
            if got is not None:
                stack.push(got[0])
        if interrupted is not None:
            raise interrupted
        failures = [exc for exc in failed if exc is not None]
        if failures:
            raise next((exc for exc in failures if not isinstance(exc, Halted)), failures[0])
        return [got[1] for got in entered if got is not None]

    def one(self, start: Start, work: Callable[[Lease], T], who: str, stopped: Callable[[str], str],
            name: str) -> T:
        """`work` over the one worker `start` starts (a pool of one slot, never replaced), on a thread of `run`:
        what `work` returns, or what stopped it."""
        done: list[T] = []

        def job() -> None:
            with self.lease(start, 0, who) as lease:
                done.append(work(lease))

        self.run([job], stopped, name)
        return done[0]

    def run(self, jobs: Sequence[Callable[[], object]], stopped: Callable[[str], str], name: str = "invar-worker",
            finished: Callable[[], bool] = lambda: False) -> str | None:
        """Run each job on a thread of its own until all are done; the first failure halts the others and is raised
        once they have ended.

        At Ctrl-C or SIGTERM the pool halts and the calls under way get their grace; then the workers still
        computing are stopped and `Stopped(stopped(how) + ...)` is raised, `how` naming the signal. Unless
        `finished()`, asked once every job has ended, says the calls under way completed the command's work: then
        nothing is left to stop, and `how` is returned (None where no signal came)."""
        errors: list[BaseException | None] = [None] * len(jobs)
        ended = [threading.Event() for _ in jobs]
        first: list[int] = []

        def work(i: int) -> None:
            try:
                jobs[i]()
            except BaseException as exc:
                errors[i] = exc
                # A worker released by another's failure reports the halt; the failure is the cause.
                if not isinstance(exc, Halted):
                    with self._lock:
                        first.append(i)
                    self.halt()
            finally:
                ended[i].set()

        threads = [threading.Thread(target=work, args=(i,), name=f"{name}-{i}", daemon=True)
                   for i in range(len(jobs))]
        try:
            for t in threads:
                t.start()
            for t, end in zip(threads, ended, strict=True):
                _wait(t, end, None)
        except KeyboardInterrupt as exc:
            heard = self._grace(exc, threads, ended, stopped, finished)
            if first:
                raise errors[first[0]] from None  # type: ignore[misc]
            return heard  # the jobs halted by the signal after their work was done
        if first:
            raise errors[first[0]]  # type: ignore[misc]
        for error in errors:  # every one halted without a cause: a barrier action's failure, say
            if error is not None:
                raise error
        return None

    def _stop_loading(self) -> bool:
        """Stop at once every worker still loading its model (kept by `starting`); whether there was one."""
        with self._lock:
            loading = list(self._starting)
        for client in loading:
            client.close(timeout=0.1)
        return bool(loading)

    def _grace(self, exc: KeyboardInterrupt, threads: Sequence[threading.Thread], ended: Sequence[threading.Event],
               stopped: Callable[[str], str], finished: Callable[[], bool]) -> str:
        how, status = interruption(exc)
        self.halt()
        loading = self._stop_loading()
        deadline = time.monotonic() + (TERMINATE_GRACE_S if isinstance(exc, Terminated) else INTERRUPT_GRACE_S)
        forced = loading
        try:
            for t, end in zip(threads, ended, strict=True):  # one grace for all of them together
                if not _wait(t, end, max(0.0, deadline - time.monotonic())):
                    forced = True
                    break
        except KeyboardInterrupt:  # a second Ctrl-C: stop them at once
            forced = True
        if forced:
            with self._lock:
                live = list(self._live)
            for client in live:
                client.close(timeout=0.1)
            for t, end in zip(threads, ended, strict=True):
                _wait(t, end, 60.0)
        if all(end.is_set() for end in ended) and finished():
            return how
        cut = " (the calls still under way were stopped, unanswered)" if forced else ""
        raise Stopped(stopped(how) + cut, status) from None
