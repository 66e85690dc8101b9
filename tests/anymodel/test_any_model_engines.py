"""Any model folder on every engine: the random Llama with a byte-level BPE of `conftest.py`, through the real CLI.

One module-scoped batch of commands, started as early as each can be and run side by side (vLLM's start dominates:
a minute or two on a 2-core machine, so its `infer` and its `score` start together):

    invar infer PROMPTS --engine E --temperature 0 --seed 11     for E in hf, vllm, mlx
    invar score --from-run <the hf infer run> --engine E --capture-steps 0,last     for E in hf, vllm, mlx

and the tests read their records and run `invar compare numerical` (no engine) on them.

Tolerance. The engines compute the same float32 model with other kernels and summation orders, so the same
token's log-probability differs by float32 rounding only. Measured on this model (log-probabilities of -1 to -7
nats, float32 ulp 1e-7 to 5e-7; 7 responses, 64 tokens): sampled and teacher-forced log-probabilities differed
from HF's by at most 5.5e-6 nats on vLLM and 7.9e-6 on MLX (at most 41 and 78 ulp), and KL between the captured
distributions was at most 5e-12 and 1.2e-11. The tests allow 1e-4 nats and a KL of 1e-8: ten times the measured
noise and more, and far below what a wrong model gives (mlx-lm with rope θ 10,000 instead of the folder's 500,000
changed the greedy tokens from the first step on, i.e. moved the distribution by more than the smallest top-two
gap of the greedy steps, 0.016 nats).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import EOS_PROMPTS

from invar.records import RunStore
from invar.tasks import ModelTokenizer

pytestmark = pytest.mark.engine

ENGINES = ("hf", "vllm", "mlx")
PROMPTS = (*EOS_PROMPTS, "Grüße, café naïve!", "hello world", "naïve 😀 日本語?", " x  y ", "37+58=")
"""Unicode in and out of the training alphabet (the emoji and CJK become byte tokens), spaces, digits."""
SEED, MAX_TOKENS = 11, 12
TOLERANCE = 1e-4
"""|Δ log-prob| in nats allowed between engines on the same token (see the module docstring)."""
MAX_KL = 1e-8
TIMEOUT = 480


@dataclass
class Runs:
    model: Path
    infer: dict[str, Path]
    score: dict[str, Path]
    printed: dict[str, dict[str, Any]]


def _command(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start `invar ARGS`, its stdout into `log` and its stderr (and the worker's) into `log` + `.err`."""
    with log.open("wb") as out, log.with_suffix(".err").open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "invar.cli", *args], stdout=out, stderr=err)


