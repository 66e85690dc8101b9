"""`invar kernel check`'s torch side: a kernel against the stock op, on random inputs and on the model's own.

    python -m invar.workers.kernel_check --kernel DIR --digest SHA256 --model DIR [--prompts N] [--trials N]

Prints one JSON object on stdout (read by `invar.cli.kernel`); a refused kernel is one line on stderr, exit 2.

Two comparisons, side by side, because they answer differently for the kernels that matter:

- **op-level, KernelBench-style**: `--trials` seeded random inputs of random shapes, the kernel's result against the
  stock op's: `torch.allclose` at 1e-2 and at 1e-4 (atol = rtol), bit identity, and the largest distance in units
  in the last place (ULP) of float32.
- **the model's inputs**: the op's inputs captured (the kernel's host routes the op to a recorder that answers with
  the stock op) from one forward pass of the model over `--prompts` prompts of the shipped population under two batch
  layouts, every prompt alone (`solo`) and all in one left-padded batch (`batched`), then the same comparison on
  every captured input.

The report names the first captured input where the two disagree: random inputs all allclose at a tolerance, the
model's input not. This is a diagnostic beside the decision, never the decision: the contract decides.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from invar.protocol.server import exit_worker
from invar.workers.common import PatchRefused, load_patches
from invar.workers.kernel_host import FunctionKernel, KernelRefused, _install_hf, stock_op

TOLERANCES = (1e-2, 1e-4)


def max_ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between `a` and `b` in float32 units in the last place (ordered-integer difference)."""
    def ordered(t: torch.Tensor) -> torch.Tensor:
        i = t.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(2**31) - i, i)

    if a.numel() == 0:
        return 0
    return int((ordered(a) - ordered(b)).abs().max())


@dataclass
class Verdicts:
    """One set of comparisons of the kernel against the stock op, over some inputs."""

    inputs: int = 0
    allclose: dict[str, int] = field(default_factory=lambda: {f"{t:g}": 0 for t in TOLERANCES})
    """Inputs on which the kernel is allclose to the stock op, per tolerance."""
    bit_identical: int = 0
    max_ulp: int = 0
    nonfinite: int = 0
    """Inputs on which the kernel returns NaN or infinity where the stock op does not."""

    def add(self, mine: torch.Tensor, stock: torch.Tensor) -> dict[str, Any]:
        self.inputs += 1
        out: dict[str, Any] = {}
        for t in TOLERANCES:
            ok = bool(torch.allclose(mine.float(), stock.float(), atol=t, rtol=t))
            self.allclose[f"{t:g}"] += ok
            out[f"allclose_{t:g}"] = ok
        same = bool(torch.equal(mine, stock))
        self.bit_identical += same
        ulp = max_ulp(mine, stock) if mine.dtype == stock.dtype else -1
        self.max_ulp = max(self.max_ulp, ulp)
        bad = bool(torch.isfinite(stock).all()) and not bool(torch.isfinite(mine).all())
        self.nonfinite += bad
        return {**out, "bit_identical": same, "max_ulp": ulp, "nonfinite": bad}


