"""The MLX worker's logsumexp kernel (`mlx_worker.logsumexp_kernels`) gives MLX's own `mx.exp` and `mx.logsumexp`
bit for bit, and the worker reports the same numbers with it as without it. The engine runs in this process, so the
path each table took can be seen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from invar.protocol import Role
from invar.protocol.methods import GENERATE, LEARNER_STEP, LOAD_MODEL, SCORE, serves
from invar.workers import mlx_worker

pytestmark = pytest.mark.engine

PROMPTS = [[1, 5, 6, 14, 7, 8, 17], [1, 9, 9, 15, 4], [1, 13, 12, 5, 6, 14, 7, 8, 17, 9, 15]]
RESPONSE = [5, 6, 14, 7, 8, 17, 2]


def _mlx(table: np.ndarray) -> bytes:
    return np.array(mx.logsumexp(mx.array(table), axis=-1, keepdims=True), dtype=np.float32).tobytes()


def _kernel(table: np.ndarray) -> bytes:
    return np.array(mlx_worker.row_logsumexp(mx.array(table)), dtype=np.float32).tobytes()


def _sweep(stride: int) -> np.ndarray:
    """Every `stride`-th float32 from −0 down to −88: the inputs a logsumexp's exponential meets."""
    return np.arange(0x80000000, 0xC2B00001, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)


