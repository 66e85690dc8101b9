"""`invar kernel check`'s torch side: a kernel against the stock op, on random inputs and on the model's own.

    python -m invar.workers.kernel_check --kernel DIR --digest SHA256 --model DIR [--trials N] [--steps N]
        [--repeats N] < PROMPT_IDS.json

Reads the prompts' token ids (one JSON list of lists of ints) on stdin: the core renders and tokenizes them
(`ModelTokenizer.unit_prompt`: a chat unit through the model's chat template), as `use run` sends them to an
engine. Prints one JSON object on stdout (read by `invar.cli.kernel`); a refused kernel is one line on stderr, exit 2.

Three comparisons, side by side, because they answer differently for the kernels that matter:

- **op-level, KernelBench-style**: `--trials` seeded random inputs of random shapes, the kernel's result against the
  stock op's: `torch.allclose` at 1e-2 and at 1e-4 (atol = rtol), bit identity, and the largest distance in units
  in the last place (ULP) of float32.
- **the model's inputs**: the op's inputs captured (the kernel's host routes the op to a recorder that answers with
  the stock op) while the model runs the prompts the way the Hugging Face worker does (left padded, positions from
  the mask, a prefill then `--steps` greedy decode steps through a KV cache), under two batch layouts, every prompt
  alone (`solo`) and all in one batch (`batched`); then the same comparison on every captured input, each on
  copies of its own.
- **reuse**: what a test that builds new tensors for every call cannot see, a kernel that remembers. The random
  inputs called again on the same tensor objects (the weight operands kept, the activation overwritten in place
  with fresh values, and fresh activations of the same shape), and the model's captured calls replayed in their
  order with the model's own weight tensors (the storage the model ran with, so a cache keyed by a weight's data
  pointer and the shapes answers as it would in the model). Each result against the stock op on the same values.

The report names the first captured input where the verdicts disagree (random inputs all allclose at a tolerance,
the model's input not), and the first reuse call that fails what the same call passed without reuse. This is a
diagnostic beside the decision, never the decision: the contract decides.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from invar.protocol.server import exit_worker
from invar.workers.common import PatchRefused, load_patches, response_end_ids
from invar.workers.kernel_host import FunctionKernel, KernelRefused, _install_hf, stock_op

TOLERANCES = (1e-2, 1e-4)
CAPTURE_BYTES = 3 << 29
"""Per layout, calls are kept until their tensors (weights included: the check copies them) reach 1.5 GiB. On the
tiny model that is every call; on SmolLM2 (about 0.5 GiB of weights a forward) the first three forwards of the
matrix products, many more of the other ops."""
ACTIVATIONS: dict[str, tuple[int, ...]] = {
    "softmax": (0,), "log_softmax": (0,), "rms_norm": (0,), "silu": (0,), "gelu": (0,), "matmul": (0,),
    "linear": (0,), "attention": (0, 1, 2)}
"""The positional arguments of each op that carry activations; the others (a weight, a bias, a shape, a dim) stay
the same objects when the reuse probe calls the kernel again."""


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


@dataclass
class Call:
    """One captured call of the op: its arguments, each a copy except the model's own weights (kept as the tensors
    the model passed, views of its parameters' storage), and which of them are those weights."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    weights: tuple[bool, ...]

    def shapes(self) -> list[list[int]]:
        return [list(a.shape) for a in self.args if isinstance(a, torch.Tensor)]

    def copied(self) -> tuple[Any, ...]:
        """The arguments with the weights copied too: a call of its own, as a unit test makes it."""
        return tuple(a.clone() if w else a for a, w in zip(self.args, self.weights, strict=True))


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


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _run(model: Any, rows: list[list[int]], pad_id: int, steps: int) -> None:
    """The Hugging Face worker's decoding loop (`HFWorker.run_batch`), greedy: the rows left padded into one batch,
    positions from the mask, a prefill keeping the last position's logits, then `steps` steps through a KV cache."""
    from transformers.cache_utils import DynamicCache

    n, width = len(rows), max(len(r) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    for _ in range(steps):
        nxt = out.logits[:, -1, :].float().argmax(-1)
        mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)


