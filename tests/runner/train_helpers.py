"""What the training tests share: small configurations on the shipped model, the `invar` command, and a training
run killed at random instants and resumed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from invar.engines import DEFAULT_MODEL
from invar.loop.history import History, read_history
from invar.records import RunStore

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

TRAIN_PROMPTS = REPO_ROOT / "data" / "arith-train.jsonl"


def write_config(folder: Path, name: str, backend: str, *, cycles: int = 3, **sections: dict[str, Any]) -> Path:
    """A small configuration: 4 prompts of the weak kinds × G = 4 per cycle, lr 5e-3, a KL term (so the engine
    also scores under the reference), overridable per section."""
    base: dict[str, dict[str, Any]] = {
        "prompts": {"path": str(TRAIN_PROMPTS), "per_cycle": 4, "kinds": ["mul", "muladd"]},
        "rollout": {"group_size": 4, "temperature": 1.0, "max_tokens": 5},
        "optimizer": {"lr": 5e-3},
        "objective": {"kl_coef": 0.05},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    lines = [f'name = "{name}"', f'backend = "{backend}"', f'model = "{DEFAULT_MODEL}"', "seed = 5",
             f"cycles = {cycles}"]
    for section, values in base.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def invar(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def published(run: Path) -> list[str]:
    """The checkpoint digests a run published, in cycle order."""
    with RunStore.open(run) as store:
        meta = store.meta()
    return [meta[k]["checkpoint"]["digest"] for k in sorted(meta) if k.startswith("cycle-")]


def worker_pids(run: Path) -> list[int]:
    try:
        with RunStore.open(run) as store:
            return [ident.pid for ident in store.workers().values()]
    except Exception:  # the run may not exist yet at this instant
        return []


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def local_workers_env() -> dict[str, str]:
    """This environment without a fork server: the commands whose workers a test finds by their parent (and kills)
    start them as their own children, as a user's commands do by default."""
    return {k: v for k, v in os.environ.items() if k != "INVAR_FORKSERVER"}


def live_workers(run: Path, parent: int) -> list[int]:
    """The workers of this attempt: the store also names the (dead, maybe reused) pids of earlier attempts. Only
    workers the command started as its children are found (run it with `local_workers_env()`)."""
    return [pid for pid in worker_pids(run) if _parent(pid) == parent]


def _no_worker_outlives(run: Path, how: str) -> None:
    """Every worker the run's store names is gone within 10 s."""
    for pid in worker_pids(run):
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"worker {pid} outlived its {how} parent")


def _placed_since(run: Path, pids: set[int]) -> bool:
    """Whether a shared process other than those of `pids` (a later start's) is placed on record."""
    try:
        with RunStore.open(run) as store:
            return any(k.startswith("placement shared ") and v["pid"] not in pids for k, v in store.meta().items())
    except Exception:  # mid-write
        return False


def _published_now(run: Path) -> int:
    try:
        return len(published(run))
    except Exception:  # not created yet, or mid-write
        return 0


def stop_at_signal(config: Path, run: Path, sig: signal.Signals, after_cycles: int, *,
                   once_placed: bool = False, may_finish: bool = False) -> str:
    """Start (or resume) `invar train`, send it `sig` once `after_cycles` cycles are published (and, with
    `once_placed`, once this start's shared process is placed on record, which it is just before its first cycle),
    and check it stops as a user is told: the signal's exit status, one line naming the signal and how to resume, no
    traceback, no worker left behind. Returns that line. The signal must land before the run's last cycle starts
    (a cycle under way at a signal is finished): a resumed run stopped as its first cycle starts has the last cycle
    still ahead of it, where one stopped at the second-to-last cycle's publication, or at the resumed run's first
    rollouts, may have started the last one already (each seen in a whole-suite run). With `may_finish`, a signal
    that met the last cycle under way is checked instead as the user is told then: that cycle finished, the run is
    closed, exit 0, one line saying so."""
    before = set(worker_pids(run))
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "train", str(config), "--run", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600

    def waiting() -> bool:
        return _published_now(run) < after_cycles or (once_placed and not _placed_since(run, before))

    while waiting() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr
    how = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    if may_finish and proc.returncode == 0:
        lines = [line for line in stderr.splitlines() if line.startswith("invar: ") and "…" not in line]  # no progress
        assert lines == [f"invar: {how} came while the last cycle was under way; it finished, and the run is "
                         "complete"], stderr[-2000:]
        with RunStore.open(run) as store:
            assert store.verify().closed
        _no_worker_outlives(run, "finished")
        return lines[0]
    assert proc.returncode == 128 + sig, (proc.returncode, stderr[-2000:])
    lines = [line for line in stderr.splitlines() if line.startswith(("invar: error", "invar: interrupted"))]
    assert len(lines) == 1, stderr[-2000:]
    assert lines[0].startswith(f"invar: interrupted: stopped at {how}. Every record so far is kept in {run}; "
                               f"resume with: invar train {config} --run {run}"), lines[0]
    _no_worker_outlives(run, "stopped")
    return lines[0]


def kill_and_resume(config: Path, run: Path, kills: int, window: tuple[float, float], seed: int) -> list[str]:
    """Start `invar train` and SIGKILL it, or one of its workers, at a random instant in `window` seconds; `kills`
    times, resuming each time; then resume it to the end. Returns what was killed when, for the test's message."""
    rng = random.Random(seed)
    what = []
    for k in range(kills):
        proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "train", str(config), "--run", str(run)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=local_workers_env())
        deadline = time.monotonic() + rng.uniform(*window)
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pids = live_workers(run, proc.pid)
        while k % 2 == 1 and not pids and proc.poll() is None:  # odd kills hit a worker, once one is running
            time.sleep(0.05)
            pids = live_workers(run, proc.pid)
        if proc.poll() is None:
            if k % 2 == 1 and pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                what.append("worker")
            else:
                proc.send_signal(signal.SIGKILL)
                what.append("cli")
            proc.wait(120)
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in stderr, stderr
        if proc.returncode == 2:
            assert "resume with: invar train" in stderr, stderr
        _no_worker_outlives(run, "killed")  # the workers of a killed CLI do not outlive it
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    return what


def history(run: Path) -> History:
    return read_history(run)


def check_finished(run: Path, head: str, cycles: int, kl_coef: float) -> History:
    """A finished run: closed at `head`, every cycle published a checkpoint whose folder has its digest, each cycle
    sampled the checkpoint published before it, and the core's objective equals the learner's within tolerance."""
    from invar import canonical

    with RunStore.open(run) as store:
        assert store.verify(expect_head=head).closed
    h = history(run)
    digests = published(run)
    assert len(digests) == cycles
    assert [c.checkpoint for c in h.cycles] == digests
    assert [c.policy for c in h.cycles] == [None, *digests[:-1]]
    for n, digest in enumerate(digests):
        assert canonical.tree_digest(run / "checkpoints" / f"cycle-{n:06d}") == digest
    for c in h.cycles:
        g = c.gap
        print(f"measured: {h.config.backend} cycle {c.cycle}: {g.equal}/{g.tokens} tokens equal "
              f"({g.equal / g.tokens:.1%}), p99 {g.p99:.3g}, max {g.max:.3g} nats; loss |Δ| {c.loss_abs_diff:.3g}")
        assert c.staleness == 0
        assert c.importance.exactly_one == g.equal  # w = exp(proximal − behavior) is 1 exactly where they agree
        assert c.loss_abs_diff <= 1e-6 * (max(abs(c.advantage_min), abs(c.advantage_max)) * 2.0 + kl_coef)
    return h