@pytest.fixture
def every_table(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every table takes the kernel (the shipped model's are below `LOGSUMEXP_ENTRIES`); the shapes it saw. A test
    sets `LOGSUMEXP_ENTRIES` above every table for MLX's own."""
    assert mlx_worker.logsumexp_matches()
    monkeypatch.setattr(mlx_worker, "LOGSUMEXP_ENTRIES", 0)
    seen: list[tuple[int, ...]] = []
    rows = mlx_worker._logsumexp_rows

    def counting(table: np.ndarray) -> np.ndarray:
        seen.append(table.shape)
        return rows(table)

    monkeypatch.setattr(mlx_worker, "_logsumexp_rows", counting)
    return seen


def test_the_exponential_is_mlx_s_bit_for_bit() -> None:
    """Every 97th float32 in [−88, 0] (the inputs a logsumexp meets: each entry less its row's maximum) and the
    values around the ends of that range, through the kernel's exponential and through `mx.exp`."""
    sweep = _sweep(97)
    ends = np.array([-88.0, np.nextafter(-88.0, -np.inf), np.nextafter(-88.0, 0.0), -87.5, -0.5, -0.0, 0.0,
                     -1e-40, -np.inf, np.nan], dtype=np.float32)
    for x in (sweep, ends):
        ours = np.empty_like(x)
        mlx_worker.logsumexp_kernels()[1](x, ours)
        assert ours.tobytes() == np.array(mx.exp(mx.array(x)), dtype=np.float32).tobytes()


def test_the_kernel_is_mlx_s_logsumexp_bit_for_bit(every_table: list[tuple[int, ...]]) -> None:
    """Rows of two (every 97th float32 in [−88, 0] beside a 0), normal draws from 0.01 to 1,000 in tables of one to
    three axes and of row counts that are and are not a multiple of eight, and the rows MLX's own logsumexp answers
    for (a NaN, ±∞, a row of −∞, zeros of both signs)."""
    sweep = _sweep(97)
    pairs = np.stack([sweep, np.zeros_like(sweep)], axis=1)
    assert _kernel(pairs) == _mlx(pairs)
    rng = np.random.default_rng(5)
    for shape in [(3, 70_001), (16, 4_099), (9, 8_000), (2, 5, 2_000), (40_000,)]:
        for scale in (0.01, 1.0, 3.0, 30.0, 1000.0):
            table = (rng.standard_normal(shape) * scale).astype(np.float32)
            assert _kernel(table) == _mlx(table), (shape, scale)
    odd = rng.standard_normal((8, 1_000)).astype(np.float32)
    odd[0, 5], odd[1, :], odd[2, 7], odd[3, :3], odd[4], odd[5, ::2] = np.nan, -np.inf, np.inf, -np.inf, 0.0, -0.0
    assert _kernel(odd) == _mlx(odd)
    assert (1, 40_000) in every_table  # a table of one axis is one row


def test_a_kernel_that_differs_fails_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe compares every row and every exponential: one last bit changed in either is enough for MLX's own to
    serve."""
    logsumexp, exponentials = mlx_worker.logsumexp_kernels()

    def one_exponential_off(x: np.ndarray, out: np.ndarray) -> None:
        exponentials(x, out)
        out[len(out) // 3] = np.nextafter(out[len(out) // 3], np.float32(np.inf))

    monkeypatch.setattr(mlx_worker, "logsumexp_kernels", lambda: (logsumexp, one_exponential_off))
    assert not mlx_worker.logsumexp_matches.__wrapped__()
    monkeypatch.setattr(mlx_worker, "logsumexp_kernels", lambda: (logsumexp, exponentials))
    assert mlx_worker.logsumexp_matches.__wrapped__()
    rows = mlx_worker._logsumexp_rows

    def off_by_one_bit(table: np.ndarray) -> np.ndarray:
        out = rows(table)
        out[len(out) // 2] = np.nextafter(out[len(out) // 2], np.float32(np.inf))
        return out

    monkeypatch.setattr(mlx_worker, "_logsumexp_rows", off_by_one_bit)
    assert not mlx_worker.logsumexp_matches.__wrapped__()


@pytest.fixture(scope="module")
def engine(load_params: dict[str, Any]) -> mlx_worker.Engine:
    loaded = mlx_worker.Engine(Role.INFERENCE)
    serves(LOAD_MODEL, loaded.load_model)(load_params)
    return loaded


def _calls(engine: mlx_worker.Engine, temperature: float) -> list[dict[str, Any]]:
    requests = [{"request_id": f"r{i}", "prompt_ids": p, "seed": 3 + i, "temperature": temperature, "top_p": 1.0,
                 "max_tokens": 6} for i, p in enumerate(PROMPTS)]
    generated = serves(GENERATE, engine.generate)(
        {"requests": requests, "layout": [[0, 1], [2]], "adapter": None, "reference_adapter": "base"})["outputs"]
    items = [{"item_id": f"s{i}", "prompt_ids": p, "response_tokens": np.asarray(RESPONSE, dtype=np.int32),
              "temperature": temperature, "vocab_steps": [0, len(RESPONSE) - 1]} for i, p in enumerate(PROMPTS)]
    scored = serves(SCORE, engine.score)({"items": items, "adapter": None})["outputs"]
    return [*generated, *scored]


def _bits(outputs: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [(name, np.asarray(value).tobytes()) for out in outputs for name, value in sorted(out.items())
            if isinstance(value, np.ndarray)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_worker_reports_the_same_bits_with_the_kernel(engine: mlx_worker.Engine, temperature: float,
                                                           every_table: list[tuple[int, ...]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`generate` (sampled tokens, their log-probabilities, the reference's) and `score` (tokens and captured rows)
    with every normalizer by the kernel, then with every one by MLX: the same arrays, bit for bit."""
    by_kernel = _calls(engine, temperature)
    assert len(every_table) > 10  # every decode step and every scored item
    monkeypatch.setattr(mlx_worker, "LOGSUMEXP_ENTRIES", 1 << 62)
    every_table.clear()
    by_mlx = _calls(engine, temperature)
    assert every_table == []
    assert _bits(by_kernel) == _bits(by_mlx)
    assert len(_bits(by_kernel)) >= 3 * len(PROMPTS)


def test_the_learner_s_differentiated_loss_keeps_mlx_s_own(load_params: dict[str, Any], tmp_path: Path,
                                                           every_table: list[tuple[int, ...]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The learner's loss is differentiated through its log_softmax, which the kernel has no gradient for: with every
    table allowed the kernel, a step takes none inside the loss and reports the step it reports without it (the
    same proximal log-probabilities, terms and saved weights)."""
    learner = mlx_worker.Engine(Role.LEARNER)
    serves(LOAD_MODEL, learner.load_model)(load_params)
    items = [{"item_id": f"s{i}", "prompt_ids": p, "response_tokens": np.asarray(RESPONSE, dtype=np.int32),
              "temperature": 1.0} for i, p in enumerate(PROMPTS)]
    behavior = [o["logprobs"] for o in serves(SCORE, learner.score)({"items": items, "adapter": None})["outputs"]]
    assert every_table  # the learner's own score takes the kernel

    def step(save_dir: Path) -> tuple[list[tuple[str, bytes]], bytes]:
        samples = [{"prompt_ids": p, "tokens": np.asarray(RESPONSE, dtype=np.int32), "behavior_logprobs": b,
                    "advantage": 1.0 - i} for i, (p, b) in enumerate(zip(PROMPTS, behavior, strict=True))]
        params = {"samples": samples, "temperature": 1.0, "objective": {"clip_low": 0.2, "clip_high": 0.28,
                                                                          "kl_coef": 0.0},
                  "optimizer": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                                "max_grad_norm": 1.0},
                  "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
                  "seed": 11, "save_dir": str(save_dir)}
        fresh = mlx_worker.Engine(Role.LEARNER)
        serves(LOAD_MODEL, fresh.load_model)(load_params)
        result = serves(LEARNER_STEP, fresh.learner_step, read=mlx_worker.read_learner_step)(params)
        weights = b"".join(path.read_bytes() for path in sorted(save_dir.glob("*.safetensors")))
        return _bits([{k: np.asarray(v) for k, v in result.items() if isinstance(v, (np.ndarray, list))}]), weights

    every_table.clear()
    allowed = step(tmp_path / "kernel")
    assert every_table == []  # the step's loss took none
    monkeypatch.setattr(mlx_worker, "LOGSUMEXP_ENTRIES", 1 << 62)
    assert step(tmp_path / "mlx") == allowed
    assert allowed[1]