def _random_inputs(op: str, dtype: torch.dtype, trial: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """KernelBench's kind of input: seeded, random shape, standard normal values."""
    g = torch.Generator().manual_seed(1000 + trial)

    def size(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    b, m, k, n = size(1, 4), size(1, 64), size(8, 128), size(8, 128)
    if op in ("softmax", "log_softmax"):
        return (rand(b, m, n), -1), {}
    if op == "rms_norm":
        return (rand(b, m, k), (k,), rand(k), 1e-6), {}
    if op == "silu":
        return (rand(b, m, k),), {}
    if op == "gelu":
        return (rand(b, m, k),), {"approximate": "none"}
    if op == "matmul":
        return (rand(b, m, k), rand(b, k, n)), {}
    if op == "linear":
        return (rand(b, m, k), rand(n, k), rand(n)), {}
    d = 8 * size(1, 4)
    return (rand(b, 2, m, d), rand(b, 2, m, d), rand(b, 2, m, d)), {"is_causal": True}


def _compare(kernel: FunctionKernel, args: tuple[Any, ...], kwargs: dict[str, Any],
             verdicts: Verdicts) -> dict[str, Any]:
    stock = stock_op(kernel.spec.op)(*args, **kwargs)
    mine = kernel.function(*args, **kwargs)
    return verdicts.add(mine, stock)


def _capture(kernel: FunctionKernel, model_dir: Path, prompts: list[str]) -> dict[str, list[tuple[Any, Any]]]:
    """The op's inputs in one forward pass per layout: every prompt alone, then all in one left-padded batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves them unannotated
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]

    captured: dict[str, list[tuple[Any, Any]]] = {"solo": [], "batched": []}
    layout = ["solo"]
    stock = stock_op(kernel.spec.op)

    def record(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(captured[layout[0]]) < 400:
            keep = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
            captured[layout[0]].append((keep, dict(kwargs)))
        return stock(*args, **kwargs)

    attn = "eager" if kernel.spec.op == "softmax" else "sdpa"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=attn)
    model.eval()  # type: ignore[no-untyped-call]
    real = kernel.function
    kernel.function = record
    undo = _install_hf(kernel)
    try:
        with torch.no_grad():
            for prompt in prompts:
                model(**tokenizer([prompt], return_tensors="pt"))
            layout[0] = "batched"
            model(**tokenizer(prompts, return_tensors="pt", padding=True))
    finally:
        undo()
        kernel.function = real
    return captured


def check(kernel: FunctionKernel, model_dir: Path, prompts: list[str], trials: int) -> dict[str, Any]:
    op = kernel.spec.op
    random_v = Verdicts()
    for dtype_name in kernel.spec.dtypes:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
        for trial in range(trials):
            args, kwargs = _random_inputs(op, dtype, trial)
            _compare(kernel, args, kwargs, random_v)
    passed = {t for t, n in random_v.allclose.items() if n == random_v.inputs}
    captured = _capture(kernel, model_dir, prompts)
    model_v: dict[str, Verdicts] = {}
    first: dict[str, Any] | None = None
    for layout, calls in captured.items():
        model_v[layout] = Verdicts()
        for index, (args, kwargs) in enumerate(calls):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if not tensors or not kernel.takes(tensors[0]):
                continue
            one = _compare(kernel, args, kwargs, model_v[layout])
            disagree = [t for t in sorted(passed) if not one[f"allclose_{t}"]] or (
                ["nonfinite"] if one["nonfinite"] and random_v.nonfinite == 0 else [])
            if first is None and disagree:
                first = {"layout": layout, "index": index, "shapes": [list(a.shape) for a in args
                                                                      if isinstance(a, torch.Tensor)],
                         "fails": disagree, **one}
    return {"op": op, "dtypes": list(kernel.spec.dtypes), "model_dir": str(model_dir), "prompts": len(prompts),
            "random": random_v.__dict__, "model": {k: v.__dict__ for k, v in model_v.items()},
            "first_disagreement": first}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.kernel_check")
    parser.add_argument("--kernel", required=True, help="the kernel's folder (kernel.py + kernel.toml)")
    parser.add_argument("--digest", required=True, help="the folder's digest (invar.patches.patch_digest)")
    parser.add_argument("--model", required=True, help="the model folder whose inputs the op is checked on")
    parser.add_argument("--population", required=True, help="a population file (JSON lines with a prompt)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        patches = load_patches([f"{args.kernel}={args.digest}"], [], [f"{args.kernel}={args.kernel}"])
        kernel = patches.modules[args.kernel]
        if not isinstance(kernel, FunctionKernel):
            raise PatchRefused(f"--kernel {args.kernel}: not a function kernel (no kernel.toml); invar kernel check "
                               "checks a kernel.py function")
        if "hf" not in kernel.spec.engines:
            raise PatchRefused(f"--kernel {args.kernel}: the check runs the op on Hugging Face, and kernel.toml "
                               "does not name hf")
        kernel.self_check()
    except (PatchRefused, KernelRefused) as exc:
        print(f"invar.workers.kernel_check: {exc}", file=sys.stderr, flush=True)
        return 2
    lines = Path(args.population).read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.prompts]
    print(json.dumps(check(kernel, Path(args.model), prompts, args.trials)), flush=True)
    return 0


if __name__ == "__main__":
    exit_worker(main())
