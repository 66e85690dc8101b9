"""Training on any task: `invar train` on the random Llama with a byte-level BPE of `conftest.py`, a chat population
and a scorer other than the arithmetic one, on each backend, through the real CLI.

One module-scoped batch of four 2-cycle runs, side by side (vLLM's start dominates):

    mlx        `contains` (answer "e": random text often holds one, so rewards vary)
    mlx-micro  the same, the learner's work split into micro-batches of 5: `compare histories` finds the same
               checkpoints, bit for bit
    hf         a user scorer whose loss lies in [0, 2] and is not 0/1 (the share of the answer's characters missing)
    vllm+hf    `exact-match` (a random model never matches: every group's advantages are 0, and the run still
               publishes and is recomputed)

The tests read the records: every request's prompt ids are the ones the core renders and tokenizes and the ones
transformers' `apply_chat_template` gives; `inspect history` recomputes each cycle's rewards, advantages and
objective from the run folder alone, moved away from the population and the scorer file; and a changed scorer file
or population is refused at resume in one line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cli_runs import invar, side_by_side

from invar.records import RunStore
from invar.tasks import ModelTokenizer
from invar.tasks.population import load_units
from invar.tasks.scorers import load_scorer

pytestmark = pytest.mark.engine

TIMEOUT = 600
CYCLES, PER_CYCLE, GROUP, MAX_TOKENS = 2, 3, 4, 8

PARTIAL = '''def grade(unit, response, params):
    """Loss in [0, 2]: twice the share of the answer's characters the response does not contain."""
    answer = str(unit.answer)
    return 2.0 * sum(ch not in response for ch in answer) / len(answer)