def _wait(proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err = log.with_suffix(".err").read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == 0, f"{log.stem} exited {proc.returncode}:\n{err[-4000:]}"


@pytest.fixture(scope="module")
def runs(any_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("any-model-runs")
    infer = {e: tmp / f"infer-{e}" for e in ENGINES}
    score = {e: tmp / f"score-{e}" for e in ENGINES}
    logs = {run.name: tmp / f"{run.name}.log" for run in [*infer.values(), *score.values()]}
    started: list[subprocess.Popen[bytes]] = []
    try:
        procs = {}
        for e in ENGINES:
            procs[e] = _command(["infer", *PROMPTS, "--engine", e, "--model", str(any_model), "--temperature", "0",
                                 "--seed", str(SEED), "--max-tokens", str(MAX_TOKENS), "--json",
                                 "--run", str(infer[e])], logs[infer[e].name])
            started.append(procs[e])
        _wait(procs["hf"], logs[infer["hf"].name])
        scoring = {}
        for e in ENGINES:
            scoring[e] = _command(["score", "--from-run", str(infer["hf"]), "--engine", e, "--model", str(any_model),
                                   "--capture-steps", "0,last", "--run", str(score[e])], logs[score[e].name])
            started.append(scoring[e])
        for e in ENGINES:
            _wait(procs[e], logs[infer[e].name])
            _wait(scoring[e], logs[score[e].name])
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return Runs(any_model, infer, score,
                {e: json.loads(logs[infer[e].name].read_text(encoding="utf-8")) for e in ENGINES})


def _generate(run: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recorded generate call's requests and its report's outputs."""
    with RunStore.open(run) as store:
        store.verify()
        calls = store.calls()
    [call] = [c for c in calls if c.call.method == "generate"]
    assert call.report is not None
    assert call.report.report.result is not None
    return call.call.params["requests"], call.report.report.result["outputs"]


def test_every_engine_ran_the_ids_of_the_core_and_of_transformers(runs: Runs) -> None:
    from transformers import AutoTokenizer

    core = ModelTokenizer.from_model_dir(runs.model)
    hf_tokenizer = AutoTokenizer.from_pretrained(runs.model)
    expected = [core.prompt_ids(prompt=p) for p in PROMPTS]
    assert expected == [hf_tokenizer(p)["input_ids"] for p in PROMPTS]
    assert any(t >= 256 for ids in expected for t in ids)  # merges, not bytes only
    for e in ENGINES:
        requests, outputs = _generate(runs.infer[e])
        assert [r["prompt"] for r in requests] == list(PROMPTS)
        assert [r["seed"] for r in requests] == [SEED + i for i in range(len(PROMPTS))]
        assert all(r["temperature"] == 0 for r in requests)
        assert [list(r["prompt_ids"]) for r in requests] == expected, e
        assert [o["prompt_tokens"].tolist() for o in outputs] == expected, e


def test_printed_text_is_the_core_decoding_and_transformers_decoding(runs: Runs) -> None:
    from transformers import AutoTokenizer

    core = ModelTokenizer.from_model_dir(runs.model)
    hf_tokenizer = AutoTokenizer.from_pretrained(runs.model)
    ends = set(core.eos_token_ids)
    assert ends == {0, 2}  # generation_config.json's, not config.json's {2}
    for e in ENGINES:
        _, outputs = _generate(runs.infer[e])
        for row, out in zip(runs.printed[e]["outputs"], outputs, strict=True):
            tokens = row["tokens"]
            assert tokens == out["tokens"].tolist()
            end = next((i for i, t in enumerate(tokens) if t in ends), len(tokens))
            assert row["text"] == core.decode(tokens), e
            assert row["text"] == hf_tokenizer.decode(tokens[:end], skip_special_tokens=False), e


def test_every_engine_stops_at_each_id_that_ends_a_response(runs: Runs) -> None:
    # EOS_PROMPTS[0] ends with <|endoftext|>, named only by generation_config.json; [1] with <|im_end|>
    for e in ENGINES:
        rows = runs.printed[e]["outputs"]
        for row, end in zip(rows, (0, 2), strict=False):
            assert row["finish_reason"] == "stop", (e, row)
            assert row["tokens"][-1] == end, (e, row)
            assert 1 < len(row["tokens"]) < MAX_TOKENS, (e, row)
        for row in rows:
            inside = [t for t in row["tokens"][:-1] if t in (0, 2)]
            assert not inside, (e, row)
            assert row["finish_reason"] == ("stop" if row["tokens"][-1] in (0, 2) else "length"), (e, row)


def test_the_three_engines_give_the_same_greedy_tokens(runs: Runs) -> None:
    rows = {e: runs.printed[e]["outputs"] for e in ENGINES}
    for i, prompt in enumerate(PROMPTS):
        tokens = {e: rows[e][i]["tokens"] for e in ENGINES}
        assert tokens["vllm"] == tokens["hf"] == tokens["mlx"], (prompt, tokens)
        ref = np.asarray(rows["hf"][i]["logprobs"], dtype=np.float64)
        for e in ("vllm", "mlx"):
            delta = np.abs(np.asarray(rows[e][i]["logprobs"], dtype=np.float64) - ref)
            assert delta.max() < TOLERANCE, (prompt, e, delta.max())


@pytest.mark.parametrize("candidate", ["vllm", "mlx"])
def test_compare_numerical_against_hf(runs: Runs, candidate: str) -> None:
    out = subprocess.run([sys.executable, "-m", "invar.cli", "compare", "numerical", str(runs.infer["hf"]),
                          str(runs.infer[candidate]), "--cand-scores", str(runs.score[candidate]),
                          "--ref-scores", str(runs.score["hf"]), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    units = len(PROMPTS)
    generation, forced, captures = doc["generation"], doc["teacher_forcing"], doc["captures"]
    assert (generation["units"], generation["tokens_identical"]) == (units, units)
    assert generation["first_divergence"]["none"] == units
    assert generation["max_abs_delta"]["max"] < TOLERANCE
    # teacher forcing: the candidate scores HF's own responses; HF's scores equal what it sampled, bit for bit
    assert doc["reference_self_consistency"] == {"identical": units, "units": units}
    assert forced["units"] == units
    assert forced["first_large_step"]["none"] == units
    assert forced["abs_delta"]["n"] == sum(len(r["tokens"]) for r in runs.printed["hf"]["outputs"])
    assert forced["abs_delta"]["max"] < TOLERANCE, forced["abs_delta"]
    # the whole distribution at the first and last step of each response
    assert captures["captures"] == 2 * units - sum(1 for r in doc["units"] if len(r["teacher_forcing"]["deltas"]) == 1)
    assert captures["same_top"]["fraction"] == 1.0
    assert captures["kl_ref_cand"]["max"] < MAX_KL, captures["kl_ref_cand"]
    assert captures["kl_cand_ref"]["max"] < MAX_KL, captures["kl_cand_ref"]
