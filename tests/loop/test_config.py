"""The training configuration: the shipped examples read, and every bad file is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from invar.loop.config import ConfigError, TrainConfig, field_help, field_ranges, parse_config, read_config

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

CONFIGS = sorted((REPO_ROOT / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_read(path: Path) -> None:
    config = read_config(path)
    assert config.name == path.stem


def test_shipped_configs_cover_every_backend() -> None:
    assert {read_config(p).backend for p in CONFIGS} == {"mlx", "hf", "vllm+hf"}


def test_defaults_fill_every_field_and_the_digest_follows_the_values() -> None:
    a = parse_config({"name": "a", "backend": "mlx"})
    b = parse_config({"name": "a", "backend": "mlx", "rollout": {"group_size": 8}})
    c = parse_config({"name": "a", "backend": "mlx", "rollout": {"group_size": 4}})
    assert a.digest() == b.digest() != c.digest()


def test_the_default_layout_keeps_the_digest_and_shared_changes_it() -> None:
    # Configurations written before `rollout.layout` existed keep their digests (split is the default); a shared
    # run is another configuration (a resume must give the layout it was made with).
    split = parse_config({"name": "a", "backend": "hf", "rollout": {"layout": "split"}})
    shared = parse_config({"name": "a", "backend": "hf", "rollout": {"layout": "shared"}})
    assert "layout" not in split.canonical()["rollout"]
    assert split.digest() == parse_config({"name": "a", "backend": "hf"}).digest() != shared.digest()
    assert shared.canonical()["rollout"]["layout"] == "shared"
    assert all(read_config(p).rollout.layout == "split" for p in CONFIGS)


def test_engine_settings_are_part_of_the_configuration_and_none_keeps_the_digest() -> None:
    # Configurations written before `engines` existed keep their digests; launch settings change what the engines
    # compute (another BLAS, another device), so a run resumed must be given the ones it was made with.
    plain = parse_config({"name": "a", "backend": "mlx"})
    assert "engines" not in plain.canonical()
    assert parse_config({"name": "a", "backend": "mlx", "engines": {}}).digest() == plain.digest()
    assert parse_config({"name": "a", "backend": "mlx", "engines": {"mlx": {}}}) == plain
    openblas = parse_config({"name": "a", "backend": "mlx", "engines": {"mlx": {"blas": "openblas"}}})
    assert openblas.canonical()["engines"] == {"mlx": {"blas": "openblas"}}
    assert openblas.digest() != plain.digest()
    rank = parse_config({"name": "a", "backend": "vllm+hf", "lora": {"r": 16}, "engines": {"vllm": {"max_lora_rank":
                                                                                                   16}}})
    assert rank.lora.r == 16


def test_every_field_has_a_docstring() -> None:
    rows = field_help()
    assert len(rows) >= 30
    assert [name for name, _, doc in rows if not doc] == []


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "x", "backend": "mlx", "learning_rate": 1e-3},
     "c.toml: learning_rate: is not a known field; remove it or check its spelling"),
    ({"name": "x", "backend": "mlx", "rollout": {"group_size": 1}},
     "c.toml: rollout.group_size: input should be greater than or equal to 2; got 1"),
    ({"name": "x", "backend": "mlx", "rollout": {"temperature": 0}},
     "c.toml: rollout.temperature: input should be greater than 0; got 0"),
    ({"name": "x", "backend": "mlx", "optimizer": {"lr": -1}},
     "c.toml: optimizer.lr: input should be greater than 0; got -1"),
    ({"name": "x", "backend": "tpu"}, "c.toml: backend: input should be 'mlx', 'hf' or 'vllm+hf'; got 'tpu'"),
    ({"name": "x", "backend": "mlx", "objective": {"importance": "none"}},
     'c.toml: objective.importance_cap: importance = "none" uses no cap; remove it or choose "truncate" or "mask"'),
    ({"name": "x", "backend": "mlx", "objective": {"importance_cap": 1.0}},
     "c.toml: objective.importance_cap: input should be greater than 1; got 1.0"),
    ({"name": "x", "backend": "mlx", "prompts": {"kinds": ["div"]}},
     "c.toml: prompts.kinds: ['div'] are not problem kinds; choose from ['add2', 'sub2', 'mul', 'muladd', "
     "'add3', 'sub3']"),
    ({"name": "x", "backend": "vllm+hf", "lora": {"r": 16}},
     "c.toml: lora.r: vLLM serves adapters of rank at most 8 (its max_lora_rank); got 16: lower r, raise "
     "engines.vllm.max_lora_rank, or train on the mlx or hf backend"),
    ({"name": "x", "backend": "vllm+hf", "lora": {"r": 32}, "engines": {"vllm": {"max_lora_rank": 16}}},
     "c.toml: lora.r: vLLM serves adapters of rank at most 16 (its max_lora_rank); got 32: lower r, raise "
     "engines.vllm.max_lora_rank, or train on the mlx or hf backend"),
    ({"name": "x", "backend": "vllm+hf", "engines": {"mlx": {"blas": "openblas"}}},
     "c.toml: engines.mlx: the vllm+hf backend runs vllm and hf; give settings for engines.vllm or engines.hf"),
    ({"name": "x", "backend": "mlx", "engines": {"mlx": {"bias": "openblas"}}},
     "c.toml: engines.mlx.bias: not a launch setting of the mlx worker; it takes map_rope_parameters, blas"),
    ({"name": "x", "backend": "mlx", "engines": {"mlx": {"blas": "mkl"}}},
     'c.toml: engines.mlx: blas "mkl" is not one the mlx worker takes; write "bundled" or "openblas"'),
    ({"name": "x", "backend": "hf", "engines": {"hf": {"threads": "2"}}},
     'c.toml: engines.hf: threads, a launch option of the hf worker, must be an integer, not the string "2"; write '
     "2 without quotes"),
    ({"name": "x", "backend": "hf", "engines": {"hf": {"device": "tpu"}}},
     'c.toml: engines.hf: device "tpu" is not a device the hf worker takes; write "cpu" or "cuda"'),
    ({"backend": "mlx"}, "c.toml: name: is required; add it"),
    ({"name": "x", "backend": "mlx", "rollout": {"layout": "together"}},
     "c.toml: rollout.layout: input should be 'split' or 'shared'; got 'together'"),
    ({"name": "x", "backend": "vllm+hf", "rollout": {"layout": "shared"}},
     'c.toml: rollout.layout: "shared" runs both roles in one worker process, which needs one engine for both; '
     'vllm+hf generates with vLLM and learns with Hugging Face: set layout = "split", or train on the mlx or hf '
     "backend"),
    ({"name": "x", "backend": "hf", "rollout": {"layout": "shared", "workers": 2}},
     'c.toml: rollout.layout: "shared" runs the one inference worker in the learner\'s process; rollout.workers = 2 '
     'needs layout = "split" (or workers = 1)'),
])
def test_a_bad_config_is_one_line_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "c.toml")
    assert str(err.value) == message


def test_bad_toml_and_missing_files_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nbackend = \n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML \(.*\); fix the syntax$"):
        read_config(bad)
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        read_config(tmp_path / "absent.toml")


def test_the_canonical_form_round_trips() -> None:
    config = read_config(CONFIGS[0])
    again = TrainConfig.model_validate({k: v for k, v in config.canonical().items() if k != "schema"})
    assert again == config


def test_docs_training_lists_every_field() -> None:
    text = (REPO_ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert [name for name, _, _ in field_help() if f"| `{name}` |" not in text] == []


def test_docs_training_states_every_range_the_code_enforces() -> None:
    # Every bound of the configuration is in the docs' range column (and in --help), none only in the code.
    text = (REPO_ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    ranges = field_ranges()
    assert ranges["rollout.temperature"] == "(0, 10]"
    assert ranges["prompts.per_cycle"] == "[1, 4096]"
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():  # the configuration table is the first to list each field
        if line.startswith("| `"):
            rows.setdefault(line.split(" | ")[0].removeprefix("| `").removesuffix("`"), line.split(" | "))
    assert [name for name, r in ranges.items() if rows.get(name, ["", "", ""])[2] != r] == []
    assert all(f"Range: {r}." in doc for name, _, doc in field_help() if (r := ranges.get(name)))


@pytest.mark.parametrize(("data", "message"), [
    ({"cycles": True}, "c.toml: cycles: must be an integer, not the boolean true; write a whole number such as 16"),
    ({"prompts": {"per_cycle": True}}, "c.toml: prompts.per_cycle: must be an integer, not the boolean true"),
    ({"seed": False}, "c.toml: seed: must be an integer, not the boolean false"),
    ({"rollout": {"group_size": True}}, "c.toml: rollout.group_size: must be an integer, not the boolean true"),
    ({"rollout": {"temperature": True}}, "c.toml: rollout.temperature: must be a number, not the boolean true"),
    ({"rollout": {"temperature": float("nan")}},
     "c.toml: rollout.temperature: is nan, not a number; write a finite number such as 1.0"),
    ({"optimizer": {"max_grad_norm": float("inf")}},
     "c.toml: optimizer.max_grad_norm: is inf, not a finite number; write a finite number such as 1.0"),
    ({"objective": {"kl_coef": float("nan")}}, "c.toml: objective.kl_coef: is nan, not a number"),
])
def test_booleans_nan_and_inf_are_refused_as_what_they_are(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"name": "x", "backend": "mlx", **data}, "c.toml")
    assert str(err.value).startswith(message)
