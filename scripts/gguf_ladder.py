"""The quantization ladder of SmolLM2-135M-Instruct: the GGUF files a user would make from the FP32 folder, each
decided on the chat task against the F32 file, and the F32 and shipped Q4_1 files against the HF FP32 folder.

    python scripts/gguf_ladder.py build [--write-pins]   # the rungs, into models/smollm2-ladder/<rung>/, pinned
    python scripts/gguf_ladder.py decide [NAME ...]      # one use contract per decision, run and admitted
    python scripts/gguf_ladder.py table                  # docs/gguf.md's table and plot, from the kept outputs
    python scripts/gguf_ladder.py engines [--chats 8]    # greedy tokens of F32, Q8_0, Q4_1 on llama.cpp vs HF FP32

Build: llama.cpp's own converter (`convert_hf_to_gguf.py` and its `gguf-py`, read out of the llama-cpp-python source
distribution of the version the llamacpp worker runs, pinned by sha256) writes F32 and F16 from
`models/smollm2-135m-instruct` (build it first: scripts/build_smollm2.py); llama.cpp's quantizer
(`llama_model_quantize`, from the same build the worker loads) makes Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M and Q2_K from
the F32 file. Each rung is a GGUF model folder: the file beside the FP32 folder's tokenizer files (hard links). Every
file's sha256 is checked against models/smollm2-ladder.pins.json (`--write-pins` writes them, after two builds agree).

Decide: per decision, `invar use init` writes the declaration: a rung against the F32 file on llama.cpp (only the
quantization differs), the F32 file and the shipped Q4_1 file against the HF FP32 folder (`F32-vs-HF`,
`shipped-Q4_1`); a seeded sample of 200 of the 400 chats of data/chat-eval.jsonl, greedy, 8 tokens, the `numeric`
scorer, ε = 0.02 at 95 %, and for the shipped file the same bits alone, in batches of 16 and in shuffled batches of
32. Then `use prepare`, `use run`, `use admit --json` (kept in docs/gguf/<name>.admit.json) and `compare numerical
--json` (docs/gguf/<name>.compare.json). A run already under runs/gguf-ladder/ is resumed. `table` gathers them into
docs/gguf/summary.json and docs/gguf.png, with the units `use plan` says a fixed-size contract needs at the
discordance each run observed.
"""

from __future__ import annotations

import argparse
import hashlib
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


