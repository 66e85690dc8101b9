"""The architecture table: small random-weight models of six families on HF, vLLM and MLX, through Invar's workers.

    .venv/bin/python scripts/architecture_table.py [--engines hf,vllm,mlx] [--families llama,...]
        [--out docs/cross_engine_architectures.json] [--doc docs/cross_engine.md] [--mlx-doc docs/mlx.md]
    .venv/bin/python scripts/architecture_table.py --from-json docs/cross_engine_architectures.json --doc ... (tables
        from a saved run, no engine)

For each family of `FAMILIES` (built into a temporary folder, seeded) and each engine, one
worker (`invar.engines.start_worker`, float32, inference role; vLLM holds one model for its life, so one worker
per family) is asked to `load_model` the folder and then:

- `generate`: the `PROMPTS` greedy (T = 0), `MAX_TOKENS` tokens or up to the end id; the prompt ids it ran and the
  tokens it chose are compared with HF's;
- `score`: one fixed response (`RESPONSE`) after each prompt, teacher forced at T = 1; its log-probabilities are
  compared with HF's on the same tokens, so max |Δ log-prob| is defined even where greedy tokens part.

An engine that refuses the folder (its worker answers `load_model` with an error) is a row `refused` with the
worker's one line. The JSON keeps every engine's ids, tokens and log-probabilities, and the worker's effective
configuration where it reports one; `--doc` rewrites the table between the markers in docs/cross_engine.md.

The models. Each folder holds the shipped model's character-level tokenizer (`models/tiny-arith`: 18 ids, BOS
`<s>` 1, EOS `</s>` 2, pad 0) and a model of that family with its distinguishing settings switched on and set
away from the values an engine would assume without reading them:

| family | what it exercises |
|---|---|
| llama | rope θ 500,000 under `rope_parameters` only (transformers 5's form) |
| qwen3 | q/k norms, tied embeddings |
| mistral | a sliding window (8) on every layer, shorter than prompt + response |
| gemma2 | local/global layers (window 8), attention and final-logit soft-capping, √96 embedding scale, tied |
| gemma3 | local/global layers, rope θ per layer type (250,000 / 20,000), √96 embedding scale (no bfloat16) |
| phi3 | partial rotary (factor 0.5), fused qkv / gate-up projections |

Weights are drawn by transformers' own init with `initializer_range` 0.5 (seeded): at the usual 0.02 a random model
is near-uniform and its greedy tokens are decided by float32 noise; at 0.5 the top-two gaps are large enough for
greedy tokens to be a real comparison (see docs/cross_engine.md, "Architectures"). Gemma scales the embedding by
√hidden: Gemma 3 (untied) has its embedding multiplied by 0.1 after init, and Gemma 2 (tied, as every Gemma 2 is:
vLLM and mlx-lm refuse an untied one) is drawn at 0.1; its greedy responses repeat one token, so for it the
teacher-forced log-probabilities are the comparison.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.engines import start_worker
from invar.errors import WorkerError
from invar.formats.model_config import ConfigMismatch, check_effective, differences, folder_config, read_config
from invar.tasks import ModelTokenizer
from invar.transport import WorkerClient

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FROM = ROOT / "models" / "tiny-arith"
VOCAB = 18
INIT_RANGE = 0.5
WINDOW = 8
"""Sliding window of the local layers: shorter than a prompt plus its response, so it changes the output."""


@dataclass(frozen=True)
class Family:
    """One architecture family: the transformers config class and the settings of its small model."""

    name: str
    config_class: str
    model_class: str
    settings: dict[str, Any] = field(default_factory=dict)
    embed_multiplier: float = 1.0
    """The input embedding is multiplied by this after init: Gemma scales it by √hidden, and at the common init
    range it would swamp every layer's contribution (each step would repeat the last token)."""


