"""The quantization ladder of SmolLM2-135M-Instruct: the GGUF files a user would make from the FP32 folder, each
decided against the FP32 reference on the chat task, and the shipped Q4_1 file decided the same way.

    python scripts/gguf_ladder.py build [--write-pins]   # the rungs, into models/smollm2-ladder/<rung>/, pinned
    python scripts/gguf_ladder.py decide [RUNG ...]      # one sequential use contract per rung, run and admitted
    python scripts/gguf_ladder.py table                  # docs/gguf.md's table and plot, from the kept outputs

Build: llama.cpp's own converter (`convert_hf_to_gguf.py` and its `gguf-py`, read out of the llama-cpp-python source
distribution of the version the llamacpp worker runs, pinned by sha256) writes F32 and F16 from
`models/smollm2-135m-instruct` (build it first: scripts/build_smollm2.py); llama.cpp's quantizer
(`llama_model_quantize`, from the same build the worker loads) makes Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M and Q2_K from
the F32 file. Each rung is a GGUF model folder: the file beside the FP32 folder's tokenizer files (hard links). Every
file's sha256 is checked against models/smollm2-ladder.pins.json (`--write-pins` writes them, after two builds agree).

Decide: per rung, `invar use init` writes the declaration (reference: HF FP32 on the FP32 folder; candidate: the
llamacpp engine on the rung's folder; the 400 chats of data/chat-eval.jsonl, greedy, 8 tokens, the `numeric` scorer,
ε = 0.02 at 95 %, decided sequentially so a clear rung stops early), then `use prepare`, `use run`, `use admit --json`
(kept in docs/gguf/<rung>.admit.json) and `compare numerical --json` (docs/gguf/<rung>.compare.json); `use plan`
with the discordance the run observed gives the sample a fixed-size contract would need (docs/gguf/<rung>.plan.json).
A run already under runs/gguf-ladder/ is resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
FP32 = MODELS / "smollm2-135m-instruct"
SHIPPED = MODELS / "smollm2-135m-instruct-q4_1"
LADDER = MODELS / "smollm2-ladder"
PINS = MODELS / "smollm2-ladder.pins.json"
CACHE = MODELS / "smollm2-cache"
OUT = ROOT / "docs" / "gguf"
RUNS = ROOT / "runs" / "gguf-ladder"

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CONVERTER = "llama_cpp_python-0.3.36/vendor/llama.cpp"
TOKENIZER_FILES = ("chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json")

CONVERTED = {"F32": "f32", "F16": "f16"}
"""Rungs the converter writes, by its --outtype."""
QUANTIZED = {"Q8_0": 7, "Q6_K": 18, "Q5_K_M": 17, "Q4_K_M": 15, "Q3_K_M": 12, "Q2_K": 10}
"""Rungs the quantizer makes from F32, by llama.cpp's `LLAMA_FTYPE_MOSTLY_*` value."""
RUNGS = [*CONVERTED, *QUANTIZED, "shipped-Q4_1"]