def progress(message: str) -> None:
    print(f"[gguf_ladder] {message}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    from invar.canonical import file_sha256

    return file_sha256(path)


def pinned_sdist() -> Path:
    """llama-cpp-python's source distribution (llama.cpp vendored in it), downloaded once into the cache and checked
    against its pinned sha256; scripts/llamacpp_tools.py builds its tools from the same file."""
    sdist = CACHE / SDIST
    if not sdist.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        progress(f"downloading {SDIST} (no dependencies) into {CACHE}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "llama-cpp-python==0.3.36", "-d", str(CACHE)], check=True)
    # hashlib, not invar's file_sha256: `make install` fetches this before the venv has invar's dependencies.
    with sdist.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{sdist} has sha256 {digest}, not the pinned {SDIST_SHA256}: remove it to download it again")
    return sdist


def converter() -> Path:
    """llama.cpp's converter folder, out of the pinned source distribution (downloaded once into the cache)."""
    sdist = pinned_sdist()
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


DECISIONS = {**{rung: "F32" for rung in [*CONVERTED, *QUANTIZED] if rung != "F32"},
             "F32-vs-HF": "HF", "shipped-Q4_1": "HF"}
"""Each decision by name → its reference: a rung against the F32 file on llama.cpp (only the quantization differs),
or the F32 file and the shipped Q4_1 file against the HF FP32 folder (the engine differs too)."""
SAMPLE = 200
"""Chats per decision, a seeded sample of the 400: what the 2 shared cores allowed for every rung (a call of 64 chats
took 90 s on llama.cpp with the machine loaded); 0 chats worse and 0 better of 200 still bounds the increase well
inside ε."""
INVARIANCE = ("shipped-Q4_1",)
"""The decisions that also require the candidate's bits alone, in batches of 16 and in shuffled batches of 32."""
SETTINGS = ("parallel=32", "context=512")
"""The llamacpp worker's launch: 32 sequences (the shuffled batch of 32 of the invariance layouts), 512 positions
each (the chats' prompts and 8 answer tokens fit)."""


def decide(name: str) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    RUNS.mkdir(parents=True, exist_ok=True)
    candidate = rung_folder("F32" if name == "F32-vs-HF" else name)
    contract_name = f"smollm2-gguf-{name.lower()}"
    decl = RUNS / f"{name}.toml"
    run_dir = RUNS / name
    if not run_dir.exists():  # a fresh declaration names the worker code as it is now; a run resumes under its own
        if DECISIONS[name] == "HF":
            reference = ["--model", str(FP32), "--engine", "hf"]
            launch = [a for setting in SETTINGS for a in ("--candidate-setting", setting)]
            what = "the HF FP32 folder"
        else:
            reference = ["--model", str(rung_folder("F32")), "--engine", "llamacpp"]
            launch = [a for setting in SETTINGS for a in ("--setting", setting)]
            what = "the F32 GGUF on llama.cpp"
        made = invar("use", "init", str(decl), "--force", *reference, *launch, "--candidate-engine", "llamacpp",
                     "--candidate-model", str(candidate), "--population", str(ROOT / "data" / "chat-eval.jsonl"),
                     "--scorer", "numeric", "--scorer-setting", 'which="last"', "--temperature", "0",
                     "--max-tokens", "8", "--epsilon", "0.02", "--sample", str(SAMPLE), "--batch-size", "16",
                     "--invariance" if name in INVARIANCE else "--no-invariance", "--party", "chat task owner",
                     "--name", contract_name,
                     "--description", f"SmolLM2-135M-Instruct as {candidate.name} on llama.cpp against {what}, "
                                      "greedy, on the chat task" + ("; the same answers alone, in batches of 16 and "
                                      "in shuffled batches of 32." if name in INVARIANCE else "."))
        if made.returncode != 0:
            raise SystemExit(f"{name}: use init failed: {made.stderr.strip()}")
    prepared = invar("use", "prepare", str(decl), "--out", str(RUNS), "--json")
    if prepared.returncode != 0:
        raise SystemExit(f"{name}: prepare failed: {prepared.stderr.strip()}")
    contract = RUNS / f"{contract_name}.contract.json"
    started = time.monotonic()
    ran = invar("use", "run", str(contract), "--run", str(run_dir), "--json")
    if ran.returncode != 0:
        raise SystemExit(f"{name}: use run failed: {ran.stderr.strip()}")
    seconds = time.monotonic() - started
    head = json.loads(ran.stdout)["chain_head"]
    admitted = invar("use", "admit", str(run_dir), "--contract", str(contract), "--expect-head", head, "--json")
    if admitted.returncode not in (0, 10, 11):
        raise SystemExit(f"{name}: use admit failed: {admitted.stderr.strip()}")
    (OUT / f"{name}.admit.json").write_text(admitted.stdout)
    compared = invar("compare", "numerical", str(run_dir), "--contract", str(contract), "--json")
    if compared.returncode == 0:
        (OUT / f"{name}.compare.json").write_text(compared.stdout)
    decision = json.loads(admitted.stdout)
    return {"decision": name, "use_run_s": round(seconds, 1), "head": head, "answer": decision.get("answer")}


def plan_units(contract: Path, worse: int, better: int, n: int) -> int | None:
    """`use plan`'s units for the contract's own method at the discordance the run observed (at least 1 in n
    each way, since a rate of 0 plans nothing)."""
    w, b = max(worse, 1) / n, max(better, 1) / n
    planned = invar("use", "plan", str(contract), "--assume", f"worse={w:.6g} better={b:.6g}", "--json")
    if planned.returncode != 0:
        return None
    doc = json.loads(planned.stdout)
    rows = [r for r in doc["rows"] if r["method"] == doc["contract_method"]]
    return int(rows[0]["n"]) if rows and rows[0].get("n") is not None else None


def table() -> None:
    """docs/gguf/summary.json and docs/gguf.png from the kept admit and compare outputs; the table on stdout."""
    rows = []
    for name in DECISIONS:
        admit_path = OUT / f"{name}.admit.json"
        if not admit_path.is_file():
            continue
        admit = json.loads(admit_path.read_text())
        compare_path = OUT / f"{name}.compare.json"
        compare = json.loads(compare_path.read_text()) if compare_path.is_file() else {}
        loss, bound, inv = admit["task_loss"], admit["bound"], admit["invariance"]
        generation = compare.get("generation") or {}
        first = generation.get("first_divergence") or {}
        contract = RUNS / f"smollm2-gguf-{name.lower()}.contract.json"
        rows.append({
            "decision": name, "reference": DECISIONS[name], "answer": admit["answer"], "reason": admit["reason"],
            "n": loss["n"], "worse": loss["worse"], "better": loss["better"],
            "reference_loss": loss["reference_loss"], "candidate_loss": loss["candidate_loss"],
            "bound": [bound["lower"], bound["upper"]], "epsilon": admit["epsilon"],
            "invariance_required": inv.get("required"), "invariant": inv.get("holds") if inv.get("required") else None,
            "units_differing_across_layouts": inv.get("units_differing") if inv.get("required") else None,
            "same_tokens": first.get("none"), "first_divergence_positions": first.get("positions"),
            "max_abs_logprob_delta": (generation.get("max_abs_delta") or {}).get("max"),
            "median_abs_logprob_delta": ((generation.get("max_abs_delta") or {}).get("percentiles") or {}).get("50"),
            "planned_units": plan_units(contract, loss["worse"], loss["better"], loss["n"]),
            "chain_head": admit["chain_head"]})
    (OUT / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| decision | reference | answer | worse / better of n | bound | invariant (units differing) | same "
          "tokens | max abs Δ logprob | units use plan needs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        invariant = "not asked" if not r["invariance_required"] else \
            f"{'yes' if r['invariant'] else 'no'} ({r['units_differing_across_layouts']} differ)"
        delta = r["max_abs_logprob_delta"]
        print(f"| {r['decision']} | {r['reference']} | {r['answer']} | {r['worse']} / {r['better']} of {r['n']} | "
              f"[{r['bound'][0]:.4f}, {r['bound'][1]:.4f}] | {invariant} | {r['same_tokens']} | "
              f"{'' if delta is None else f'{delta:.3g}'} | {r['planned_units'] or 'none reaches power 0.8'} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    colours = {"Admitted": "tab:green", "Violated": "tab:red", "Unknown": "tab:orange"}
    for y, r in enumerate(rows):
        ax.plot(r["bound"], [y, y], color=colours.get(r["answer"], "grey"), linewidth=4)
        ax.plot([(r["worse"] - r["better"]) / r["n"]], [y], "k|", markersize=12)
    ax.axvline(float(rows[0]["epsilon"]) if rows else 0.02, color="black", linestyle="--", linewidth=1)
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.set_yticks(range(len(rows)), [f"{r['decision']} ({r['answer']})" for r in rows])
    ax.invert_yaxis()  # the ladder from the top
    ax.set_xlabel("task loss increase: bound (bar), estimate (tick), ε (dashed)")
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "gguf.png", dpi=120)


def engines(chats: int) -> None:
    """The first `chats` chats, greedy, 8 tokens, on HF FP32 and on llama.cpp with the F32, Q8_0 and shipped Q4_1
    files: per file, the chats whose tokens are HF's and the largest |Δ log-probability| over each chat's shared
    tokens (JSON on stdout)."""
    import numpy as np

    from invar import canonical
    from invar.engines import start_worker
    from invar.tasks import ModelTokenizer

    lines = (ROOT / "data" / "chat-eval.jsonl").read_text().splitlines()[:chats]
    tok = ModelTokenizer.from_model_dir(FP32)
    requests = [{"request_id": str(i), "prompt_ids": tok.prompt_ids(messages=json.loads(line)["messages"]),
                 "seed": i, "temperature": 0.0, "top_p": 1.0, "max_tokens": 8} for i, line in enumerate(lines)]
    outputs = {}
    for name, engine, folder in (("HF FP32", "hf", FP32), ("F32", "llamacpp", rung_folder("F32")),
                                 ("Q8_0", "llamacpp", rung_folder("Q8_0")), ("shipped Q4_1", "llamacpp", SHIPPED)):
        client = start_worker(engine)
        try:
            client.call("load_model", {"model_dir": str(folder), "model_digest": canonical.tree_digest(folder)})
            outputs[name] = client.call("generate", {"requests": requests})["outputs"]
        finally:
            client.close()
    result = {}
    for name in ("F32", "Q8_0", "shipped Q4_1"):
        pairs = list(zip(outputs["HF FP32"], outputs[name], strict=True))
        gaps = [float(np.max(np.abs(a["logprobs"][:n].astype(np.float64) - b["logprobs"][:n])))
                for a, b in pairs for n in [min(a["tokens"].size, b["tokens"].size)]]
        result[name] = {"same_tokens": sum(a["tokens"].tobytes() == b["tokens"].tobytes() for a, b in pairs),
                        "chats": len(pairs), "max_abs_logprob_delta": max(gaps)}
    print(json.dumps(result, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--write-pins", action="store_true")
    d = sub.add_parser("decide")
    d.add_argument("names", nargs="*", choices=[*DECISIONS, []], default=[])
    sub.add_parser("table")
    e = sub.add_parser("engines")
    e.add_argument("--chats", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.write_pins)
    elif args.command == "table":
        table()
    elif args.command == "engines":
        engines(args.chats)
    else:
        for name in args.names or DECISIONS:
            result = decide(name)
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