_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 128, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 0, "initializer_range": INIT_RANGE,
}
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 64, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500_000.0}}),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {
        "hidden_size": 64, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}}),
    Family("mistral", "MistralConfig", "MistralForCausalLM", {
        "hidden_size": 64, "tie_word_embeddings": False, "sliding_window": WINDOW,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100_000.0}}),
    Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM", {
        "hidden_size": 96, "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 32, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True, "initializer_range": 0.1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0}}),
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", {
        "hidden_size": 96, "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 32,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 250_000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 20_000.0}},
        "tie_word_embeddings": False}, embed_multiplier=0.1),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", {
        "hidden_size": 64, "num_key_value_heads": 2, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5},
        "partial_rotary_factor": 0.5}),
)}


def build(name: str, folder: Path, seed: int = 0) -> Path:
    """Write family `name`'s random-weight model (seeded) and the shipped tokenizer into `folder`."""
    import torch
    import transformers

    family = FAMILIES[name]
    folder.mkdir(parents=True, exist_ok=True)
    for file in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(TOKENIZER_FROM / file, folder / file)
    config = getattr(transformers, family.config_class)(**{**_COMMON, **family.settings})
    torch.manual_seed(seed)
    model = getattr(transformers, family.model_class)(config).to(torch.float32).eval()
    if family.embed_multiplier != 1.0:
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(family.embed_multiplier)
    model.save_pretrained(folder, safe_serialization=True)
    written = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert written["model_type"] == config.model_type, written
    return folder


ENGINES = ("hf", "vllm", "mlx")
PROMPTS = ("12+34=", "987-654=", "3*7=", "55+5+55=")
RESPONSE = [5, 6, 14, 7, 8, 17, 9, 9, 15, 4, 13, 12]
"""A fixed response, teacher forced after every prompt: 12 tokens, prompt + response past the window of 8."""
MAX_TOKENS = 12
TOLERANCE = 1e-4
"""|Δ log-prob| (nats) allowed between an engine and HF on the same tokens: float32 kernels differ by rounding
(8.6e-6 to 7.6e-5 measured here, docs/cross_engine.md); a setting read otherwise moves them by 1e-2 and more."""
BEGIN, END = "<!-- architecture-table:begin -->", "<!-- architecture-table:end -->"
MLX_BEGIN, MLX_END = "<!-- mlx-gap:begin -->", "<!-- mlx-gap:end -->"


def load_params(folder: Path) -> dict[str, Any]:
    return {"model_dir": str(folder), "model_digest": canonical.tree_digest(folder), "dtype": "float32",
            "quantization": "none", "adapter": None}


def run_one(client: WorkerClient, engine: str, folder: Path) -> dict[str, Any]:
    """Load `folder` on a started worker, then generate and score; `refused` with the worker's line if it says no,
    or with the core's if the engine's effective configuration is not the folder's (then measured all the same)."""
    try:
        loaded = client.call("load_model", load_params(folder), timeout=900.0)
    except WorkerError as exc:
        line = " ".join(str(exc).split()).replace(str(folder), folder.name)
        return {"status": "refused", "refusal": line, "refused_by": "worker"}
    refusal = None
    if loaded.get("effective_config") is not None:
        try:
            check_effective(folder, engine, loaded["effective_config"])
        except ConfigMismatch as exc:
            # measured all the same: the figures show what the refusal keeps out
            refusal = str(exc).replace(str(folder), folder.name)
    try:
        return measure(client, folder, refusal, loaded.get("effective_config"))
    except WorkerError as exc:  # an engine that loads a folder it cannot run: the call's error is the row
        line = " ".join(str(exc).split()).replace(str(folder), folder.name)
        if refusal is None:
            return {"status": "refused", "refusal": f"fails: {line}", "refused_by": "worker"}
        return {"status": "refused", "refusal": refusal, "refused_by": "effective configuration",
                "effective_config": loaded.get("effective_config"), "measured": f"fails: {line}"}


