"""`make install`'s llama-cpp-python wheel cache (scripts/llamacpp_wheel.py): a wheel kept for this machine's key is
installed from the cache without a build, and the key follows what the build's bytes depend on.

Building the wheel itself takes minutes, so it is not done here: the first build and its time are measured in
docs/gguf.md ("Installing llama.cpp"), and `make install` on a clean machine runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "llamacpp_wheel.py"


@pytest.fixture
def wheel_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The script as a module (its own folder importable, as when it runs), the cache under tmp_path."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    monkeypatch.setenv("INVAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    import llamacpp_wheel

    return llamacpp_wheel


def test_a_wheel_kept_for_this_machine_is_reused_without_a_build(wheel_script: ModuleType, tmp_path: Path) -> None:
    folder = wheel_script.wheel_folder(wheel_script.build_parts(wheel_script.pinned_sdist()))
    assert folder.parent == tmp_path / "cache" / "wheels"
    folder.mkdir(parents=True)
    kept = folder / f"llama_cpp_python-{wheel_script.VERSION}-py3-none-linux_x86_64.whl"
    kept.write_bytes(b"kept by an earlier build")
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"} | {"INVAR_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(kept)
    assert done.stderr.strip() == f"[llamacpp_wheel] reusing {kept}"
    assert [p.name for p in (tmp_path / "cache" / "wheels").iterdir()] == [folder.name]  # nothing else was built


def test_the_key_follows_the_build_options_and_the_pinned_source(
    wheel_script: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdist = wheel_script.pinned_sdist()
    parts = wheel_script.build_parts(sdist)
    assert parts["sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert parts["cmake_args"][0] == "-DLLAVA_BUILD=OFF"
    assert wheel_script.pinned_version() == wheel_script.VERSION
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    other = wheel_script.build_parts(sdist)
    assert other["cmake_args"][-1] == "-DGGML_NATIVE=OFF"
    assert wheel_script.wheel_folder(other) != wheel_script.wheel_folder(parts)
    assert wheel_script.wheel_folder({**parts, "cpu_flags": "sse2"}) != wheel_script.wheel_folder(parts)


def test_an_x86_64_v3_cpu_gets_the_fixed_instruction_set_whatever_else_it_has(
    wheel_script: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One wheel for every x86-64 CPU with AVX2, FMA, F16C and BMI2: AVX-512 and AMX off, and the CPU's other flags
    not in the key; a CPU without them, or GGML_NATIVE=ON in CMAKE_ARGS, builds natively, keyed on the CPU's flags."""
    sdist = wheel_script.pinned_sdist()
    monkeypatch.setattr(wheel_script.platform, "machine", lambda: "x86_64")
    v3 = "sse4_2 avx avx2 fma f16c bmi2"
    monkeypatch.setattr(wheel_script, "cpu_flags", lambda: v3)
    parts = wheel_script.build_parts(sdist)
    assert parts["cmake_args"][2:] == list(wheel_script.X86_64_V3)
    assert "-DGGML_NATIVE=OFF" in parts["cmake_args"]
    assert "-DGGML_AVX512=OFF" in parts["cmake_args"]
    assert parts["cpu_flags"] is None
    monkeypatch.setattr(wheel_script, "cpu_flags", lambda: v3 + " avx512f avx512bw amx_tile amx_int8 avx_vnni")
    assert wheel_script.build_parts(sdist) == parts  # the same wheel on an AVX-512 and AMX machine

    monkeypatch.setattr(wheel_script, "cpu_flags", lambda: "sse4_2 avx")  # no AVX2: llama.cpp's native default
    older = wheel_script.build_parts(sdist)
    assert older["cmake_args"] == parts["cmake_args"][:2]
    assert older["cpu_flags"] == "sse4_2 avx"

    monkeypatch.setattr(wheel_script, "cpu_flags", lambda: v3)
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=ON")  # asked for natively: the CPU's flags key it again
    asked = wheel_script.build_parts(sdist)
    assert asked["cmake_args"][-1] == "-DGGML_NATIVE=ON"
    assert asked["cpu_flags"] == v3
    assert wheel_script.native(asked["cmake_args"])
    assert not wheel_script.native(parts["cmake_args"])
