"""llama.cpp's own command-line tools, built from the source the llamacpp worker runs: `llama-perplexity` (for its
`--kl-divergence`), which llama-cpp-python does not build.

    python scripts/llamacpp_tools.py build [--jobs 2]   # build (or reuse) the tool; prints its path and the time
    python scripts/llamacpp_tools.py path               # the tool's path, or exit 2 if it is not built

The source is the vendored llama.cpp inside the pinned llama-cpp-python 0.3.36 source distribution
(models/smollm2-cache/llama_cpp_python-0.3.36.tar.gz, sha256 checked; downloaded once if absent, as
scripts/gguf_ladder.py does), extracted under models/smollm2-cache/llama-tools/. It is configured as the wheel's
build is (the CPU backend, for x86-64-v3 where the wheel is built for it, else native: scripts/llamacpp_wheel.py; no
CURL) and only the `llama-perplexity` target is built, under `nice`. The build and its timing (`build.json`) are kept
there: a later `build` with the same source and options reuses it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

# The same pinned source distribution as the ladder's converter.
from gguf_ladder import CACHE, SDIST_SHA256, pinned_sdist
from llamacpp_wheel import fixed_isa

ROOT = Path(__file__).resolve().parents[1]
TOOLS = CACHE / "llama-tools"
VENDOR = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
TARGET = "llama-perplexity"
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", *(fixed_isa() or ["-DGGML_NATIVE=ON"]), "-DLLAMA_CURL=OFF",
                 "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON")
"""The wheel's CPU options (its instruction set, no CURL), static so the tool carries its own llama.cpp."""


def say(message: str) -> None:
    print(f"[llamacpp_tools] {message}", file=sys.stderr, flush=True)


def tool_path() -> Path:
    return TOOLS / "build" / "bin" / TARGET


def source() -> Path:
    """The vendored llama.cpp, extracted once from the pinned source distribution."""
    src = TOOLS / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    sdist = pinned_sdist()
    partial = TOOLS / "src.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDOR) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(VENDOR):]
        tar.extractall(partial, members=[m for m in members if m.name], filter="data")
    partial.rename(src)
    return src


def build(jobs: int) -> Path:
    tool = tool_path()
    record = TOOLS / "build.json"
    wanted = {"sdist_sha256": SDIST_SHA256, "cmake_options": list(CMAKE_OPTIONS), "target": TARGET}
    if tool.is_file() and record.is_file():
        kept = json.loads(record.read_text())
        if {k: kept.get(k) for k in wanted} == wanted:
            say(f"reusing {tool} (built in {kept['seconds']:.0f} s on {kept['finished_utc']})")
            return tool
    src = source()
    out = TOOLS / "build"
    started = time.perf_counter()
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", *CMAKE_OPTIONS], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["nice", "-n", "10", "cmake", "--build", str(out), "--target", TARGET, "-j", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    record.write_text(json.dumps({**wanted, "jobs": jobs, "seconds": round(seconds, 1),
                                  "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2)
                      + "\n")
    say(f"built {tool} in {seconds:.0f} s ({jobs} jobs)")
    return tool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamacpp_tools.py")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or reuse) llama-perplexity")
    b.add_argument("--jobs", type=int, default=2)
    sub.add_parser("path", help="the built tool's path")
    args = parser.parse_args(argv)
    if args.command == "path":
        if not tool_path().is_file():
            print(f"llamacpp_tools: {tool_path()} is not built; run scripts/llamacpp_tools.py build", file=sys.stderr)
            return 2
        print(tool_path())
        return 0
    if args.jobs < 1:
        print("llamacpp_tools: --jobs must be ≥ 1", file=sys.stderr)
        return 2
    print(build(args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
