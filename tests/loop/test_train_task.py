"""Training on any task, without an engine: the rewards of every scorer, the recorded configuration of the default
task, and the refusals `invar train` makes before any worker starts (one line, exit 2, nothing recorded lost), their
command lines run one after another in one process (`cli`, tests/support/cli_batch.py): the CLI's start-up once."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.cli_batch import InvarSession

from invar.engines import DEFAULT_MODEL
from invar.loop import cycle as cyc
from invar.loop.config import parse_config
from invar.records import RunStore
from invar.runner.train import plan
from invar.tasks import ModelTokenizer
from invar.tasks.population import Message, Unit
from invar.tasks.scorers import load_scorer

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to
TOKENIZER = ModelTokenizer.from_model_dir(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    with InvarSession(bound_s=120) as session:
        yield session


def _sample(response: str) -> cyc.Sample:
    ids = TOKENIZER.encode(response)
    tokens = np.asarray([*ids, TOKENIZER.eos_token_id], dtype=np.int32)
    return cyc.Sample("", [], tokens, np.zeros(tokens.size, np.float32), None)


@pytest.mark.parametrize(("name", "settings", "answer", "responses", "want"), [
    ("exact-match", {}, "12", ["12", "012", "13"], [1.0, 0.0, 0.0]),
    ("numeric", {"abs_tol": 1}, 12, ["12", "13", "15"], [1.0, 1.0, 0.0]),
    ("regex", {"pattern": "=([0-9]+)"}, "12", ["=12", "12", "=13"], [1.0, 0.0, 0.0]),
    ("choice", {"options": ["1", "2"]}, "2", ["2", "1", "3"], [1.0, 0.0, 0.0]),
    ("contains", {}, "2", ["12", "32", "13"], [1.0, 1.0, 0.0]),
])
def test_rewards_are_one_minus_each_builtin_scorer_s_loss(name: str, settings: dict[str, object], answer: object,
                                                         responses: list[str], want: list[float]) -> None:
    scorer = load_scorer(name, settings, REPO_ROOT)
    unit = Unit("u", "7+5=", None, answer)
    got = cyc.rewards([_sample(r) for r in responses], [unit] * len(responses), scorer, TOKENIZER)
    assert got.dtype == np.float64
    assert got.tolist() == want


def test_a_bounded_user_scorer_s_reward_is_rescaled_to_0_1(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text("def f(unit, response, params):\n    return float(len(response))\n",
                                   encoding="utf-8")
    scorer = load_scorer("s.py:f", {"loss_range": [-1.0, 3.0]}, tmp_path)
    unit = Unit("u", "7+5=", None, "12")
    got = cyc.rewards([_sample(r) for r in ("", "1", "12", "123")], [unit] * 4, scorer, TOKENIZER)
    assert got.tolist() == [0.75, 0.5, 0.25, 0.0]  # (3 − ℓ) / 4


def test_the_arithmetic_rewards_are_the_task_s_own_score() -> None:
    scorer = load_scorer("arithmetic-exact", {}, REPO_ROOT)
    unit = Unit("u", "7+5=", None, "12")
    got = cyc.rewards([_sample(r) for r in ("12", "13", "012")], [unit] * 3, scorer, TOKENIZER)
    assert got.tolist() == [1.0, 0.0, 0.0]


def test_a_default_scorer_section_leaves_the_recorded_configuration_as_it_was() -> None:
    base = {"name": "c", "backend": "mlx"}
    plain = parse_config(base)
    named = parse_config({**base, "scorer": {"name": "arithmetic-exact"}})
    other = parse_config({**base, "scorer": {"name": "exact-match"}})
    assert "scorer" not in plain.canonical()
    assert plain.digest() == named.digest() != other.digest()
    assert other.canonical()["scorer"] == {"name": "exact-match", "settings": {}, "sha256": None}


def test_a_chat_unit_s_request_is_its_rendered_template(tmp_path: Path) -> None:
    from support.bpe_model import build_bpe_tokenizer

    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    build_bpe_tokenizer(tmp_path, template, pad_token=None, vocab_size=397)
    tokenizer = ModelTokenizer.from_model_dir(tmp_path)
    unit = Unit("u", None, (Message("user", "what is 2 plus 3?"),), "5")
    [req, _] = cyc.rollout_requests([unit], 2, 0, 0, 1.0, 4, tokenizer)
    assert req.prompt == "<|im_start|>user\nwhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
    assert req.prompt_ids == tokenizer.encode(req.prompt, add_special_tokens=False)
    assert req.request_id == "c0/u/0"


def _task(folder: Path, rows: list[dict[str, object]], scorer: str, extra: str = "") -> Path:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (folder / "p.jsonl").write_bytes(data)
    (folder / "p.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
    config = folder / "c.toml"
    config.write_text(f'name = "c"\nbackend = "mlx"\nmodel = "{folder / "model"}"\n[prompts]\npath = "p.jsonl"\n'
                      f'per_cycle = 2\n{extra}\n[scorer]\n{scorer}\n', encoding="utf-8")
    if not (folder / "model").exists():
        shutil.copytree(DEFAULT_MODEL, folder / "model")
    return config


ROWS: list[dict[str, object]] = [{"id": f"u{i}", "prompt": f"{i}+1=", "answer": str(i + 1), "kind": "a"}
                                 for i in range(4)]


@pytest.mark.parametrize(("rows", "scorer", "extra", "message"), [
    (ROWS, 'name = "nope"', "", "c.toml: scorer: scorer 'nope' is unknown"),
    (ROWS, 'name = "exact-match"', 'kinds = ["b"]', "c.toml: prompts.kinds: ['b'] label no unit of"),
    ([*ROWS, ROWS[0]], 'name = "exact-match"', "", "c.toml: prompts.path: "),
    ([{"id": "m", "messages": [{"role": "user", "content": "1+1="}], "answer": "2"}, *ROWS], 'name = "exact-match"',
     "", "has no chat template"),
    (ROWS, 'name = "choice"\nsettings = { options = ["A", "B"] }', "", "is not one of the options A, B"),
])
def test_a_task_that_cannot_train_is_one_line_and_no_run(cli: InvarSession, tmp_path: Path,
                                                        rows: list[dict[str, object]], scorer: str, extra: str,
                                                        message: str) -> None:
    config = _task(tmp_path, rows, scorer, extra)
    out = cli.run("train", config, "--run", tmp_path / "run")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("invar: error: "), out.stderr
    assert message in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


def test_a_changed_model_folder_is_refused_at_resume_and_the_run_is_kept(cli: InvarSession, tmp_path: Path) -> None:
    config = _task(tmp_path, ROWS, 'name = "exact-match"')
    run = tmp_path / "run"
    # a run of this configuration stopped before its first publication (the records a kill leaves)
    p = plan(config)
    store = RunStore.create(run, meta=p.meta())
    store.put_meta("inputs", p.inputs())
    store.close()
    before = sorted((f.name, f.read_bytes()) for f in run.iterdir() if f.is_file())
    card = tmp_path / "model" / "MODEL_CARD.md"
    card.write_text(card.read_text(encoding="utf-8") + "\nedited\n", encoding="utf-8")
    out = cli.run("train", config, "--run", run)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "the model folder changed since the run started" in out.stderr
    assert sorted((f.name, f.read_bytes()) for f in run.iterdir() if f.is_file()) == before
