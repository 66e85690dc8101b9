"""Where a matmul silently in bfloat16 (tests/contract/kernels/bf16-matmul) gains layout dependence (docs/kernels.md).

    .venv/bin/python scripts/bf16_layout_probe.py [--model tiny|smollm2] [--prompts N] [--max-tokens N] [--op-only]

Two measurements, printed as one JSON object:

1. **The op alone** (`op`): torch's bfloat16 product on this CPU, each row of a random M-row input alone against the
   same row among M, at the model's linear-layer shapes (K × N) and at reductions K of 512 to 2048; and attention's
   probabilities × values product of one row of length L alone against the same row left-padded by P zero
   probabilities (and P value rows), as a left-padded batch gives it. Counts the rows and elements whose bits differ.
2. **On the model** (`worker`): the hf worker started as the proposed contract's candidate runs it (the
   batch-invariant base less its products, eager attention), with three products: `bf16-matmul` itself, bfloat16
   only on the products whose reduction is at most 1024 long (the others the base's invariant product), and bfloat16
   only on those longer than 1024 (on SmolLM2 the MLP's down projection, 1536; on the tiny model none). Each
   generates the population's first N prompts in one left-padded batch, two shuffled halves and alone (greedy); the
   prompts whose tokens or log-probability bits differ between these layouts are counted, as base_invariance.py
   counts them.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODELS = {"tiny": (REPO / "models" / "tiny-arith", REPO / "data" / "arith-eval.jsonl"),
          "smollm2": (REPO / "models" / "smollm2-135m-instruct", REPO / "data" / "chat-eval.jsonl")}
SHAPES = {"tiny": [(128, 128), (128, 64), (128, 384), (384, 128), (128, 18)],
          "smollm2": [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]}
"""The linear layers' (in, out) sizes: q/o, k/v, gate/up, down, the tied head."""
BASE_REST = ("invariant-softmax", "invariant-log-softmax", "invariant-rms-norm")

VARIANT = '''"""bfloat16 products where {which} only; the other products the base's invariant product (a diagnostic)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "{name}"
REPLACES = frozenset({{"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}})
LONG = {long!r}
"""True: bfloat16 where the reduction is longer than 1024; False: where it is at most 1024."""
_spec = importlib.util.spec_from_file_location("_invariant_product", Path(__file__).parent / "invariant_product.py")
assert _spec is not None and _spec.loader is not None
_inv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_inv)
_state: dict[str, Any] = {{"calls": 0}}


def calls() -> int:
    return int(_state["calls"])


def reset_calls() -> None:
    _state["calls"] = 0


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _state["calls"] += 1
    if (a.shape[-1] > 1024) == LONG:
        return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16)).to(a.dtype)
    return _inv.matmul(a, b)


_COMPOSITE = frozenset({{torch.ops.aten.linear.default, torch.ops.aten.matmul.default}})
_PRODUCTS = frozenset({{torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
                       torch.ops.aten.baddbmm.default}})


class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {{}}
        if func in _COMPOSITE:
            with self:
                return func.decompose(*args, **kwargs)
        floats = all(t.dtype == torch.float32 for t in args if isinstance(t, torch.Tensor))
        if floats and func in _PRODUCTS:
            first = 1 if func in (torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default) else 0
            out = _product(args[first], args[first + 1])
            if first:
                alpha, beta = kwargs.get("alpha", 1), kwargs.get("beta", 1)
                out = out * alpha if alpha != 1 else out
                out = out if beta == 0 else out + (args[0] if beta == 1 else args[0] * beta)
            return out
        return func(*args, **kwargs)


def apply(engine: str, *, poison: bool = False) -> None:
    Mode().__enter__()
'''


