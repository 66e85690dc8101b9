"""A fork server's workers are the workers a fresh process would be: the same code from the files as they are at the
call (edited after the server started, too), the same answers, exit status and kill, and gone with the command that
started them; a request a fresh process would see differently is refused and starts as a fresh process."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import invar
from invar import engines
from invar.engines import start_worker, worker_digest
from invar.transport import forkserver
from invar.transport.forkserver import ForkedWorker
from invar.transport.ray_relay import ACTOR_ENV

SRC = Path(invar.__file__).resolve().parents[1]
ECHO = "invar.workers.echo"


def _serve(folder: Path, module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = folder.with_suffix(".log")
    with log.open("wb") as out:
        proc = forkserver.start(folder, module, env, out)
    deadline = time.monotonic() + 120
    while not forkserver.socket_path(folder, module).exists():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the fork server did not start in 120 s"
        time.sleep(0.05)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return Path(proc.args[4]).with_suffix(".log").read_text()  # type: ignore[index]


@pytest.fixture
def echo_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[bytes]]:
    folder = tmp_path / "fs"
    proc = _serve(folder, ECHO, engines.worker_env(None, "echo"))
    monkeypatch.setenv(forkserver.ENV, str(folder))
    yield proc
    if proc.poll() is None:
        _stop(proc)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_forked_worker_answers_as_a_fresh_one(echo_server: subprocess.Popen[bytes]) -> None:
    arr = np.arange(1 << 16, dtype=np.float32) / 7
    with start_worker("echo") as forked:
        assert isinstance(forked.process, ForkedWorker)
        assert _parent(forked.identity.pid) == echo_server.pid
        assert os.getsid(forked.identity.pid) == forked.identity.pid  # its own session, as a local worker
        got = forked.call("echo", {"array": arr, "text": "x"})
        mine = forked.identity
    os.environ.pop(forkserver.ENV)
    with start_worker("echo") as fresh:
        assert isinstance(fresh.process, subprocess.Popen)
        want = fresh.call("echo", {"array": arr, "text": "x"})
        theirs = fresh.identity
    assert got["array"].tobytes() == want["array"].tobytes()
    assert got["text"] == want["text"]
    assert mine.worker == theirs.worker
    assert mine.worker is not None
    assert mine.worker["digest"] == worker_digest("echo")
    assert mine.engine_version == theirs.engine_version
    assert mine.settings == theirs.settings
    assert forked.process.returncode == 0
    assert "1 workers forked, 0 refused" in _stop(echo_server)


def test_the_log_names_the_test_each_worker_was_forked_for(echo_server: subprocess.Popen[bytes]) -> None:
    with start_worker("echo") as forked:
        pid = forked.identity.pid
    log = _stop(echo_server)
    asker = os.environ[forkserver.FORKED_FOR]  # this test's id, as pytest names it
    assert asker.startswith("tests/protocol/test_forkserver.py::test_the_log_names_the_test")
    assert f"forkserver: forked {pid} for {asker}\n" in log
    assert forkserver.forked(log.splitlines()) == {pid: asker.split(" ")[0]}  # the line's reader, beside its writer
    assert forkserver.forked(["forkserver: forked 12", "forkserver: forked x for t", "other"]) == {12: ""}
    spec = importlib.util.spec_from_file_location("test_lanes", SRC.parent / "scripts" / "test_lanes.py")
    assert spec is not None
    assert spec.loader is not None
    lanes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lanes)
    assert lanes.forked_per_file(log.splitlines()) == {"tests/protocol/test_forkserver.py": 1}


def test_a_forked_worker_is_killed_and_reports_it(echo_server: subprocess.Popen[bytes]) -> None:
    worker = start_worker("echo")
    pid, proc = worker.identity.pid, worker.process
    assert isinstance(proc, ForkedWorker)
    pending = worker.submit("sleep", {"seconds": 60})
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
    assert _gone(pid)
    with pytest.raises(Exception, match="echo"):
        pending.answer()
    worker.close()


def test_the_workers_of_a_killed_command_are_killed(echo_server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    script = ("import sys, time\nfrom invar.engines import start_worker\nw = start_worker('echo')\n"
              "print(type(w.process).__name__, w.identity.pid, flush=True)\ntime.sleep(600)\n")
    command = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert command.stdout is not None
        kind, pid = command.stdout.readline().split()
        assert kind == "ForkedWorker"
    finally:
        command.kill()
        command.wait(10)
    assert _gone(int(pid)), "a forked worker outlived the command that started it"


def test_a_stopped_server_takes_its_workers_with_it(echo_server: subprocess.Popen[bytes]) -> None:
    worker = start_worker("echo")
    pid = worker.identity.pid
    assert "0 refused" in _stop(echo_server)
    assert _gone(pid)
    assert worker.process is not None
    assert worker.process.wait(10) == -signal.SIGKILL
    worker.close()


def test_the_core_is_read_from_the_files_at_each_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Edited after the server started, the worker's file and a core module it imports are what the next worker
    runs and the digest it reports, as for a fresh process."""
    site = tmp_path / "site"
    shutil.copytree(SRC / "invar", site / "invar", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_home"))
    on_site = {"PYTHONPATH": str(site)}
    folder = tmp_path / "fs"
    server = _serve(folder, ECHO, engines.worker_env(on_site, "echo"))
    monkeypatch.setenv(forkserver.ENV, str(folder))
    try:
        digests = []
        for edit in range(3):
            with start_worker("echo", env=on_site) as w:
                assert isinstance(w.process, ForkedWorker)
                digests.append(w.identity.worker["digest"] if w.identity.worker else None)
                assert digests[-1] == worker_digest("echo", on_site)
                answer = w.call("echo", {"a": 1})
            assert answer == ({"a": 1} if edit == 0 else {"a": 1, "edited": edit})
            echo = site / "invar" / "workers" / "echo.py"
            text = echo.read_text().replace("return dict(params)", f"return {{**params, 'edited': {edit + 1}}}")
            text = text.replace(f"'edited': {edit}}}", f"'edited': {edit + 1}}}")
            echo.write_text(text)
            with (site / "invar" / "canonical.py").open("a") as fh:
                fh.write(f"# edit {edit}\n")
        assert len(set(digests)) == 3
    finally:
        assert "3 workers forked, 0 refused" in _stop(server)


def test_names_the_engine_sets_or_never_reads_may_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name the engine's import sets, carried at that value (a command that imported torch itself passes it on),
    the names of a library the server has not imported, and a library search path's folders that do not exist (what
    OpenCV's import prepends), are no reason to refuse; the name at another value, or a folder that exists, is."""
    (tmp_path / "sets_a_name.py").write_text("import os\nos.environ['SET_AT_IMPORT'] = 'by the import'\n")
    (tmp_path / "probe_worker.py").write_text(
        "import sets_a_name\nfrom invar.protocol import exit_worker\nfrom invar.workers.echo import main\n"
        "if __name__ == '__main__':\n    exit_worker(main())\n")
    monkeypatch.setitem(engines.ENGINES, "echo", "probe_worker")
    path = {"PYTHONPATH": f"{SRC}{os.pathsep}{tmp_path}"}
    assert forkserver.preloads("probe_worker", [str(tmp_path)]) == ["sets_a_name"]
    folder = tmp_path / "fs"
    server = _serve(folder, "probe_worker", engines.worker_env(path, "echo"))
    monkeypatch.setenv(forkserver.ENV, str(folder))
    try:
        # KMP_*: what scikit-learn's import sets, read only by an OpenMP runtime the server has not loaded.
        carried = {**path, "SET_AT_IMPORT": "by the import", "VLLM_LOGGING_LEVEL": "DEBUG", "MLX_SOMETHING": "1",
                   "KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE",
                   "HF_DATASETS_OFFLINE": "1", "INSPECT_DISPLAY": "none", "LD_LIBRARY_PATH": str(tmp_path / "none")}
        with start_worker("echo", env=carried) as w:
            assert isinstance(w.process, ForkedWorker)
            assert w.call("echo", {"a": 3}) == {"a": 3}
        with start_worker("echo", env={**path, "SET_AT_IMPORT": "by the command"}) as w:
            assert isinstance(w.process, subprocess.Popen)
        with start_worker("echo", env={**path, "LD_LIBRARY_PATH": f"{tmp_path / 'none'}:{tmp_path}"}) as w:
            assert isinstance(w.process, subprocess.Popen)
    finally:
        log = _stop(server)
    assert "1 workers forked, 2 refused" in log
    assert "its environment differs on SET_AT_IMPORT" in log
    assert "its environment differs on LD_LIBRARY_PATH" in log


def test_a_server_started_in_a_shell_forks_the_commands_started_in_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/protocol.md starts a server and then the commands from one shell. The server completes its environment
    as each command completes its worker's (the workers' defaults where the shell lacks them), so the shell needs
    none of them set."""
    for name in engines.worker_defaults(["echo"]):
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "fs"
    server = _serve(folder, ECHO, dict(os.environ))
    monkeypatch.setenv(forkserver.ENV, str(folder))
    try:
        with start_worker("echo") as w:
            assert isinstance(w.process, ForkedWorker)
            assert w.call("echo", {"a": 2}) == {"a": 2}
    finally:
        log = _stop(server)
    assert "1 workers forked, 0 refused" in log


@pytest.mark.parametrize("ray_node", [False, True])
def test_a_servers_environment_is_the_one_its_workers_get(monkeypatch: pytest.MonkeyPatch, ray_node: bool) -> None:
    """A command completes its worker's environment (`worker_env`); on a Ray node the relay adds what Ray sets in
    each actor where that does not set it (`ACTOR_ENV`). A server started in the same shell, with `--ray-node` on
    such a node, completes its own to the same names and values (`PYTHONPATH` may differ under the refusal rules)."""
    shell = {"PATH": os.environ["PATH"], "HOME": "/home/someone", "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "0"}
    monkeypatch.setattr(os, "environ", dict(shell))
    command = engines.worker_env(None, "hf")
    command.pop("PYTHONPATH")
    want = {**ACTOR_ENV, **command} if ray_node else command
    served = forkserver.served_env(shell, engines.ENGINES["hf"], ray_node=ray_node)
    assert served == want
    assert served["OMP_NUM_THREADS"] == "2"  # the shell's own values stay
    assert served["HF_HUB_OFFLINE"] == "0"
    assert ("SPT_NOENV" in served) is ray_node
    assert served["TOKENIZERS_PARALLELISM"] == "false"


@pytest.mark.parametrize("change", ["OMP_NUM_THREADS", "a search path with another numpy"])
def test_a_worker_a_fresh_process_would_see_otherwise_starts_fresh(
        echo_server: subprocess.Popen[bytes], tmp_path: Path, change: str) -> None:
    if change == "OMP_NUM_THREADS":
        env = {"OMP_NUM_THREADS": "3"}
    else:
        shadow = tmp_path / "shadow" / "numpy"
        shadow.mkdir(parents=True)
        # Another numpy that a fresh worker would import first: it hands over to the installed one, so the worker runs.
        (shadow / "__init__.py").write_text(
            "import importlib, os, sys\n"
            "sys.path.remove(os.path.dirname(os.path.dirname(__file__)))\n"
            "del sys.modules['numpy']\n"
            "sys.modules['numpy'] = importlib.import_module('numpy')\n")
        env = {"PYTHONPATH": os.pathsep.join([str(SRC), str(tmp_path / "shadow")])}
    with start_worker("echo", env=env, echo_stderr=False) as w:
        assert isinstance(w.process, subprocess.Popen)
        assert w.call("echo", {"a": 1}) == {"a": 1}
    # Only a runtime name (the core's own, a test runner's) or a search path that finds the same modules may differ.
    with start_worker("echo", env={"INVAR_SOMETHING": "1", "PYTHONPATH": f"{SRC}{os.pathsep}{tmp_path}"}) as w:
        assert isinstance(w.process, ForkedWorker)
    log = _stop(echo_server)
    assert "1 workers forked, 1 refused" in log
    assert ("environment differs on OMP_NUM_THREADS" if change == "OMP_NUM_THREADS"
            else "its PYTHONPATH finds another numpy") in log


def test_an_openmp_runtime_that_reads_kmp_names_is_found_in_the_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    gomp = "7f00-7f01 r-xp 00000000 08:01 42 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1\n"
    maps.write_text(gomp + "7f02-7f03 r-xp 00000000 08:01 43 /usr/lib/libc.so.6\n")
    assert not forkserver._kmp_runtime_loaded(maps)
    for runtime in ("/opt/intel/lib/libiomp5.so", "/usr/lib/llvm-19/lib/libomp.so.5"):
        maps.write_text(gomp + f"7f04-7f05 r-xp 00000000 08:01 44 {runtime}\n")
        assert forkserver._kmp_runtime_loaded(maps)
    assert forkserver._kmp_runtime_loaded(tmp_path / "unreadable")
    assert not forkserver._kmp_runtime_loaded()  # this test process: torch's libgomp at most


def test_no_server_or_a_broken_one_starts_a_fresh_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENV, str(tmp_path / "none"))
    with start_worker("echo") as w:
        assert isinstance(w.process, subprocess.Popen)
    folder = tmp_path / "stale"
    folder.mkdir()
    forkserver.socket_path(folder, ECHO).touch()  # a socket file nobody answers on
    monkeypatch.setenv(forkserver.ENV, str(folder))
    with start_worker("echo") as w:
        assert isinstance(w.process, subprocess.Popen)
        assert w.call("echo", {"a": 2}) == {"a": 2}


def test_the_preloads_are_the_workers_module_level_engine_imports() -> None:
    hf = forkserver.preloads(engines.ENGINES["hf"], sys.path)
    assert {"torch", "transformers", "numpy", "safetensors.torch"} <= set(hf)
    assert not [n for n in hf if n.startswith(("invar", "__future__"))]
    assert "peft" not in hf  # imported by the worker only where a LoRA is used: a fresh worker may never load it
    mlx = forkserver.preloads(engines.ENGINES["mlx"], sys.path)
    assert {"mlx.core", "mlx_lm.utils"} <= set(mlx)
    assert "torch" not in mlx


def test_a_command_imports_the_fork_server_only_where_one_is_named() -> None:
    assert engines.FORKSERVER_ENV == forkserver.ENV
    probe = "import sys, invar.engines; print('invar.transport.forkserver' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != forkserver.ENV}
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert shown.stdout.strip() == "False"


def test_each_startup_import_is_one_the_workers_main_always_makes() -> None:
    """`STARTUP_IMPORTS` preloads what a worker imports inside `main`: only a statement of `main`'s own body (not
    under an `if` or a `try`) is made on every path to the handshake, so a preload is never something a fresh worker
    would not import. The list is also what `preloads` returns after the module-level imports."""
    for module, names in forkserver.STARTUP_IMPORTS.items():
        source = Path(invar.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(source.read_text(encoding="utf-8"))
        (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        imported = {alias.name for node in main.body if isinstance(node, ast.Import) for alias in node.names}
        assert set(names) <= imported, (module, names, imported)
        assert forkserver.preloads(module, sys.path)[-len(names):] == list(names)
