"""The MLX worker's output layer runs only at the positions whose log-probabilities are used (generate's prompt: its
last position; teacher forcing: the response's), and what it reports is the whole forward's, bit for bit, on the
shipped model. The engine runs in this process, so the rows reaching the output layer can be counted."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from invar.protocol import Role
from invar.protocol.methods import GENERATE, LOAD_MODEL, SCORE, serves
from invar.workers import mlx_worker

pytestmark = pytest.mark.engine

PROMPTS = [[1, 5, 6, 14, 7, 8, 17], [1, 9, 9, 15, 4], [1, 13, 12, 5, 6, 14, 7, 8, 17, 9, 15]]
RESPONSE = [5, 6, 14, 7, 8, 17, 2]


def _engine(load_params: dict[str, Any]) -> mlx_worker.Engine:
    engine = mlx_worker.Engine(Role.INFERENCE)
    serves(LOAD_MODEL, engine.load_model)(load_params)
    return engine


@pytest.fixture(scope="module")
def engines(load_params: dict[str, Any]) -> tuple[mlx_worker.Engine, mlx_worker.Engine]:
    """The engine as loaded (the output layer at the used rows), and one made to run the whole forward."""
    kept, whole = _engine(load_params), _engine(load_params)
    assert whole.m is not None
    whole.m.head_rows = False
    return kept, whole


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Positions reaching the shipped model's (tied) output layer, per call, counted as the real layer runs: the
    embedding's own product (the whole forward) or the worker's on its [H, V] copy (`_Head`)."""
    counted: list[int] = []
    embedding: Any = nn.Embedding  # type: ignore[attr-defined]  # mlx.nn's stubs omit its layers
    for layer in (embedding, mlx_worker._Head):
        def counting(self: Any, x: mx.array, as_linear: Any = layer.as_linear) -> mx.array:
            counted.append(int(np.prod(x.shape[:-1])))
            return cast(mx.array, as_linear(self, x))

        monkeypatch.setattr(layer, "as_linear", counting)
    return counted


def _generate(engine: mlx_worker.Engine, temperature: float) -> list[dict[str, Any]]:
    requests = [{"request_id": f"r{i}", "prompt_ids": p, "seed": 7 + i, "temperature": temperature, "top_p": 1.0,
                 "max_tokens": 5} for i, p in enumerate(PROMPTS)]
    out: list[dict[str, Any]] = serves(GENERATE, engine.generate)(
        {"requests": requests, "layout": [[0, 1, 2]], "adapter": None, "reference_adapter": None})["outputs"]
    return out


def _score(engine: mlx_worker.Engine) -> list[dict[str, Any]]:
    items = [{"item_id": f"s{i}", "prompt_ids": p, "response_tokens": np.asarray(RESPONSE, dtype=np.int32),
              "temperature": 0.7, "vocab_steps": [0, len(RESPONSE) - 1]} for i, p in enumerate(PROMPTS)]
    out: list[dict[str, Any]] = serves(SCORE, engine.score)({"items": items, "adapter": None})["outputs"]
    return out


def test_the_shipped_model_takes_the_output_layer_at_the_used_rows_only(
        engines: tuple[mlx_worker.Engine, mlx_worker.Engine], rows: list[int]) -> None:
    kept, _ = engines
    assert kept.m is not None
    assert kept.m.head_rows
    assert kept.m.head is not None  # the output layer's [H, V] copy is what multiplies
    assert kept.m.head.shape == (128, kept.m.vocab_size)
    _generate(kept, 1.0)
    # The batch's prefill: one row per prompt (its last position), then one per prompt per step.
    assert rows[0] == len(PROMPTS)
    assert set(rows) == {len(PROMPTS)}
    rows.clear()
    _score(kept)
    # Teacher forcing: the response's positions (the prompt's last onward), not the prompt's others.
    assert rows == [len(RESPONSE)] * len(PROMPTS)


def test_the_whole_forward_would_take_every_position(engines: tuple[mlx_worker.Engine, mlx_worker.Engine],
                                                      rows: list[int]) -> None:
    _, whole = engines
    _score(whole)
    assert rows == [len(p) + len(RESPONSE) - 1 for p in PROMPTS]


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_numbers_are_the_whole_forward_s(engines: tuple[mlx_worker.Engine, mlx_worker.Engine],
                                             temperature: float) -> None:
    kept, whole = engines
    for a, b in zip(_generate(kept, temperature), _generate(whole, temperature), strict=True):
        assert a["tokens"].tobytes() == b["tokens"].tobytes()
        assert a["logprobs"].tobytes() == b["logprobs"].tobytes()
    for a, b in zip(_score(kept), _score(whole), strict=True):
        assert a["logprobs"].tobytes() == b["logprobs"].tobytes()
        assert a["vocab_logprobs"].tobytes() == b["vocab_logprobs"].tobytes()


def test_a_forward_of_another_shape_runs_whole(load_params: dict[str, Any]) -> None:
    """A model whose forward does not run its decoder stack as `model` then an output layer is neither cut nor taken
    in column blocks: the probes at load find it and the whole forward serves it."""
    engine = _engine(load_params)
    assert engine.m is not None

    class Wrapped:  # a multimodal-style wrapper: the stack lives under another name
        def __init__(self, inner: Any) -> None:
            self.language_model = inner

        def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
            return self.language_model(inputs, cache=cache)  # type: ignore[no-any-return]

    vocab = engine.m.vocab_size
    assert mlx_worker._rows_kept_exactly(engine.m.model, vocab)
    assert not mlx_worker._rows_kept_exactly(Wrapped(engine.m.model), vocab)
    assert mlx_worker._blocks_keep_bits(engine.m.model, vocab, 5)
    assert not mlx_worker._blocks_keep_bits(Wrapped(engine.m.model), vocab, 5)



