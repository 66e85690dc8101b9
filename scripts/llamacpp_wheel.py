"""llama-cpp-python's wheel, built once per machine from the pinned source distribution and kept in the user cache;
`make install` installs it from there.

    python scripts/llamacpp_wheel.py    # prints the wheel's path; builds it first when the cache has none for this key

PyPI has only llama-cpp-python's source, so a first installation compiles llama.cpp. This builds that wheel from the
source distribution scripts/gguf_ladder.py pins by sha256 (models/smollm2-cache/, downloaded once if absent), with
only the libraries the bindings load: llama.cpp's multimodal library (`LLAVA_BUILD=OFF`) and its command-line
programs' common library (scripts/llamacpp_lib_only.cmake) are left out.

On an x86-64 CPU with AVX2, FMA, F16C and BMI2 the llama and ggml libraries are compiled for that fixed instruction
set (x86-64-v3: `GGML_NATIVE=OFF`, AVX2 on, AVX-512, AVX-VNNI and AMX off), not for the CPU that builds them: the same
code computes on every such machine, whichever AVX-512 or AMX extensions it has (a native build on a CPU with AMX
multiplies Q4_0, Q4_1, Q8_0 and K-quant weights with ggml's AMX kernels instead, another computation, and that build
crashed on the SmolLM2 Q4_1 file: docs/gguf.md). Elsewhere (another architecture, an older x86-64) the build is
llama.cpp's default, native one. CMAKE_ARGS of the environment come last and so override either.

The wheel is kept in `$INVAR_CACHE_DIR/wheels/` (default `${XDG_CACHE_HOME:-~/.cache}/invar/wheels/`), in a folder
named by a key over the source's sha256, the build options (with any CMAKE_ARGS of the environment and the included
CMake file's bytes), the compiler and what the build targets: the fixed instruction set's name, or for a native
build the CPU's instruction flags, so a native build is reused only where it was made for. pip's own cache (keyed by
the download only) is not relied on. `build.json` beside the wheel records the key's parts and the build's wall time.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from gguf_ladder import SDIST, SDIST_SHA256, pinned_sdist

ROOT = Path(__file__).resolve().parents[1]
LIB_ONLY = Path("scripts") / "llamacpp_lib_only.cmake"
VERSION = SDIST.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")


X86_64_V3 = ("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
             "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF")
"""ggml's CPU options for x86-64-v3; the AMX options are off whenever GGML_NATIVE is."""
X86_64_V3_FLAGS = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
"""The /proc/cpuinfo flags a CPU needs to run that build."""


def fixed_isa() -> list[str]:
    """The fixed instruction set's options where this CPU runs it (an x86-64 CPU with AVX2, FMA, F16C and BMI2),
    else none: llama.cpp's default native build."""
    if platform.machine() in ("x86_64", "AMD64") and set(cpu_flags().split()) >= X86_64_V3_FLAGS:
        return list(X86_64_V3)
    return []


def cmake_args(root: Path) -> list[str]:
    """CMake options on top of llama-cpp-python's defaults: no multimodal library, no common library, the fixed
    instruction set where it applies (module doc), then any CMAKE_ARGS of the environment. The key names the
    included file relative to the checkout (its bytes are keyed apart), so a clone elsewhere reuses the same wheel;
    the build is given its absolute path."""
    return ["-DLLAVA_BUILD=OFF", f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={root / LIB_ONLY}", *fixed_isa(),
            *shlex.split(os.environ.get("CMAKE_ARGS", ""))]


def native(args: list[str]) -> bool:
    """Whether these options build for the CPU that compiles them: GGML_NATIVE's last setting, ON by default."""
    settings = [a.split("=", 1)[1].upper() for a in args if a.startswith("-DGGML_NATIVE=")]
    return not settings or settings[-1] not in ("OFF", "0", "FALSE", "NO")


def say(message: str) -> None:
    print(f"[llamacpp_wheel] {message}", file=sys.stderr, flush=True)


def pinned_version() -> str:
    """The llama-cpp-python version pyproject.toml pins in the `engines` extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["engines"]
    pins = [r.split("==", 1)[1].strip() for r in extras if r.replace("_", "-").startswith("llama-cpp-python==")]
    return pins[0] if pins else ""


def cpu_flags() -> str:
    """The CPU's instruction flags (a GGML_NATIVE build uses them), or else the platform's name."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    return f"{platform.system()} {platform.machine()} {platform.processor()}"


def compiler() -> str:
    """The C++ compiler CMake will find first (CXX, else c++), by its version line."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or "c++"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return cxx
    return out.splitlines()[0] if out else cxx


def cache_root() -> Path:
    if os.environ.get("INVAR_CACHE_DIR"):
        return Path(os.environ["INVAR_CACHE_DIR"]) / "wheels"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "invar" / "wheels"


def build_parts(sdist: Path) -> dict[str, Any]:
    """What the wheel's bytes depend on: the source, the CMake options (any CMAKE_ARGS of the environment after this
    script's), the included CMake file, the compiler and the CPU a native build targets (a fixed-ISA build's target
    is in its options)."""
    args = cmake_args(Path())
    return {"sdist": sdist.name, "sha256": SDIST_SHA256,  # pinned_sdist() checked the file against it
            "cmake_args": args,
            "lib_only_cmake": hashlib.sha256((ROOT / LIB_ONLY).read_bytes()).hexdigest(), "compiler": compiler(),
            "cpu_flags": cpu_flags() if native(args) else None}


def wheel_folder(parts: dict[str, Any]) -> Path:
    """The cache folder of the wheel these parts build, named by a digest over them."""
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"llama-cpp-python-{VERSION}-{key}"


def main() -> int:
    pinned = pinned_version()
    if pinned != VERSION:
        say(f"pyproject.toml pins llama-cpp-python=={pinned or '(nothing)'}, scripts/gguf_ladder.py's source is "
            f"{VERSION}: pin the same version in both")
        return 2
    sdist = pinned_sdist()
    parts = build_parts(sdist)
    folder = wheel_folder(parts)
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if wheels:
        say(f"reusing {wheels[0]}")
        print(wheels[0])
        return 0
    folder.parent.mkdir(parents=True, exist_ok=True)
    say(f"building llama-cpp-python {VERSION} from source, once on this machine (about 4 minutes of CPU time)")
    start = time.time()
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".building-", ignore_cleanup_errors=True) as tmp:
        env = {**os.environ, "CMAKE_ARGS": shlex.join(cmake_args(ROOT))}
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
                               "--disable-pip-version-check", "-q", "-w", tmp, str(sdist)], env=env)
        if done.returncode != 0:
            say(f"building llama-cpp-python {VERSION} failed (pip wheel exit {done.returncode}); its output is above")
            return 1
        wall = round(time.time() - start)
        record = {**parts, "folder": folder.name, "wall_s": wall}
        (Path(tmp) / "build.json").write_text(json.dumps(record, indent=1) + "\n")
        # One rename makes the folder appear whole: a build that stops half way leaves nothing a later install reuses.
        try:
            Path(tmp).rename(folder)
        except OSError:
            if not any(folder.glob("llama_cpp_python-*.whl")):  # anything else than another build finishing first
                raise
    wheel = sorted(folder.glob("llama_cpp_python-*.whl"))[0]
    say(f"built {wheel.name} in {wall} s, kept in {folder}")
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