def _capture(kernel: FunctionKernel, model_dir: Path, prompts: list[list[int]],
             steps: int) -> dict[str, list[Call]]:
    """The op's calls while the model runs the prompts, every prompt alone, then all in one left-padded batch."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves them unannotated
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]

    captured: dict[str, list[Call]] = {"solo": [], "batched": []}
    size = {"solo": 0, "batched": 0}
    layout = ["solo"]
    stock = stock_op(kernel.spec.op)
    attn = "eager" if kernel.spec.op == "softmax" else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=attn)
    model.eval()  # type: ignore[no-untyped-call]
    cfg = model.config
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else min(response_end_ids(str(model_dir)))
    # A weight reaches the op as itself or as a view of it (`weight.t()` in a linear layer): same storage.
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def own(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in storages

    def record(*args: Any, **kwargs: Any) -> torch.Tensor:
        size[layout[0]] += sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        if size[layout[0]] <= CAPTURE_BYTES:
            weights = tuple(own(a) for a in args)
            captured[layout[0]].append(Call(tuple(a if w else _copy(a) for a, w in zip(args, weights, strict=True)),
                                            {k: _copy(v) for k, v in kwargs.items()}, weights))
        return stock(*args, **kwargs)

    real = kernel.function
    kernel.function = record
    undo = _install_hf(kernel)
    try:
        with torch.no_grad():
            for prompt in prompts:
                _run(model, [prompt], pad_id, steps)
            layout[0] = "batched"
            _run(model, prompts, pad_id, steps)
    finally:
        undo()
        kernel.function = real
    return captured


def _fails(passed: set[str], one: dict[str, Any], nonfinite_ok: bool) -> list[str]:
    """What `one` (a comparison) fails of `passed` (tolerances), or `nonfinite` where that was not seen before."""
    return [t for t in sorted(passed) if not one[f"allclose_{t}"]] or (
        ["nonfinite"] if one["nonfinite"] and not nonfinite_ok else [])


def _repeated(kernel: FunctionKernel, dtype: torch.dtype, trials: int,
              repeats: int) -> Iterator[tuple[str, int, tuple[Any, ...], dict[str, Any]]]:
    """The reuse probe on random inputs: per trial, the inputs, then `repeats` times the activations overwritten in
    place with fresh values (the same tensor objects) and fresh activations of the same shape, the other arguments
    the same objects throughout. Yields (probe, index, args, kwargs) just before each call is compared."""
    acts = ACTIVATIONS[kernel.spec.op]
    index = 0
    for trial in range(trials):
        g = torch.Generator().manual_seed(2000 + trial)
        args, kwargs = _random_inputs(kernel.spec.op, dtype, trial)
        yield "fresh", index, args, kwargs
        index += 1
        for _ in range(repeats):
            for i in acts:
                args[i].copy_(torch.randn(args[i].shape, generator=g).to(dtype))
            yield "in-place", index, args, kwargs
            index += 1
            fresh = tuple(torch.randn(a.shape, generator=g).to(dtype) if i in acts else a for i, a in enumerate(args))
            yield "fresh", index, fresh, kwargs
            index += 1


def check(kernel: FunctionKernel, model_dir: Path, prompts: list[list[int]], trials: int, steps: int,
          repeats: int) -> dict[str, Any]:
    op = kernel.spec.op
    dtypes = [{"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[d]
              for d in kernel.spec.dtypes]
    random_v = Verdicts()
    for dtype in dtypes:
        for trial in range(trials):
            args, kwargs = _random_inputs(op, dtype, trial)
            _compare(kernel, args, kwargs, random_v)
    passed = {t for t, n in random_v.allclose.items() if n == random_v.inputs}
    seen_nonfinite = random_v.nonfinite > 0

    repeated_v = Verdicts()
    reuse_first: dict[str, Any] | None = None
    for dtype in dtypes:
        for probe, index, args, kwargs in _repeated(kernel, dtype, trials, repeats):
            one = _compare(kernel, args, kwargs, repeated_v)
            disagree = _fails(passed, one, seen_nonfinite)
            if reuse_first is None and disagree:
                reuse_first = {"layout": probe, "index": index, "shapes": [list(a.shape) for a in args
                                                                           if isinstance(a, torch.Tensor)],
                               "fails": disagree, **one}

    captured = _capture(kernel, model_dir, prompts, steps)
    model_v: dict[str, Verdicts] = {}
    alone: dict[tuple[str, int], dict[str, Any]] = {}
    first: dict[str, Any] | None = None
    # Every input's copies live until the last is compared, so no two calls share a data pointer: each is a call of
    # its own, as a unit test makes it.
    held: list[tuple[Any, ...]] = []
    for layout, calls in captured.items():
        model_v[layout] = Verdicts()
        for index, call in enumerate(calls):
            tensors = [a for a in call.args if isinstance(a, torch.Tensor)]
            if not tensors or not kernel.takes(tensors[0]):
                continue
            held.append(call.copied())
            one = _compare(kernel, held[-1], call.kwargs, model_v[layout])
            alone[(layout, index)] = one
            disagree = _fails(passed, one, seen_nonfinite)
            if first is None and disagree:
                first = {"layout": layout, "index": index, "shapes": call.shapes(), "fails": disagree, **one}
    del held

    # The replay: the same calls in the model's order, with the model's weights where the call had one. What the
    # same input passed alone and fails here, the kernel got from an earlier call.
    replay_v = Verdicts()
    kept = 0
    for layout, calls in captured.items():
        for index, call in enumerate(calls):
            if (layout, index) not in alone:
                continue
            kept += any(call.weights)
            one = _compare(kernel, call.args, call.kwargs, replay_v)
            before = alone[(layout, index)]
            disagree = _fails({f"{t:g}" for t in TOLERANCES if before[f"allclose_{t:g}"]}, one, before["nonfinite"])
            if reuse_first is None and disagree:
                reuse_first = {"layout": "replay", "index": replay_v.inputs - 1, "shapes": call.shapes(),
                               "fails": disagree, **one}
    return {"op": op, "dtypes": list(kernel.spec.dtypes), "model_dir": str(model_dir), "prompts": len(prompts),
            "steps": steps, "random": random_v.__dict__, "model": {k: v.__dict__ for k, v in model_v.items()},
            "first_disagreement": first,
            "reuse": {"repeated": repeated_v.__dict__, "replay": replay_v.__dict__, "weights_kept": kept,
                      "first_disagreement": reuse_first}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.kernel_check")
    parser.add_argument("--kernel", required=True, help="the kernel's folder (kernel.py + kernel.toml)")
    parser.add_argument("--digest", required=True, help="the folder's digest (invar.patches.patch_digest)")
    parser.add_argument("--model", required=True, help="the model folder whose inputs the op is checked on")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="greedy decode steps after each prefill")
    parser.add_argument("--repeats", type=int, default=2, help="reuse probe: calls again per random input")
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
    prompts = [[int(t) for t in row] for row in json.loads(sys.stdin.read())]
    report = check(kernel, Path(args.model), prompts, args.trials, args.steps, args.repeats)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    exit_worker(main())