'''

RUNS = {
    "mlx": ('name = "contains"\nsettings = { case_fold = true }', "e"),
    "mlx-micro": ('name = "contains"\nsettings = { case_fold = true }', "e"),
    "hf": ('name = "partial.py:grade"\nsettings = { loss_range = [0.0, 2.0] }', None),
    "vllm+hf": ('name = "exact-match"', None),
}
"""Run → its `[scorer]` section, and the answer every unit gets (None: the sum). The run's backend is its name up to
a `-`; `mlx-micro` is `mlx` rescheduled (`SCHEDULE`)."""
SCHEDULE = "[learner]\nmicro_batch = 5\n"


def _population(answer: str | None) -> bytes:
    rows = []
    for i in range(8):
        a, b = 3 + i, 11 + 2 * i
        messages = [{"role": "system", "content": "Answer with the number."},
                    {"role": "user", "content": f"what is {a} plus {b}?"}]
        rows.append({"id": f"q{i}", "messages": messages, "answer": answer or str(a + b),
                     "kind": "add" if i % 2 else "sum"})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@dataclass
class Trained:
    folder: Path
    config: Path
    run: Path
    history: dict[str, Any]


@pytest.fixture(scope="module")
def trained(any_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trained]:
    out: dict[str, Trained] = {}
    commands: dict[str, list[str | Path]] = {}
    for name, (scorer, answer) in RUNS.items():
        backend = name.split("-")[0]
        folder = tmp_path_factory.mktemp(f"train-{name.replace('+', '-')}")
        data = _population(answer)
        (folder / "train.jsonl").write_bytes(data)
        (folder / "train.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
        (folder / "partial.py").write_text(PARTIAL, encoding="utf-8")
        config = folder / "task.toml"
        config.write_text(f'name = "task"\nbackend = "{backend}"\nmodel = "{any_model}"\ncycles = {CYCLES}\n'
                          f'[prompts]\npath = "train.jsonl"\nper_cycle = {PER_CYCLE}\n'
                          f'[rollout]\ngroup_size = {GROUP}\nmax_tokens = {MAX_TOKENS}\n'
                          f'[optimizer]\nlr = 0.01\n[scorer]\n{scorer}\n'
                          f'{SCHEDULE if name.endswith("-micro") else ""}', encoding="utf-8")
        out[name] = Trained(folder, config, folder / "run", {})
        commands[name] = ["train", config, "--run", folder / "run"]
    side_by_side(commands, tmp_path_factory.mktemp("train-logs"), TIMEOUT)
    for t in out.values():
        shown = invar("inspect", "history", t.run, "--json")
        assert shown.returncode == 0, shown.stderr
        t.history = json.loads(shown.stdout)
    return out


def _generate_requests(run: Path) -> list[dict[str, Any]]:
    with RunStore.open(run) as store:
        store.verify()
        calls = store.calls()
    return [r for c in calls if c.call.method == "generate" for r in c.call.params["requests"]]


@pytest.mark.parametrize("backend", [n for n in RUNS if "-" not in n])
def test_every_request_carries_the_chat_template_s_ids(trained: dict[str, Trained], any_model: Path,
                                                       backend: str) -> None:
    from transformers import AutoTokenizer

    t = trained[backend]
    units = {u.id: u for u in load_units(t.folder / "train.jsonl")}
    hf = AutoTokenizer.from_pretrained(any_model)
    requests = _generate_requests(t.run)
    assert len(requests) == CYCLES * PER_CYCLE * GROUP
    for req in requests:
        unit = units[req["request_id"].split("/")[1]]
        want = hf.apply_chat_template(unit.chat(), tokenize=True, add_generation_prompt=True)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert list(req["prompt_ids"]) == list(want), req["request_id"]
        assert req["prompt"].endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("backend", [n for n in RUNS if "-" not in n])
def test_history_recomputes_the_rewards_from_the_run_alone(trained: dict[str, Trained], any_model: Path,
                                                           tmp_path: Path, backend: str) -> None:
    t = trained[backend]
    cycles = t.history["cycles"]
    assert [c["cycle"] for c in cycles] == list(range(CYCLES))
    with RunStore.open(t.run) as store:
        meta = store.meta()
        calls = {c.call_digest: c for c in store.calls()}
    assert meta["run"]["config"]["scorer"]["name"] == RUNS[backend][0].split('"')[1]
    # the rewards once more, from the engine's tokens, the core's decoding and the scorer, outside the product's loop
    tokenizer = ModelTokenizer.from_model_dir(any_model)
    scorer_section = meta["run"]["config"]["scorer"]
    scorer = load_scorer(scorer_section["name"], scorer_section["settings"], t.folder)
    low, high = scorer.loss_range
    units = {u.id: u for u in load_units(t.folder / "train.jsonl")}
    for n, row in enumerate(cycles):
        gen = calls[meta[f"cycle-{n:06d}"]["generate_call"]]
        assert gen.report is not None
        assert gen.report.report.result is not None
        # a training cycle's outputs travel as columns (docs/protocol.md), cut here by their lengths
        batch = gen.report.report.result["outputs_batch"]
        requests = gen.call.params["requests"]
        assert batch["request_ids"] == [req["request_id"] for req in requests]
        responses = np.split(batch["tokens"], np.cumsum(batch["lengths"])[:-1])
        rewards = [(high - scorer.loss(units[req["request_id"].split("/")[1]], tokenizer.decode(tokens)))
                   / (high - low)
                   for req, tokens in zip(requests, responses, strict=True)]
        assert row["reward_mean"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-12)
        assert row["reward_mean"] == meta[f"cycle-{n:06d}"]["reward_mean"]
        assert row["loss_abs_diff"] <= 1e-6
    if backend == "hf":  # the partial-credit scorer's rewards are not all 0 or 1
        assert any(0.0 < c["reward_mean"] < 1.0 for c in cycles)
    # moved away from its population and scorer file, the run still recomputes to the same history
    moved = tmp_path / "moved"
    shutil.copytree(t.run, moved)
    shown = invar("inspect", "history", moved, "--json")
    assert shown.returncode == 0, shown.stderr
    again = json.loads(shown.stdout)
    assert [c["checkpoint"] for c in again["cycles"]] == [c["checkpoint"] for c in cycles]
    assert [c["reward_mean"] for c in again["cycles"]] == [c["reward_mean"] for c in cycles]


def test_a_changed_scorer_file_or_population_is_refused_at_resume(trained: dict[str, Trained]) -> None:
    t = trained["hf"]
    scorer = t.folder / "partial.py"
    kept = scorer.read_bytes()
    scorer.write_text(PARTIAL.replace("2.0 *", "1.0 *"), encoding="utf-8")
    try:
        out = invar("train", t.config, "--run", t.run)
    finally:
        scorer.write_bytes(kept)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "the scorer changed since the run started" in out.stderr

    population = t.folder / "train.jsonl"
    data = population.read_bytes()
    changed = data.replace(b"plus", b"and")
    population.write_bytes(changed)
    (t.folder / "train.sha256").write_text(hashlib.sha256(changed).hexdigest() + "\n", encoding="ascii")
    try:
        out = invar("train", t.config, "--run", t.run)
    finally:
        population.write_bytes(data)
        (t.folder / "train.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "the prompts file changed since the run started" in out.stderr


def test_a_rescheduled_mlx_run_publishes_the_same_checkpoints(trained: dict[str, Trained]) -> None:
    out = invar("compare", "histories", trained["mlx"].run, trained["mlx-micro"].run, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert (doc["verdict"], doc["cycles_compared"]) == ("identical", CYCLES)