def measure(client: WorkerClient, folder: Path, refusal: str | None,
            effective: dict[str, Any] | None) -> dict[str, Any]:
    """`generate` and `score` on a loaded worker: the figures of one row."""
    tokenizer = ModelTokenizer.from_model_dir(folder)
    ids = [tokenizer.prompt_ids(prompt=p) for p in PROMPTS]
    gen = client.call("generate", {"requests": [
        {"request_id": f"p{i}", "prompt": p, "prompt_ids": pid, "seed": 0, "temperature": 0.0, "top_p": 1.0,
         "max_tokens": MAX_TOKENS} for i, (p, pid) in enumerate(zip(PROMPTS, ids, strict=True))]}, timeout=900.0)
    score = client.call("score", {"items": [
        {"item_id": f"p{i}", "prompt_ids": pid, "response_tokens": np.asarray(RESPONSE, dtype=np.int32),
         "temperature": 1.0, "vocab_steps": []} for i, pid in enumerate(ids)], "adapter": None}, timeout=900.0)
    return {
        "status": "runs" if refusal is None else "refused",
        "refusal": refusal,
        "refused_by": None if refusal is None else "effective configuration",
        "effective_config": effective,
        "prompt_ids": [np.asarray(o["prompt_tokens"]).tolist() for o in gen["outputs"]],
        "tokens": [np.asarray(o["tokens"]).tolist() for o in gen["outputs"]],
        "logprobs": [np.asarray(o["logprobs"], dtype=np.float32).tolist() for o in gen["outputs"]],
        "scored": [np.asarray(o["logprobs"], dtype=np.float32).tolist() for o in score["outputs"]],
    }


