"""Every command's `--json` output, run for real on the shipped model (MLX, the cheapest engine here: a few units,
one training cycle), validates against its published schema in docs/schemas/; a stale schema fails; the schemas
refuse a renamed, missing or extra field."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.cli_batch import InvarSession

from invar import canonical
from invar.cli.outputs import OUTPUTS
from invar.engines import DEFAULT_MODEL

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

SCHEMAS = REPO_ROOT / "docs" / "schemas"
POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"


def _schemas_script() -> Any:
    spec = importlib.util.spec_from_file_location("invar_schemas_script", REPO_ROOT / "scripts" / "schemas.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, dict) else \
        "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Each command's real --json output (some commands twice, in their other modes), by schema name: every command
    run for real, one after another in one process (tests/support/cli_batch.py: each as `python -m invar.cli` runs
    it, its own exit status and stdout; its engine workers started as a user's command starts them), so the file
    pays the CLI's start-up once instead of once per command."""
    with InvarSession(bound_s=600) as session:
        yield _outputs(tmp_path_factory.mktemp("schemas"), session)


def _outputs(out: Path, session: InvarSession) -> dict[str, list[dict[str, Any]]]:
    got: dict[str, list[dict[str, Any]]] = {}

    def invar(name: str, *args: str | Path, codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
        proc = session.run(*args)
        assert proc.returncode in codes, f"{name}: {proc.stderr[-2000:]}"
        doc: dict[str, Any] = json.loads(proc.stdout)
        got.setdefault(name, []).append(doc)
        return doc

    invar("version", "--version", "--json")
    invar("version", "version", "--json")
    package = invar("use-package", "use", "package", "mlx", "--json")
    ref = {**package, "model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
           "dtype": "float32"}
    cand = {**ref, "dtype": "bfloat16"}
    lines = ['name = "schemas"', "[population]", f'path = "{POPULATION}"',
             f'sha256 = "{POPULATION.with_suffix(".sha256").read_text().split()[0]}"', "sample = 4",
             "[scorer]", 'name = "arithmetic-exact"', "[sampling]", "temperature = 1.0", "max_tokens = 5",
             "[requirement]", 'standard = "population"', 'epsilon = "0.5"', 'confidence = "0.95"',
             'method = "paired-binary-exact"', "[pairing]", "seed = 3", 'layout = "b2"',
             "[layouts.b2]", "batch_size = 2", "[layouts.solo]", "batch_size = 1",
             "[invariance]", "required = true", 'layouts = ["b2", "solo"]', "[execution]", "requests_per_call = 4",
             "[measurements]", "teacher_forcing = true", 'capture_steps = [0, "last"]',
             "[[premises]]", 'statement = "The four prompts are the use."', 'party = "the test"',
             f'basis_sha256 = "{"0" * 64}"', 'reliance = "vouched"',
             "[reference]", *(f"{k} = {_toml(v)}" for k, v in ref.items()),
             "[candidate]", *(f"{k} = {_toml(v)}" for k, v in cand.items())]
    decl = out / "schemas.toml"
    decl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    invar("use-prepare", "use", "prepare", decl, "--json")
    contract = out / "schemas.contract.json"
    invar("use-plan", "use", "plan", contract, "--assume", "worse=0.01 better=0.01", "--method",
          "paired-binary-exact", "--sequential-max", "40", "--json")
    invar("use-plan", "use", "plan", contract, "--assume", "variance=0.02 mean=0", "--method", "maurer-pontil",
          "--json")
    run = invar("use-run", "use", "run", contract, "--run", out / "use", "--json")
    invar("use-run", "use", "run", contract, "--run", out / "use", "--json")  # already complete
    invar("keys-new", "keys", "new", "--out", out / "keys", "--json")
    samples = REPO_ROOT / "tests" / "imported" / "data" / "lm-eval-samples.jsonl"  # a real lm-eval export
    imported = out / "imported.toml"
    imported.write_text(f'name = "schemas-imported"\n[imported]\nformat = "lm-eval"\nmetric = "exact_match"\n'
                        f'reference = {{ path = "{samples}" }}\ncandidate = {{ path = "{samples}" }}\n'
                        '[requirement]\nstandard = "population"\nepsilon = "0.2"\nconfidence = "0.95"\n'
                        'method = "paired-binary-exact"\n', encoding="utf-8")
    invar("use-prepare-imported", "use", "prepare", imported, "--json")
    invar("use-admit-imported", "use", "admit", "--contract", out / "schemas-imported.contract.json", "--json",
          codes=(0, 10, 11))
    invar("use-summary", "use", "summary", out / "schemas-imported.contract.json", "--json")
    invar("use-admit", "use", "admit", out / "use", "--contract", contract, "--json", codes=(0, 10, 11))
    invar("use-admit", "use", "admit", out / "use", "--contract", contract, "--expect-head", run["chain_head"],
          "--receipt", out / "receipt.json", "--key", out / "keys" / "invar.key", "--json", codes=(0, 10, 11))
    invar("use-verify", "use", "verify", out / "receipt.json", "--run", out / "use", "--contract", contract,
          "--public-key", out / "keys" / "invar.pub", "--json")
    invar("inspect-records", "inspect", "records", out / "use", "--expect-head", run["chain_head"], "--json")
    invar("compare-numerical", "compare", "numerical", out / "use", "--json")
    invar("infer", "infer", "37+58=", "12*7=", "--engine", "mlx", "--run", out / "infer-a", "--json")
    invar("infer", "infer", "37+58=", "12*7=", "--engine", "mlx", "--dtype", "bfloat16", "--run", out / "infer-b",
          "--json")
    invar("evaluate", "evaluate", "--count", "4", "--engine", "mlx", "--run", out / "eval", "--json")
    invar("score", "score", "--from-run", out / "infer-a", "--capture-steps", "0,last", "--engine", "mlx",
          "--run", out / "score-a", "--json")
    invar("compare-numerical", "compare", "numerical", out / "infer-a", out / "infer-b", "--cand-scores",
          out / "score-a", "--ref-scores", out / "score-a", "--json")
    invar("compare-numerical", "compare", "numerical", out / "infer-a", out / "infer-b", "--json")
    config = out / "train.toml"
    config.write_text(f'name = "schemas"\nbackend = "mlx"\nmodel = "{DEFAULT_MODEL}"\nseed = 5\ncycles = 1\n'
                      f'[prompts]\npath = "{REPO_ROOT / "data" / "arith-train.jsonl"}"\nper_cycle = 2\n'
                      'kinds = ["mul"]\n[rollout]\ngroup_size = 2\ntemperature = 1.0\nmax_tokens = 5\n',
                      encoding="utf-8")
    invar("train", "train", config, "--run", out / "train", "--json")
    invar("train", "train", config, "--run", out / "train", "--json")  # already complete
    invar("inspect-history", "inspect", "history", out / "train", "--json")
    invar("compare-histories", "compare", "histories", out / "train", out / "train", "--json")
    # hf (the only engine a function kernel's check runs on); the bfloat16 softmax reaches first_disagreement
    invar("kernel-check", "kernel", "check", REPO_ROOT / "examples" / "kernels" / "softmax-bf16", "--prompts", "2",
          "--trials", "2", "--json")
    return got


def test_the_schemas_are_current() -> None:
    assert _schemas_script().stale() == []


def test_every_model_has_a_schema_and_every_schema_is_valid() -> None:
    assert sorted(p.name for p in SCHEMAS.glob("*.schema.json")) == sorted(f"{n}.schema.json" for n in OUTPUTS)
    for name in OUTPUTS:
        schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
        assert schema["$id"].startswith("urn:invar.outputs:")
        _validator(name)


def test_a_changed_model_makes_its_schema_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _schemas_script()
    monkeypatch.setattr(script, "FOLDER", tmp_path)
    monkeypatch.setattr(script, "ROOT", tmp_path.parent)
    for name in OUTPUTS:
        (tmp_path / f"{name}.schema.json").write_text(script.render(name), encoding="utf-8")
    assert script.stale() == []
    edited = json.loads((tmp_path / "use-admit.schema.json").read_text(encoding="utf-8"))
    edited["required"].remove("answer")
    (tmp_path / "use-admit.schema.json").write_text(json.dumps(edited), encoding="utf-8")
    (tmp_path / "gone.schema.json").write_text("{}", encoding="utf-8")
    assert script.stale() == [f"{tmp_path.name}/use-admit.schema.json is stale",
                              f"{tmp_path.name}/gone.schema.json has no model in invar.cli.outputs"]
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "schemas.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_real_output_validates(name: str, outputs: dict[str, list[dict[str, Any]]]) -> None:
    docs = outputs.get(name)
    assert docs, f"no command ran for {name}"
    validator = _validator(name)
    for doc in docs:
        errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(doc)]
        assert errors == [], errors


