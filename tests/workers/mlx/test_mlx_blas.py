"""How the MLX worker finds the OpenBLAS it preloads for `--blas openblas` (docs/mlx.md, "The BLAS"): the library's
file, whether it comes from opencv-python-headless's wheel or from the system, and the environment that preloads
it. The worker started with it is tested on the real model (tests/models/test_smollm2_engines.py)."""

from __future__ import annotations

import ctypes.util
from importlib import metadata
from pathlib import Path

import pytest

from invar.workers import mlx_worker

pytestmark = pytest.mark.engine


def test_the_vendored_openblas_is_a_file_that_answers_cblas_sgemm() -> None:
    found = mlx_worker.find_openblas()
    assert found is not None
    assert found.is_absolute()
    assert found.is_file()
    assert mlx_worker.library_file(str(found)) == found


def test_a_system_library_name_becomes_the_file_the_linker_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ctypes.util.find_library` names a library ("libopenblas.so.0"), it does not give its path: the worker reads
    the file from where the linker mapped it, so the sha256 in its identity and its LD_PRELOAD name a real file
    wherever the command runs from."""
    vendored = mlx_worker.find_openblas()
    assert vendored is not None

    def no_opencv(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    # A bare name the linker resolves without a search path: the library's own, once it is loaded.
    ctypes.CDLL(str(vendored))
    monkeypatch.setattr(mlx_worker.distributions, "distribution", no_opencv)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: vendored.name if name == "openblas" else None)
    monkeypatch.chdir(Path("/"))
    assert mlx_worker.find_openblas() == vendored
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert mlx_worker.find_openblas() is None


def test_the_preload_puts_openblas_first_once_and_on_one_thread() -> None:
    library = Path("/opt/blas/libopenblas.so.0")
    env = mlx_worker.openblas_env(library, {"LD_PRELOAD": "/x/libjemalloc.so /opt/blas/libopenblas.so.0", "A": "1"})
    assert env == {"LD_PRELOAD": "/opt/blas/libopenblas.so.0 /x/libjemalloc.so", "OPENBLAS_NUM_THREADS": "1",
                   "A": "1"}
    assert mlx_worker.openblas_env(library, {})["LD_PRELOAD"] == str(library)