def test_the_tiled_kernel_gives_the_bundled_blas_s_product_bit_for_bit(
        engines: tuple[mlx_worker.Engine, mlx_worker.Engine]) -> None:
    """`TiledHead` forms each sum as the reference BLAS does, so its rows are MLX's x @ weight.T bit for bit: on the
    shipped model's output layer and on a random one whose vocabulary is no whole number of tiles, for any count of
    rows."""
    kept, _ = engines
    assert kept.m is not None
    assert isinstance(kept.m.head, mlx_worker.TiledHead)  # the kernel passed the load's probe
    layer = mlx_worker.output_layer(kept.m.model)
    rng = np.random.default_rng(3)
    odd = mx.array(rng.standard_normal((1000, 48), dtype=np.float32))
    for weight in (layer.weight, odd):
        head = mlx_worker.TiledHead(weight)
        for rows in (1, 5, 33):
            x = mx.array(rng.standard_normal((1, rows, weight.shape[1]), dtype=np.float32))
            ours, blas = head(x), x @ weight.T
            assert ours.shape == blas.shape
            assert np.array(ours).tobytes() == np.array(blas).tobytes()


def test_the_stored_copy_serves_where_the_kernel_is_not_tried(
        load_params: dict[str, Any], engines: tuple[mlx_worker.Engine, mlx_worker.Engine]) -> None:
    """Without the kernel (as under `--blas openblas`) the [H, V] copy serves, with the same numbers."""
    kept, _ = engines
    stored = mlx_worker.Engine(Role.INFERENCE, tiled=False)
    serves(LOAD_MODEL, stored.load_model)(load_params)
    assert stored.m is not None
    assert stored.m.head_rows
    assert isinstance(stored.m.head, mlx_worker.StoredHead)
    for a, b in zip(_generate(kept, 1.0), _generate(stored, 1.0), strict=True):
        assert a["tokens"].tobytes() == b["tokens"].tobytes()
        assert a["logprobs"].tobytes() == b["logprobs"].tobytes()
    for a, b in zip(_score(kept), _score(stored), strict=True):
        assert a["logprobs"].tobytes() == b["logprobs"].tobytes()
        assert a["vocab_logprobs"].tobytes() == b["vocab_logprobs"].tobytes()


def test_score_reads_the_whole_log_softmax_table_s_entries(
        engines: tuple[mlx_worker.Engine, mlx_worker.Engine]) -> None:
    """`score` forms log-probabilities only where they are read; they are the whole [T, V] log_softmax table's
    entries, bit for bit (at T = 0.7, as `_score` asks)."""
    kept, _ = engines
    response = np.asarray(RESPONSE, dtype=np.int32)
    for prompt, out in zip(PROMPTS, _score(kept), strict=True):
        table = kept.teacher(prompt, response, 0.7)
        assert out["logprobs"].tobytes() == mlx_worker._gather(table, response).tobytes()
        rows = np.array(table, dtype=np.float32)[[0, len(RESPONSE) - 1]]
        assert out["vocab_logprobs"].tobytes() == rows.tobytes()


def test_where_rows_are_not_kept_the_whole_forward_runs_in_column_blocks(
        load_params: dict[str, Any], engines: tuple[mlx_worker.Engine, mlx_worker.Engine],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe finds that a row's bits depend on how many rows the product holds (OpenBLAS on some CPUs),
    the whole forward runs, its output layer taken a block of vocabulary columns at a time and each block cut to the
    used positions before the next: every position reaches each block's product, and the numbers are the whole
    forward's, bit for bit."""
    _, whole = engines
    monkeypatch.setattr(mlx_worker, "_rows_kept_exactly", lambda *args, **kwargs: False)
    monkeypatch.setattr(mlx_worker, "COLUMN_BLOCK", 5)  # the shipped model's 18 columns in blocks of 5, 5, 5, 3
    blocked = _engine(load_params)
    assert blocked.m is not None
    assert not blocked.m.head_rows
    assert blocked.m.column_block == 5
    widths: list[tuple[int, int]] = []
    product = mlx_worker._Columns.__call__

    def counting(self: Any, x: mx.array) -> mx.array:
        widths.append((int(np.prod(x.shape[:-1])), self.stop - self.start))
        return product(self, x)

    monkeypatch.setattr(mlx_worker._Columns, "__call__", counting)
    for a, b in zip(_score(blocked), _score(whole), strict=True):
        assert a["logprobs"].tobytes() == b["logprobs"].tobytes()
        assert a["vocab_logprobs"].tobytes() == b["vocab_logprobs"].tobytes()
    assert widths == [(len(p) + len(RESPONSE) - 1, w) for p in PROMPTS for w in (5, 5, 5, 3)]
    for temperature in (1.0, 0.0):
        for a, b in zip(_generate(blocked, temperature), _generate(whole, temperature), strict=True):
            assert a["tokens"].tobytes() == b["tokens"].tobytes()
            assert a["logprobs"].tobytes() == b["logprobs"].tobytes()

