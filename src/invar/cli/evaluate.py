"""`invar evaluate`: a fixed policy's accuracy on a population (the arithmetic one by default), scored by the core;
for a scorer whose losses lie in a declared range (not 0/1), its mean loss.

The evaluation itself (per-problem seeds, the seeded sample, core scoring, the Clopper–Pearson interval) lives in
`invar.runner.evaluate`; this module parses options, shows progress and prints.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from invar.cli.common import JsonOpt, QuietOpt, emit_model
from invar.cli.options import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_MODEL,
    AdapterOpt,
    CallTimeoutOpt,
    ConfidenceOpt,
    DtypeOpt,
    EngineOpt,
    MaxTokensOpt,
    ModelOpt,
    PatchOpt,
    PopulationOpt,
    QuantOpt,
    RunOpt,
    ScorerOpt,
    ScorerSettingOpt,
    SettingOpt,
    TemperatureOpt,
    TopPOpt,
    model_folder,
)
from invar.engines import Dtype, Engine, Quantization, parse_launch_settings
from invar.errors import ContractError
from invar.home import HOME

# The run store, the runner, the tasks and the progress display (numpy, the tokenizer, rich) are imported when the
# command runs: its `--help` and a refused option need none of them (tests/cli/test_lazy_imports.py).
if TYPE_CHECKING:
    from invar.cli.progress import Reporter

ARITHMETIC = "arithmetic-exact"
"""`invar.tasks.arithmetic.SCORER_NAME`, the default --scorer (checked equal in tests/cli/test_lazy_imports.py)."""
MAX_ANSWER_CHARS = 4
"""`invar.tasks.MAX_ANSWER_CHARS`: the default --max-tokens is one more (checked equal in the same test)."""

DEFAULT_POPULATION = HOME / "data" / "arith-eval.jsonl"


def evaluate(
    count: Annotated[int | None, typer.Option("--count", help="Problems to evaluate (a seeded sample); default all.")]
    = None,
    sample_seed: Annotated[int, typer.Option("--sample-seed", help="Seed of the sample of --count problems.")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed; each problem's request seed derives from it.")]
    = 0,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    max_tokens: MaxTokensOpt = MAX_ANSWER_CHARS + 1,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests per generate call (one batch).")] = 64,
    confidence: ConfidenceOpt = 0.95,
    population: PopulationOpt = DEFAULT_POPULATION,
    population_sha256: Annotated[
        str | None, typer.Option("--population-sha256", help="Its expected sha256; default: from <file>.sha256.")
    ] = None,
    scorer_name: ScorerOpt = ARITHMETIC,
    scorer_setting: ScorerSettingOpt = None,
    engine: EngineOpt = Engine.HF,
    setting: SettingOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DtypeOpt = Dtype.FLOAT32,
    quantization: QuantOpt = Quantization.NONE,
    adapter: AdapterOpt = None,
    patch: PatchOpt = None,
    run: RunOpt = None,
    call_timeout: CallTimeoutOpt = DEFAULT_CALL_TIMEOUT,
    responses: Annotated[bool, typer.Option(
        "--responses", help="Also list each unit's response: what the model read (text and ids), what it answered, "
                            "the expected answer and the loss the scorer gave.")] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Evaluate a fixed policy on the population (or a seeded sample): accuracy with a confidence interval (for a
    scorer with losses in a declared range, binary = false: the mean loss with a betting interval)."""
    from invar.cli.progress import reporting
    from invar.patches import select as select_patches
    from invar.records import RunStore
    from invar.runner.engine import EngineSpec, default_run_dir
    from invar.runner.evaluate import EvaluationSettings, evaluate_policy, population_digest, sample_indices
    from invar.runner.options import SEED_MAX, check_sampling
    from invar.tasks.population import load_units
    from invar.tasks.scorers import check_units, load_scorer, scorer_identity

    check_sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seeds=(seed,),
                   batch_size=batch_size, call_timeout=call_timeout)
    if not 0 <= sample_seed <= SEED_MAX:
        raise ContractError(f"--sample-seed {sample_seed}: must be in [0, 2^63 − 1]")
    if not 0 < confidence < 1:
        raise ContractError(f"--confidence {confidence}: must be in (0, 1), e.g. 0.95")
    pop_digest = population_digest(population, population_sha256)
    problems = load_units(population, pop_digest)
    scorer_file, scorer_dir = _scorer_location(scorer_name)
    scorer = load_scorer(scorer_file, _settings(scorer_setting or []), scorer_dir)
    check_units(scorer, problems)
    chosen = [problems[i] for i in sample_indices(len(problems), count, sample_seed)]
    model = model_folder(model)  # --model FILE.gguf names the folder that holds it
    patches, patch_dirs = select_patches(patch or [], engine.value, "--patch")
    spec = EngineSpec(engine, model, dtype, quantization, adapter, patches=patches, patch_dirs=patch_dirs,
                      settings=parse_launch_settings(engine.value, setting or []))
    meta = spec.meta()
    settings = {"population": str(population), "population_sha256": pop_digest, "scorer": scorer_identity(scorer),
                "count": len(chosen),
                "sample_seed": sample_seed, "seed": seed, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "batch_size": batch_size}
    run_dir = run if run is not None else default_run_dir("evaluate")
    started = time.perf_counter()
    with RunStore.create(run_dir, meta={"command": "evaluate", **meta, **settings}) as store:
        with reporting(quiet) as shown:
            done = [0]
            rows: list[dict[str, Any]] | None = [] if responses else None

            def advance(units: int) -> None:
                done[0] += units
                shown.count(done[0])

            result = evaluate_policy(
                spec, chosen, EvaluationSettings(seed, temperature, top_p, max_tokens, batch_size, confidence),
                store, scorer, call_timeout=call_timeout, advance=advance,
                phase=lambda text: _phase(shown, text, len(chosen)), responses=rows)
        wall_s = time.perf_counter() - started
        result.update({"run": str(run_dir), **meta, **settings, "wall_s": round(wall_s, 3)})
        store.put_meta("evaluation", result)
        result["chain_head"] = store.close_run()
    if rows is not None:  # not in the run's meta: the records already hold every response
        result["responses"] = rows
    if as_json:
        from invar.cli.outputs import EvaluateAnyOutput  # the models cost a start that prints text nothing

        # The evaluation as the run's meta keeps it, validated by the output's model and printed as it.
        emit_model(EvaluateAnyOutput.model_validate(result), exclude_unset=True)
        return
    for r in rows or []:
        typer.echo(f"[{r['unit_id']}] loss {r['loss']:g}  expected {json.dumps(r['answer'], ensure_ascii=False)}  "
                   f"answered {json.dumps(r['response'], ensure_ascii=False)} ({r['finish_reason']})")
        typer.echo(f"    prompt {json.dumps(r['prompt'], ensure_ascii=False)}  ids {r['prompt_ids']}")
    lo, hi = result["interval"]
    if scorer.binary:
        typer.echo(f"accuracy {result['accuracy']:.4f} ({result['correct']}/{result['problems']}), "
                   f"{confidence:.0%} Clopper–Pearson interval [{lo:.4f}, {hi:.4f}]")
    else:
        a, b = result["loss_range"]
        typer.echo(f"mean loss {result['mean_loss']:.4f} over {result['problems']} problems (losses in [{a:g}, "
                   f"{b:g}]), {confidence:.0%} betting interval [{lo:.4f}, {hi:.4f}]")
    typer.echo(f"{engine.value} on {model} ({meta['model_digest'][:12]}…), T={temperature:g}, seed {seed}, "
               f"{wall_s:.1f} s ({result['generate_s']:.1f} s generating); records: {run_dir}")
    typer.echo(f"chain head {result['chain_head']}")
    for kind, row in result["by_kind"].items():
        if scorer.binary:
            typer.echo(f"  {kind:<8} {row['correct']:>5}/{row['problems']:<5} "
                       f"{row['correct'] / row['problems']:.3f}")
        else:
            typer.echo(f"  {kind:<8} {row['problems']:>5} problems, mean loss {row['mean_loss']:.4f}")


