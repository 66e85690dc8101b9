"""A chat population on the engines other than HF: `evaluate` on vLLM and on MLX, and a use contract whose reference
runs on vLLM and whose candidate runs on MLX (`use package` → `use prepare` → `use run` → `use admit`), on the
random Llama with a byte-level BPE of `conftest.py`, through the real CLI. (HF's side is `tests/cli/
test_your_model.py`, the worked example of docs/your-model.md.)

One module-scoped batch, side by side: the two `evaluate` runs and the `use run` start together. The tests check
every number against the records: the prompt ids each engine ran are the core's rendering of the chat units, each
response is scored again from its tokens by the core's decoding and the scorer, and the decision is the one the
bound gives on the paired counts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.cli_runs import invar, package_lines, side_by_side

from invar.records import RunStore
from invar.stats.bounds import paired_binary_exact
from invar.tasks import ModelTokenizer
from invar.tasks.population import load_units
from invar.tasks.scorers import load_scorer

pytestmark = pytest.mark.engine

TIMEOUT = 600
MAX_TOKENS = 6
EVALUATE = {"vllm": ("choice", {"options": list("aeiou")}), "mlx": ("regex", {"pattern": "([aeiou])"})}
"""Engine → the scorer its `evaluate` uses (on a random model the losses are what they are)."""
CONTRACT_SCORER = ("contains", {"case_fold": True})


def _population() -> bytes:
    rows = []
    for i in range(8):
        messages = [{"role": "system", "content": "Reply with one word."},
                    {"role": "user", "content": f"name a word with the letter {'aeiou'[i % 5]}"}]
        rows.append({"id": f"w{i}", "messages": messages, "answer": "aeiou"[i % 5]})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@dataclass
class Used:
    folder: Path
    evaluate: dict[str, dict[str, Any]]
    contract: Path
    run: Path
    decision: dict[str, Any]


@pytest.fixture(scope="module")
def used(any_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Used:
    folder = tmp_path_factory.mktemp("any-model-use")
    data = _population()
    (folder / "words.jsonl").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    (folder / "words.sha256").write_text(sha + "\n", encoding="ascii")
    name, settings = CONTRACT_SCORER
    (folder / "decl.toml").write_text(f"""name = "vllm-to-mlx"
