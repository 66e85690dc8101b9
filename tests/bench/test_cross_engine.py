"""bench/cross_engine.py without engines: the requests it sends on a chat population are the chat template's ids,
as `invar evaluate` builds them, and its alone-vs-batch rows count what they say."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from invar.engines import DEFAULT_MODEL
from invar.errors import InvarError
from invar.runner.evaluate import population_digest, request_seed
from invar.tasks import ModelTokenizer
from invar.tasks.population import Unit, load_units

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))

import cross_engine  # noqa: E402
from support.bpe_model import build_bpe_tokenizer  # noqa: E402

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _population(name: str) -> list[Unit]:
    path = ROOT / "data" / name
    return list(load_units(path, population_digest(path, None)))


def test_chat_requests_carry_the_chat_template_s_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = build_bpe_tokenizer(tmp_path / "chatml", CHATML_TEMPLATE, pad_token=None)
    units = _population("chat-eval.jsonl")[:4]
    vocab = ModelTokenizer.from_model_dir(folder)
    prompts = cross_engine.unit_prompts(vocab, units, 8, None)
    reqs = cross_engine.generate_requests(units, prompts, seed=3, temperature=0.7, max_tokens=8)
    hf = AutoTokenizer.from_pretrained(str(folder))
    start = hf.convert_tokens_to_ids("<|im_start|>")
    for unit, req in zip(units, reqs, strict=True):
        encoded: Any = hf.apply_chat_template(unit.chat(), tokenize=True, add_generation_prompt=True)
        assert req["prompt_ids"] == list(encoded["input_ids"])
        assert req["prompt_ids"][0] == start  # the template's own first token, nothing added before it
        assert req["prompt"].startswith("<|im_start|>system\n")
        assert req["prompt"].endswith("<|im_start|>assistant\n")
        assert unit.messages is not None
        assert unit.messages[-1].content in req["prompt"]
        assert (req["request_id"], req["seed"], req["temperature"], req["top_p"], req["max_tokens"]) == (
            unit.id, request_seed(3, unit.id), 0.7, 1.0, 8)


def test_arithmetic_requests_are_the_prompt_as_before() -> None:
    units = _population("arith-eval.jsonl")[:5]
    vocab = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    prompts = cross_engine.unit_prompts(vocab, units, cross_engine.BUDGET, None)
    assert prompts == [(u.prompt, vocab.prompt_ids(prompt=u.prompt)) for u in units]


def test_a_prompt_that_leaves_no_room_for_the_response_is_refused_naming_the_unit() -> None:
    units = _population("arith-eval.jsonl")[:2]
    vocab = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    first = len(vocab.unit_prompt(units[0])[1])
    with pytest.raises(InvarError, match=f"unit {units[0].id}: {first} prompt tokens .* context of 20 tokens"):
        cross_engine.unit_prompts(vocab, units, 21 - first, 20)


def test_a_greedy_sample_is_scored_at_temperature_one() -> None:
    assert cross_engine.score_temperature(0.0) == 1.0
    assert cross_engine.score_temperature(0.7) == 0.7


def _readings(alone_shift: dict[tuple[str, int], float]) -> cross_engine.Readings:
    """Two responses per engine (2 and 3 tokens); every engine scores every source identically, and alone as in
    the batch except where `alone_shift` moves one token of (engine, response)."""
    tokens = {e: [np.array([1, 2], np.int32), np.array([3, 4, 5], np.int32)] for e in cross_engine.ENGINES}
    values = np.array([-0.5, -1.25, -2.0, -0.125, -3.5], np.float32)
    scored = {(s, e): values.copy() for s in cross_engine.ENGINES for e in cross_engine.ENGINES}
    alone = {k: v.copy() for k, v in scored.items()}
    for (engine, response), shift in alone_shift.items():
        for source in cross_engine.ENGINES:
            at = 0 if response == 0 else 3
            alone[(engine, source)][at] = np.float32(values[at] + shift)
    return cross_engine.Readings(tokens, {e: values.copy() for e in cross_engine.ENGINES}, scored,
                                 {e: [0.0, 1.0] for e in cross_engine.ENGINES}, alone)


def test_alone_vs_batch_counts_tokens_and_whole_responses() -> None:
    rows = cross_engine.summarize(_readings({("hf", 1): 2.0 ** -20}))["alone_vs_batch"]
    assert rows["vllm"]["bit_identical"] == rows["vllm"]["tokens"] == 15
    assert rows["vllm"]["responses_bit_identical"] == rows["vllm"]["responses"] == 6
    hf = rows["hf"]
    assert (hf["tokens"], hf["bit_identical"], hf["responses"], hf["responses_bit_identical"]) == (15, 12, 6, 3)
    assert hf["max_abs_diff"] == pytest.approx(2.0 ** -20, rel=1e-3)
    assert cross_engine.summarize(_readings({}))["alone_vs_batch"]["hf"]["responses_bit_identical"] == 6


def test_a_run_without_alone_has_no_alone_rows() -> None:
    r = _readings({})
    r.alone = None
    assert "alone_vs_batch" not in cross_engine.summarize(r)


def test_engines_are_two_or_more_known_names_in_the_table_s_order() -> None:
    assert cross_engine._engines("vllm,hf") == ("hf", "vllm")
    for bad in ("hf", "hf,hf", "hf,tgi"):
        with pytest.raises(argparse.ArgumentTypeError, match="name two or more of hf,vllm,mlx"):
            cross_engine._engines(bad)


def test_a_two_engine_table_names_only_its_engines() -> None:
    r = _readings({})
    keep = ("hf", "vllm")
    r = cross_engine.Readings({e: r.tokens[e] for e in keep}, {e: r.behavior[e] for e in keep},
                              {k: v for k, v in r.scored.items() if set(k) <= set(keep)},
                              {e: r.losses[e] for e in keep},
                              {k: v for k, v in (r.alone or {}).items() if set(k) <= set(keep)})
    res = cross_engine.summarize(r)
    assert list(res["pairs"]) == ["hf-vllm"]
    assert list(res["alone_vs_batch"]) == ["hf", "vllm"]
    text = cross_engine.markdown({"temperatures": {"1.0": res}, "count": 2, "batch_size": 2})
    assert "| 1.0 | 0.500 / 0.500 | 2 of 2 |" in text
    assert "accuracy (hf / vllm)" in text
    assert "mlx" not in text


@pytest.mark.parametrize(("setting", "says"), [
    ("mlx-blas=openblas", "write ENGINE:NAME=VALUE"),
    ("vllm:blas=openblas", "write ENGINE:NAME=VALUE"),  # vllm is not among --engines hf,mlx
    ("mlx:blas=mkl", "blas is one of bundled, openblas"),
    ("mlx:threads=1", "mlx has no launch setting 'threads'"),
])
def test_a_launch_setting_names_one_of_the_engines_and_a_setting_it_takes(
        setting: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--setting ENGINE:NAME=VALUE` is checked before any worker starts, with the engine table's own message."""
    with pytest.raises(SystemExit) as stop:
        cross_engine.main(["--engines", "hf,mlx", "--setting", setting])
    assert stop.value.code == 2
    assert says in capsys.readouterr().err
