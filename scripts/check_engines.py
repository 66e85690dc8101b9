"""Load a model folder in transformers, vLLM and mlx-lm, and compare their greedy answers.

    HF_HUB_OFFLINE=1 python scripts/check_engines.py [--model models/tiny-arith] [--count 5]

Each engine tokenizes the same prompts itself (BOS in front) and decodes greedily; the core's `ModelTokenizer` turns
the response ids into text and `score` checks them. Prints one line per prompt with every engine's answer and
exits non-zero if the engines disagree on any response tokens or prompt tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from invar.tasks import MAX_ANSWER_CHARS, ModelTokenizer, load_population, score

ROOT = Path(__file__).resolve().parent.parent
BUDGET = MAX_ANSWER_CHARS + 2


def with_transformers(model_dir: Path, prompts: list[str]) -> list[tuple[list[int], list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()  # type: ignore[no-untyped-call]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    with torch.no_grad():
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            ids = model.generate(**enc, do_sample=False, max_new_tokens=BUDGET)  # type: ignore[misc]
            out.append((enc.input_ids[0].tolist(), ids[0, enc.input_ids.shape[1] :].tolist()))
    return out


def with_vllm(model_dir: Path, prompts: list[str]) -> list[tuple[list[int], list[int]]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3,
              max_model_len=128)
    results = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=BUDGET))
    return [(list(r.prompt_token_ids or []), list(r.outputs[0].token_ids)) for r in results]


def with_mlx(model_dir: Path, prompts: list[str]) -> list[tuple[list[int], list[int]]]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(model_dir))[:2]
    out = []
    for prompt in prompts:
        prompt_ids = tokenizer.encode(prompt)
        response: list[int] = []
        for token, _ in generate_step(mx.array(prompt_ids), model, max_tokens=BUDGET):
            response.append(int(token))
            if int(token) == tokenizer.eos_token_id:
                break
        out.append((list(prompt_ids), response))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-arith")
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()
    population = ROOT / "data" / "arith-eval.jsonl"
    problems = load_population(population, population.with_suffix(".sha256").read_text().split()[0])[: args.count]
    prompts = [p.prompt for p in problems]
    vocab = ModelTokenizer.from_model_dir(args.model)
    engines = {"transformers": with_transformers, "vllm": with_vllm, "mlx": with_mlx}
    results = {name: run(args.model, prompts) for name, run in engines.items()}
    agree = True
    for i, p in enumerate(problems):
        answers = {name: vocab.decode(results[name][i][1]) for name in engines}
        same = len({tuple(results[name][i][1]) for name in engines}) == 1
        same &= len({tuple(results[name][i][0]) for name in engines}) == 1
        agree &= same
        shown = "  ".join(f"{name}={answers[name]!r} (loss {score(p.prompt, answers[name])})" for name in engines)
        print(f"{p.id} {p.prompt}{p.answer}  {shown}  {'agree' if same else 'DISAGREE'}")
    print("all engines agree" if agree else "ENGINES DISAGREE")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