def run_engine(engine: str, folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Every family on one engine: one worker for all (a vLLM worker holds one model: one worker each)."""
    out: dict[str, dict[str, Any]] = {}
    client: WorkerClient | None = None
    try:
        for name, folder in folders.items():
            if client is None:
                client = start_worker(engine)
            out[name] = run_one(client, engine, folder)
            print(f"{engine} {name}: {out[name]['status']} {out[name].get('refusal', '')}", flush=True)
            if engine == "vllm":
                client.close()
                client = None
    finally:
        if client is not None:
            client.close()
    return out


def compare(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The row's figures: same prompt ids, same greedy tokens, max |Δ log-prob| of the scored response."""
    if "scored" not in other or "scored" not in reference:
        return {"status": other["status"], "refusal": other.get("refusal")}
    a = np.asarray([x for row in reference["scored"] for x in row], dtype=np.float64)
    b = np.asarray([x for row in other["scored"] for x in row], dtype=np.float64)
    delta = float(np.max(np.abs(a - b)))
    out: dict[str, Any] = {
        "status": other["status"],
        "prompt_ids_equal": reference["prompt_ids"] == other["prompt_ids"],
        "greedy_equal": reference["tokens"] == other["tokens"],
        "greedy_prompts_equal": sum(x == y for x, y in zip(reference["tokens"], other["tokens"], strict=True)),
        "max_abs_delta_logprob": delta,
        "within_tolerance": delta <= TOLERANCE,
    }
    return out


def config_equal(folder: Path, row: dict[str, Any]) -> bool | None:
    """Whether the engine's effective configuration is the folder's (None: the worker reports none)."""
    effective = row.get("effective_config")
    if effective is None:
        return None
    return not differences(folder_config(read_config(folder)), effective)


def table(results: dict[str, dict[str, dict[str, Any]]], engines: list[str]) -> str:
    """The markdown table: one row per family and engine; a refused row keeps the figures measured past it."""
    lines = ["| family | engine | runs / refused | same prompt ids | greedy tokens equal | max abs Δ log-prob vs HF | "
             "effective config equal |", "|---|---|---|---|---|---|---|"]
    yes = {True: "yes", False: "no", None: "not reported"}
    for family in results:
        for engine in engines:
            row = results[family][engine]
            status = "runs" if row["status"] == "runs" else f"refused: {row['refusal']}"
            eq = yes[row.get("config_equal")]
            if "scored" not in row:
                past = f" (past the refusal, generate {row['measured']})" if row.get("measured") else ""
                lines.append(f"| {family} | {engine} | {status}{past} | | | | {eq} |")
            elif engine == "hf":
                lines.append(f"| {family} | hf | {status} | (reference) | (reference) | 0 | {eq} |")
            else:
                c = row["vs_hf"]
                lines.append(f"| {family} | {engine} | {status} | {yes[c['prompt_ids_equal']]} | "
                             f"{c['greedy_prompts_equal']}/{len(PROMPTS)} | {c['max_abs_delta_logprob']:.1e} | {eq} |")
    return "\n".join(lines)


def mlx_gap(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """docs/mlx.md's table: MLX against HF on each family, and what the core says of MLX's configuration."""
    lines = ["| family | MLX | greedy tokens equal | max abs Δ log-prob vs HF |", "|---|---|---|---|"]
    for family, rows in results.items():
        row = rows.get("mlx")
        if row is None:
            continue
        c = row.get("vs_hf", {})
        said = "runs" if row["status"] == "runs" else f"refused: {row['refusal'].split(': ', 1)[-1].split(';')[0]}"
        if "max_abs_delta_logprob" in c:
            lines.append(f"| {family} | {said} | {c['greedy_prompts_equal']}/{len(PROMPTS)} | "
                         f"{c['max_abs_delta_logprob']:.1e} |")
        else:
            lines.append(f"| {family} | {said} | {row.get('measured', '')} | |")
    return "\n".join(lines)


def _rewrite(path: Path, begin: str, end: str, text: str) -> None:
    doc = path.read_text(encoding="utf-8")
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} holds no {begin} ... {end} markers; add them where the table goes")
    head, rest = doc.split(begin, 1)
    path.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--doc", type=Path, default=None)
    parser.add_argument("--mlx-doc", type=Path, default=None,
                        help="also write MLX's gap to HF per family between the mlx-gap markers of this file")
    parser.add_argument("--set", action="append", default=[], metavar="FAMILY.KEY=JSON",
                        help="change one config setting of a family (e.g. gemma2.attn_logit_softcapping=null)")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="render the tables from a run this script saved with --out, starting no engine")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text(encoding="utf-8"))["results"]
        engines = list(next(iter(saved.values())))
        if args.doc is not None:
            _rewrite(args.doc, BEGIN, END, table(saved, engines))
        if args.mlx_doc is not None:
            _rewrite(args.mlx_doc, MLX_BEGIN, MLX_END, mlx_gap(saved))
        print(table(saved, engines))
        return 0
    for change in args.set:
        target, _, value = change.partition("=")
        name, _, key = target.partition(".")
        if name not in FAMILIES or not key or not value:
            parser.error(f"--set {change!r}: expected FAMILY.KEY=JSON with FAMILY one of {', '.join(FAMILIES)}")
        family = FAMILIES[name]
        FAMILIES[name] = Family(family.name, family.config_class, family.model_class,
                                {**family.settings, key: json.loads(value)}, family.embed_multiplier)
    engines = [e for e in args.engines.split(",") if e]
    families = [f for f in args.families.split(",") if f]
    if engines[0] != "hf":
        parser.error("--engines: hf first (the reference every other engine is compared with)")
    with tempfile.TemporaryDirectory(prefix="architectures-") as tmp:
        folders = {name: build(name, Path(tmp) / name) for name in families}
        with ThreadPoolExecutor(len(engines)) as pool:
            runs = dict(zip(engines, pool.map(lambda e: run_engine(e, folders), engines), strict=True))
        results: dict[str, dict[str, dict[str, Any]]] = {}
        for family in families:
            results[family] = {}
            for engine in engines:
                row = dict(runs[engine][family])
                row["config_equal"] = config_equal(folders[family], row)
                if engine != "hf":
                    row["vs_hf"] = compare(runs["hf"][family], row)
                results[family][engine] = row
    text = table(results, engines)
    print(text)
    if args.out is not None:
        document = {"command": "python scripts/architecture_table.py " + " ".join(argv or sys.argv[1:]),
                    "prompts": list(PROMPTS), "response": RESPONSE, "max_tokens": MAX_TOKENS,
                    "tolerance": TOLERANCE, "families": {n: FAMILIES[n].settings
                                                         for n in families}, "results": results}
        args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if args.doc is not None:
        _rewrite(args.doc, BEGIN, END, text)
    if args.mlx_doc is not None:
        _rewrite(args.mlx_doc, MLX_BEGIN, MLX_END, mlx_gap(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
