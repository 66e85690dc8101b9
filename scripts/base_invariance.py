"""Whether the batch-invariant base (patches/invariant-*) makes a model's Hugging Face worker batch invariant.

    .venv/bin/python scripts/base_invariance.py [--model tiny|smollm2|DIR] [--prompts N] [--max-tokens N]

Starts the hf worker twice on the model (float32, greedy): stock with eager attention, and with the whole base. Each
generates the population's first N prompts (a chat population's messages rendered by the core's tokenizer) in one
left-padded batch, in two shuffled halves, and every prompt alone, and the script counts the prompts whose tokens or
log-probability bits differ between any two of these layouts. Prints one JSON object (counts, CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
from pathlib import Path
from typing import Any

from invar import canonical
from invar.engines import start_worker
from invar.formats.tokenizer import ModelTokenizer
from invar.patches import patch_digest
from invar.protocol import Role

REPO = Path(__file__).resolve().parents[1]
BASE = ("invariant-matmul", "invariant-softmax", "invariant-log-softmax", "invariant-rms-norm")
MODELS = {"tiny": (REPO / "models" / "tiny-arith", REPO / "data" / "arith-eval.jsonl"),
          "smollm2": (REPO / "models" / "smollm2-135m-instruct", REPO / "data" / "chat-eval.jsonl")}


def requests(model: Path, population: Path, n: int, max_tokens: int) -> list[dict[str, Any]]:
    tok = ModelTokenizer.from_model_dir(model)
    out = []
    for i, line in enumerate(population.read_text(encoding="utf-8").splitlines()[:n]):
        unit = json.loads(line)
        ids = tok.prompt_ids(messages=unit["messages"]) if "messages" in unit else tok.prompt_ids(unit["prompt"])
        out.append({"request_id": unit["id"], "prompt": unit.get("prompt", ""), "prompt_ids": ids, "seed": i,
                    "temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens})
    return out


def varying(args: list[str], model: Path, reqs: list[dict[str, Any]]) -> int:
    """Prompts whose tokens or log-probability bits differ between the layouts."""
    n = len(reqs)
    order = list(range(n))
    random.Random(7).shuffle(order)
    layouts = [[list(range(n))], [order[: n // 2], order[n // 2:]], [[i] for i in range(n)]]
    worker = start_worker("hf", Role.INFERENCE, args=args)
    try:
        worker.call("load_model", {"model_dir": str(model), "model_digest": canonical.tree_digest(model),
                                   "dtype": "float32", "quantization": "none", "adapter": None})
        runs = [worker.call("generate", {"requests": reqs, "layout": layout, "adapter": None,
                                         "reference_adapter": None})["outputs"] for layout in layouts]
    finally:
        worker.close()
    return sum(1 for i in range(n) if len({(r[i]["tokens"].tobytes(), r[i]["logprobs"].tobytes())
                                           for r in runs}) > 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder (with --population)")
    parser.add_argument("--population", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    model, population = MODELS.get(args.model, (Path(args.model), args.population))
    if population is None or not model.is_dir():
        print("base_invariance: name tiny, smollm2, or a model folder with --population", file=sys.stderr)
        return 2
    reqs = requests(model, args.population or population, args.prompts, args.max_tokens)
    stock = varying(["--attn-implementation", "eager"], model, reqs)
    base = varying([a for name in BASE for a in ("--patch", f"{name}={patch_digest(name)}")], model, reqs)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"model": str(model.name), "prompts": len(reqs), "max_tokens": args.max_tokens,
                      "layouts": ["one batch", "shuffled halves", "alone"], "stock_eager_varying": stock,
                      "base_varying": base, "workers_cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