description = "May MLX replace vLLM for naming words, greedy, on 8 chat prompts?"
[population]
path = "words.jsonl"
sha256 = "{sha}"
[scorer]
name = "{name}"
settings = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())} }}
[sampling]
temperature = 0.0
max_tokens = {MAX_TOKENS}
[requirement]
standard = "population"
epsilon = "0.4"
confidence = "0.9"
method = "paired-binary-exact"
[pairing]
seed = 3
layout = "b8"
[layouts.b8]
batch_size = 8
[invariance]
required = false
[reference]
{package_lines("vllm", any_model)}dtype = "float32"
[candidate]
{package_lines("mlx", any_model)}dtype = "float32"
[[premises]]
statement = "Eight prompts stand for the use."
party = "the test"
basis_sha256 = "{sha}"
reliance = "vouched"
""", encoding="utf-8")
    prepared = invar("use", "prepare", folder / "decl.toml", "--json")
    assert prepared.returncode == 0, prepared.stderr
    contract = Path(json.loads(prepared.stdout)["contract"])
    commands: dict[str, list[str | Path]] = {}
    for engine, (scorer, scorer_settings) in EVALUATE.items():
        commands[engine] = ["evaluate", "--engine", engine, "--model", any_model, "--population",
                            folder / "words.jsonl", "--scorer", scorer, "--temperature", "0", "--max-tokens",
                            str(MAX_TOKENS), "--run", folder / f"evaluate-{engine}", "--json"]
        for k, v in scorer_settings.items():
            commands[engine] += ["--scorer-setting", f"{k}={json.dumps(v)}"]
    commands["use"] = ["use", "run", contract, "--run", folder / "use-run"]
    printed = side_by_side(commands, folder, TIMEOUT)
    admitted = invar("use", "admit", folder / "use-run", "--contract", contract, "--json")
    assert admitted.returncode in (0, 10, 11), admitted.stderr
    return Used(folder, {e: json.loads(printed[e]) for e in EVALUATE}, contract, folder / "use-run",
                json.loads(admitted.stdout))


def _calls(run: Path) -> list[Any]:
    with RunStore.open(run) as store:
        store.verify()
        return [c for c in store.calls() if c.call.method == "generate"]


@pytest.mark.parametrize("engine", EVALUATE)
def test_evaluate_scores_each_chat_unit_from_the_tokens_the_engine_returned(used: Used, any_model: Path,
                                                                            engine: str) -> None:
    tokenizer = ModelTokenizer.from_model_dir(any_model)
    units = {u.id: u for u in load_units(used.folder / "words.jsonl")}
    name, settings = EVALUATE[engine]
    scorer = load_scorer(name, settings, used.folder)
    printed = used.evaluate[engine]
    assert printed["engine"] == engine
    assert printed["scorer"]["name"] == name
    [call] = _calls(used.folder / f"evaluate-{engine}")
    assert call.report is not None
    assert call.report.report.result is not None
    correct = 0
    for req, out in zip(call.call.params["requests"], call.report.report.result["outputs"], strict=True):
        unit = units[req["request_id"]]
        assert list(req["prompt_ids"]) == tokenizer.unit_prompt(unit)[1]
        assert list(out["prompt_tokens"]) == list(req["prompt_ids"])
        correct += scorer.loss(unit, tokenizer.decode(out["tokens"])) == 0
    assert (printed["problems"], printed["correct"]) == (len(units), correct)


def test_the_contract_ran_both_engines_on_the_same_ids_and_decides_by_its_bound(used: Used, any_model: Path) -> None:
    tokenizer = ModelTokenizer.from_model_dir(any_model)
    units = {u.id: u for u in load_units(used.folder / "words.jsonl")}
    scorer = load_scorer(*CONTRACT_SCORER, used.folder)
    losses: dict[str, dict[str, float]] = {"vllm": {}, "mlx": {}}
    for call in _calls(used.run):
        assert call.report is not None
        assert call.report.report.result is not None
        engine = call.identity.engine
        for req, out in zip(call.call.params["requests"], call.report.report.result["outputs"], strict=True):
            unit = units[req["request_id"]]
            assert list(req["prompt_ids"]) == tokenizer.unit_prompt(unit)[1]
            assert list(out["prompt_tokens"]) == list(req["prompt_ids"])
            losses[engine][unit.id] = scorer.loss(unit, tokenizer.decode(out["tokens"]))
    assert set(losses["vllm"]) == set(losses["mlx"]) == set(units)
    worse = sum(losses["mlx"][u] > losses["vllm"][u] for u in units)
    better = sum(losses["mlx"][u] < losses["vllm"][u] for u in units)
    d = used.decision
    assert (d["task_loss"]["n"], d["task_loss"]["worse"], d["task_loss"]["better"]) == (len(units), worse, better)
    bound = paired_binary_exact(worse, better, len(units), 0.1)
    assert d["bound"]["upper"] == bound.upper
    assert d["answer"] == ("Admitted" if bound.upper <= 0.4 else "Unknown" if bound.lower <= 0.4 else "Violated")


def test_compare_numerical_pairs_the_chat_runs_of_vllm_and_mlx(used: Used) -> None:
    """The two `evaluate` runs asked the same ids with the same seeds (greedy): `compare numerical` pairs them."""
    out = invar("compare", "numerical", used.folder / "evaluate-vllm", used.folder / "evaluate-mlx", "--json")
    assert out.returncode == 0, out.stderr
    generation = json.loads(out.stdout)["generation"]
    assert generation["units"] == 8
    assert generation["tokens_identical"] == generation["first_divergence"]["none"] == 8
    assert generation["max_abs_delta"]["max"] < 1e-4  # float32 rounding between engines (test_any_model_engines)