def _phase(shown: Reporter, text: str, units: int) -> None:
    """A phase of the evaluation as shown: generating counts the units."""
    if text == "generating":
        shown.phase(text, total=units, unit="units")
    else:
        shown.phase(text)


def _scorer_location(name: str) -> tuple[str, Path]:
    """A `--scorer` as `load_scorer` takes it: a built-in's name, or `file.py:function` and the file's folder (a
    command-line path may be absolute or relative to where the command runs)."""
    path, sep, function = name.rpartition(":")
    if not sep or not path.endswith(".py"):
        return name, Path.cwd()
    return f"{Path(path).name}:{function}", Path(path).parent.resolve()


def _settings(items: list[str]) -> dict[str, Any]:
    """`--scorer-setting NAME=JSON` options as the scorer's settings; one line naming a malformed one, or one given
    twice."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ContractError(f"--scorer-setting {item!r}: write NAME=JSON, e.g. case_fold=true")
        if name in given:
            raise ContractError(f"--scorer-setting {name} is given twice ({name}={given[name]}, then {name}={value}); "
                                "give each setting once")
        given[name] = value
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            raise ContractError(f"--scorer-setting {item!r}: the value is not JSON; quote a string as JSON, "
                                f'e.g. {name}=\'"text"\'') from None
    return out