def progress(message: str) -> None:
    print(f"[gguf_ladder] {message}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    from invar.canonical import file_sha256

    return file_sha256(path)


def converter() -> Path:
    """llama.cpp's converter folder, out of the pinned source distribution (downloaded once into the cache)."""
    sdist = CACHE / SDIST
    if not sdist.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        progress(f"downloading {SDIST} (no dependencies) into {CACHE}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "llama-cpp-python==0.3.36", "-d", str(CACHE)], check=True)
    if sha256(sdist) != SDIST_SHA256:
        raise SystemExit(f"gguf_ladder: {sdist} has sha256 {sha256(sdist)}, not the pinned {SDIST_SHA256}")
    folder = CACHE / CONVERTER
    if not (folder / "convert_hf_to_gguf.py").is_file():
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(
                (f"{CONVERTER}/convert_hf_to_gguf.py", f"{CONVERTER}/gguf-py/", f"{CONVERTER}/conversion/"))]
            tar.extractall(CACHE, members=members, filter="data")
    return folder


def rung_folder(rung: str) -> Path:
    return SHIPPED if rung == "shipped-Q4_1" else LADDER / rung


def build(write_pins: bool) -> None:
    import llama_cpp

    pins: dict[str, str] = {} if write_pins or not PINS.is_file() else json.loads(PINS.read_text())["files"]
    if not (FP32 / "model.safetensors").is_file():
        raise SystemExit(f"gguf_ladder: {FP32} is missing; build it first: python scripts/build_smollm2.py")
    LADDER.mkdir(parents=True, exist_ok=True)
    work = LADDER / ".files"
    work.mkdir(exist_ok=True)
    tool = converter()
    for rung, outtype in CONVERTED.items():
        target = work / f"smollm2-135m-instruct-{rung}.gguf"
        if not target.is_file():
            progress(f"converting {FP32.name} to {rung} (convert_hf_to_gguf.py --outtype {outtype})")
            env = {**os.environ, "PYTHONPATH": f"{tool / 'gguf-py'}{os.pathsep}{tool}", "NO_LOCAL_GGUF": ""}
            subprocess.run([sys.executable, str(tool / "convert_hf_to_gguf.py"), str(FP32), "--outtype", outtype,
                            "--outfile", str(target)], check=True, env=env, capture_output=True)
    source = work / "smollm2-135m-instruct-F32.gguf"
    for rung, ftype in QUANTIZED.items():
        target = work / f"smollm2-135m-instruct-{rung}.gguf"
        if not target.is_file():
            progress(f"quantizing F32 to {rung} (llama_model_quantize, ftype {ftype})")
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            params.nthread = 1
            code = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
            if code != 0:
                raise SystemExit(f"gguf_ladder: llama_model_quantize returned {code} for {rung}")
    files: dict[str, str] = {}
    for rung in [*CONVERTED, *QUANTIZED]:
        gguf = work / f"smollm2-135m-instruct-{rung}.gguf"
        files[rung] = sha256(gguf)
        if not write_pins and pins.get(rung) != files[rung]:
            raise SystemExit(f"gguf_ladder: {gguf.name} has sha256 {files[rung]}, the pins say {pins.get(rung)}; "
                             "the converter or quantizer is not the pinned one (--write-pins re-pins after two "
                             "builds agree)")
        folder = rung_folder(rung)
        if not folder.is_dir():
            folder.mkdir()
            for source_file in [*(FP32 / name for name in TOKENIZER_FILES), gguf]:
                os.link(source_file, folder / source_file.name)
        progress(f"{rung}: {files[rung][:16]}… {gguf.stat().st_size / 1e6:.1f} MB")
    if write_pins:
        PINS.write_text(json.dumps({"converter": {"sdist": SDIST, "sha256": SDIST_SHA256},
                                    "source": FP32.name, "files": files}, indent=2, sort_keys=True) + "\n")
        progress(f"pinned {PINS}")


def invar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "invar"), *args], capture_output=True, text=True,
                          cwd=ROOT)


def decide(rung: str) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    RUNS.mkdir(parents=True, exist_ok=True)
    decl = RUNS / f"{rung}.toml"
    if not decl.is_file():
        made = invar("use", "init", str(decl), "--model", str(FP32), "--candidate-engine", "llamacpp",
                     "--candidate-model", str(rung_folder(rung)), "--candidate-setting", "parallel=16",
                     "--population", str(ROOT / "data" / "chat-eval.jsonl"), "--scorer", "numeric",
                     "--scorer-setting", 'which="last"', "--temperature", "0", "--max-tokens", "8",
                     "--epsilon", "0.02", "--sequential", "--every-unit", "--batch-size", "16",
                     "--no-invariance", "--party", "chat task owner", "--name", f"smollm2-gguf-{rung.lower()}",
                     "--description", f"SmolLM2-135M-Instruct as the {rung} GGUF on llama.cpp against the HF FP32 "
                                      "reference, greedy, on the chat task.")
        if made.returncode != 0:
            raise SystemExit(f"{rung}: use init failed: {made.stderr.strip()}")
    prepared = invar("use", "prepare", str(decl), "--out", str(RUNS), "--json")
    if prepared.returncode != 0:
        raise SystemExit(f"{rung}: prepare failed: {prepared.stderr.strip()}")
    contract = RUNS / f"smollm2-gguf-{rung.lower()}.contract.json"
    run_dir = RUNS / rung
    started = time.monotonic()
    ran = invar("use", "run", str(contract), "--run", str(run_dir), "--json")
    if ran.returncode != 0:
        raise SystemExit(f"{rung}: use run failed: {ran.stderr.strip()}")
    seconds = time.monotonic() - started
    head = json.loads(ran.stdout)["head"]
    admitted = invar("use", "admit", str(run_dir), "--contract", str(contract), "--expect-head", head, "--json")
    if admitted.returncode not in (0, 10, 11):
        raise SystemExit(f"{rung}: use admit failed: {admitted.stderr.strip()}")
    (OUT / f"{rung}.admit.json").write_text(admitted.stdout)
    compared = invar("compare", "numerical", str(run_dir), "--contract", str(contract), "--json")
    if compared.returncode == 0:
        (OUT / f"{rung}.compare.json").write_text(compared.stdout)
    decision = json.loads(admitted.stdout)
    return {"rung": rung, "use_run_s": round(seconds, 1), "head": head, "answer": decision.get("answer")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--write-pins", action="store_true")
    d = sub.add_parser("decide")
    d.add_argument("rungs", nargs="*", choices=[*RUNGS, []], default=[])
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.write_pins)
    else:
        for rung in args.rungs or RUNGS:
            result = decide(rung)
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