@pytest.mark.engine
def test_the_outputs_cover_each_optional_part(outputs: dict[str, list[dict[str, Any]]]) -> None:
    """The runs above reach the parts a schema could otherwise leave unchecked."""
    admit = outputs["use-admit"][0]
    for part in ("measurements", "bound", "diagnostics"):
        assert admit[part] is not None, part
    assert outputs["use-admit"][1]["receipt"] is not None
    assert [d["already_closed"] for d in outputs["use-run"]] == [False, True]
    assert [d["already_closed"] for d in outputs["train"]] == [False, True]
    assert outputs["use-plan"][0]["sequential"] is not None
    assert outputs["compare-numerical"][1]["captures"] is not None
    assert outputs["compare-numerical"][2]["teacher_forcing"] is None
    assert outputs["use-verify"][0]["key_checked"] is True
    assert outputs["kernel-check"][0]["first_disagreement"] is not None


@pytest.mark.engine
@pytest.mark.parametrize(("name", "edit"), [
    ("use-admit", "rename"), ("use-admit", "drop"), ("use-admit", "extra"), ("use-run", "rename"),
    ("infer", "nested"), ("inspect-history", "nested"), ("compare-numerical", "nested"), ("evaluate", "type"),
])
def test_a_renamed_missing_or_extra_field_is_refused(name: str, edit: str,
                                                     outputs: dict[str, list[dict[str, Any]]]) -> None:
    doc = copy.deepcopy(outputs[name][0])
    if edit == "rename":
        doc["chain_head_"] = doc.pop("chain_head")
    elif edit == "drop":
        del doc["answer"]
    elif edit == "extra":
        doc["task_loss"]["mean"] = 0.0
    elif edit == "type":
        doc["correct"] = "1"
    else:
        row = {"infer": lambda: doc["outputs"][0], "inspect-history": lambda: doc["cycles"][0],
               "compare-numerical": lambda: doc["generation"]}[name]()
        key = sorted(row)[0]
        row[f"{key}s"] = row.pop(key)
    assert list(_validator(name).iter_errors(doc)), f"{name}: a {edit} edit passed its schema"