def op_alone(model: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    linear = []
    for k, n in SHAPES[model]:
        w = (torch.randn(k, n, generator=g) / k ** 0.5).to(bf)
        for m in (8, 64, 704):
            x = torch.randn(m, k, generator=g).to(bf)
            full = torch.matmul(x, w)[:16].float()
            alone = torch.cat([torch.matmul(x[i:i + 1], w) for i in range(16)]).float()
            diff = full.view(torch.int32) != alone.view(torch.int32)
            linear.append({"k": k, "n": n, "m": m, "rows_differ": int(diff.any(dim=1).sum()), "rows": 16,
                           "elements_differ": int(diff.sum()), "elements": diff.numel()})
    reduction = []
    for k in (512, 1024, 1025, 1536, 2048):
        w = (torch.randn(k, 576, generator=g) / k ** 0.5).to(bf)
        for m in (2, 8, 64, 704):
            x = torch.randn(m, k, generator=g).to(bf)
            rows = min(m, 64)
            full = torch.matmul(x, w)[:rows].float()
            alone = torch.cat([torch.matmul(x[i:i + 1], w) for i in range(rows)]).float()
            diff = full.view(torch.int32) != alone.view(torch.int32)
            reduction.append({"k": k, "n": 576, "m": m, "rows_differ": int(diff.any(dim=1).sum()), "rows": rows,
                              "elements_differ": int(diff.sum()), "elements": diff.numel()})
    attention = []
    head = 64 if model == "smollm2" else 32
    for length in (12, 40, 88, 160):
        for pad in (1, 7, 32):
            p = torch.softmax(torch.randn(16, length, generator=g), dim=-1)
            v = torch.randn(length, head, generator=g)
            alone = torch.matmul(p.to(bf), v.to(bf)).float()
            padded = torch.matmul(torch.cat([torch.zeros(16, pad), p], dim=1).to(bf),
                                  torch.cat([torch.randn(pad, head, generator=g), v]).to(bf)).float()
            diff = alone.view(torch.int32) != padded.view(torch.int32)
            attention.append({"length": length, "pad": pad, "rows_differ": int(diff.any(dim=1).sum()), "rows": 16,
                              "elements_differ": int(diff.sum())})
    return {"linear": linear, "reduction": reduction, "attention": attention}


def varying(patches: list[tuple[str, str, Path | None]], model: Path, reqs: list[dict[str, Any]]) -> int:
    """Prompts whose tokens or log-probability bits differ between one batch, two shuffled halves and alone."""
    from invar import canonical
    from invar.engines import start_worker
    from invar.protocol import Role

    n = len(reqs)
    order = list(range(n))
    random.Random(7).shuffle(order)
    layouts = [[list(range(n))], [order[: n // 2], order[n // 2:]], [[i] for i in range(n)]]
    args: list[str] = []
    for name, digest, folder in patches:
        args += ["--patch", f"{name}={digest}"] + ([] if folder is None else ["--patch-dir", f"{name}={folder}"])
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


def on_model(model_name: str, prompts: int, max_tokens: int, work: Path) -> dict[str, Any]:
    from invar.formats.tokenizer import ModelTokenizer
    from invar.patches import patch_digest

    model, population = MODELS[model_name]
    tok = ModelTokenizer.from_model_dir(model)
    reqs = []
    for i, line in enumerate(population.read_text(encoding="utf-8").splitlines()[:prompts]):
        unit = json.loads(line)
        ids = tok.prompt_ids(messages=unit["messages"]) if "messages" in unit else tok.prompt_ids(unit["prompt"])
        reqs.append({"request_id": unit["id"], "prompt": unit.get("prompt", ""), "prompt_ids": ids, "seed": i,
                     "temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens})
    rest = [(name, patch_digest(name), None) for name in BASE_REST]
    fixture = REPO / "tests" / "contract" / "kernels" / "bf16-matmul"
    out = {"bf16-matmul": varying([*rest, ("./bf16-matmul", patch_digest(fixture), fixture)], model, reqs)}
    for name, which, long in (("bf16-short", "the reduction is at most 1024 long", False),
                              ("bf16-long", "the reduction is longer than 1024", True)):
        folder = work / name
        folder.mkdir()
        (folder / "patch.py").write_text(VARIANT.format(name=name, which=which, long=long), encoding="utf-8")
        shutil.copy(REPO / "patches" / "invariant-matmul" / "kernel.py", folder / "invariant_product.py")
        shutil.copy(REPO / "patches" / "invariant-matmul" / "kernel.c", folder / "kernel.c")
        out[name] = varying([*rest, (f"./{name}", patch_digest(folder), folder)], model, reqs)
    return {"prompts": len(reqs), "max_tokens": max_tokens, "varying": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--op-only", action="store_true", help="only the op alone, no worker")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"model": args.model, "op": op_alone(args.model)}
    if not args.op_only:
        with tempfile.TemporaryDirectory(prefix="invar-bf16-probe-") as tmp:
            result["worker"] = on_model(args.model, args.prompts, args.max_tokens, Path(tmp))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime + own.ru_utime + own.ru_stime, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
