"""`invar evaluate`: a fixed policy's accuracy on the arithmetic population, scored by the core.

Decisions this command embodies:

- **The core scores.** The engine returns token ids only; the core decodes them with its own `Vocabulary` and
  scores them with `invar.tasks.arithmetic.score`. The accuracy is recomputable from the run's records alone.
- **Seeds are per problem.** Request i for problem `id` is drawn with `request_seed(seed, id)`, a pure function of
  the two, so a problem gets the same seed in any sample, batch size or engine: two engines evaluated with the same
  `--seed` are paired problem by problem.
- **A seeded sample** of `--count` problems (`sample_indices`, without replacement, in population order), or the
  whole population.
- **Clopper–Pearson interval** (exact binomial, two-sided, `--confidence`): it never undercovers, which suits a
  number people compare across engines; it is a little wider than Wilson's.
- One `generate` call per batch of `--batch-size` requests (one batch per call), so the progress bar moves per call.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from scipy import stats

from invar.cli.common import JsonOpt, emit_json
from invar.cli.infer import (
    AdapterOpt,
    Dtype,
    DtypeOpt,
    Engine,
    EngineOpt,
    EngineSpec,
    ModelOpt,
    Quantization,
    QuantOpt,
    RunOpt,
    TemperatureOpt,
    TopPOpt,
    check_output,
    default_run_dir,
    engine_session,
)
from invar.engines import DEFAULT_MODEL, REPO_ROOT
from invar.errors import ContractError, EvidenceError
from invar.protocol import WorkerClient
from invar.records import RunStore
from invar.tasks import MAX_ANSWER_CHARS, Problem, Vocabulary, load_population, score

DEFAULT_POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"
INTERVAL_METHOD = "clopper-pearson"


def clopper_pearson(correct: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided exact binomial interval for a proportion: `correct` successes of `n` trials, at `confidence`.

    Returns (lower, upper) in [0, 1]; lower is 0 when correct = 0 and upper is 1 when correct = n.
    """
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"need 0 ≤ correct ≤ n and n ≥ 1, got correct={correct}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    lower = 0.0 if correct == 0 else float(stats.beta.ppf(alpha / 2, correct, n - correct + 1))
    upper = 1.0 if correct == n else float(stats.beta.ppf(1 - alpha / 2, correct + 1, n - correct))
    return lower, upper


def request_seed(seed: int, problem_id: str) -> int:
    """The sampling seed of one problem: the first 63 bits of sha256 over (seed, problem id)."""
    digest = hashlib.sha256(f"invar-evaluate/{seed}/{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sample_indices(size: int, count: int | None, seed: int) -> list[int]:
    """Indices of a seeded sample of `count` of `size` problems, without replacement, in population order.

    `count` None (or equal to `size`) is the whole population.
    """
    if count is None or count == size:
        return list(range(size))
    if not 1 <= count <= size:
        raise ContractError(f"--count {count}: the population has {size} problems; ask for 1 to {size}")
    chosen = np.random.default_rng(seed).choice(size, size=count, replace=False)
    return sorted(int(i) for i in chosen)


def population_digest(population: Path, declared: str | None) -> str:
    """The declared sha256 of the population file, or the one in its `.sha256` sibling."""
    if declared is not None:
        return declared
    sibling = population.with_suffix(".sha256")
    if not sibling.is_file():
        raise ContractError(f"{population}: no {sibling.name} beside it; pass --population-sha256 with the digest "
                            "you expect")
    return sibling.read_text(encoding="ascii").split()[0]


def evaluate(
    count: Annotated[int | None, typer.Option("--count", help="Problems to evaluate (a seeded sample); default all.")]
    = None,
    sample_seed: Annotated[int, typer.Option("--sample-seed", help="Seed of the sample of --count problems.")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed; each problem's request seed derives from it.")]
    = 0,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most response tokens per problem.")]
    = MAX_ANSWER_CHARS + 1,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests per generate call (one batch).")] = 64,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence of the accuracy interval.")] = 0.95,
    population: Annotated[Path, typer.Option("--population", help="Population file (JSON lines).")]
    = DEFAULT_POPULATION,
    population_sha256: Annotated[
        str | None, typer.Option("--population-sha256", help="Its expected sha256; default: from <file>.sha256.")
    ] = None,
    engine: EngineOpt = Engine.HF,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DtypeOpt = Dtype.FLOAT32,
    quantization: QuantOpt = Quantization.NONE,
    adapter: AdapterOpt = None,
    run: RunOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a fixed policy on the population (or a seeded sample): accuracy with a confidence interval."""
    if batch_size < 1:
        raise ContractError(f"--batch-size {batch_size}: must be at least 1")
    if not 0 < confidence < 1:
        raise ContractError(f"--confidence {confidence}: must be in (0, 1), e.g. 0.95")
    pop_digest = population_digest(population, population_sha256)
    problems = load_population(population, pop_digest)
    chosen = [problems[i] for i in sample_indices(len(problems), count, sample_seed)]
    spec = EngineSpec(engine, model, dtype, quantization, adapter)
    meta = spec.meta()
    vocab = Vocabulary.from_model_dir(model)
    settings = {"population": str(population), "population_sha256": pop_digest, "count": len(chosen),
                "sample_seed": sample_seed, "seed": seed, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "batch_size": batch_size}
    run_dir = run if run is not None else default_run_dir("evaluate")
    started = time.perf_counter()
    losses: list[int] = []
    with RunStore.create(run_dir, meta={"command": "evaluate", **meta, **settings}) as store:
        with engine_session(spec, store) as session, _progress(len(chosen)) as advance:
            generating = time.perf_counter()
            for start in range(0, len(chosen), batch_size):
                batch = chosen[start : start + batch_size]
                losses += _run_batch(session.client, session.adapter, session.model_digest, vocab, batch,
                                     seed, temperature, top_p, max_tokens)
                advance(len(batch))
            generate_s = time.perf_counter() - generating
        wall_s = time.perf_counter() - started
        result = summarize(chosen, losses, confidence)
        result.update({"run": str(run_dir), **meta, **settings, "wall_s": round(wall_s, 3),
                       "generate_s": round(generate_s, 3)})
        store.put_meta("evaluation", result)
    if as_json:
        emit_json(result)
        return
    lo, hi = result["interval"]
    typer.echo(f"accuracy {result['accuracy']:.4f} ({result['correct']}/{result['problems']}), "
               f"{confidence:.0%} Clopper–Pearson interval [{lo:.4f}, {hi:.4f}]")
    typer.echo(f"{engine.value} on {model} ({meta['model_digest'][:12]}…), T={temperature:g}, seed {seed}, "
               f"{wall_s:.1f} s ({generate_s:.1f} s generating); records: {run_dir}")
    for kind, row in result["by_kind"].items():
        typer.echo(f"  {kind:<8} {row['correct']:>5}/{row['problems']:<5} {row['correct'] / row['problems']:.3f}")


def _run_batch(client: WorkerClient, adapter: str | None, model_digest: str, vocab: Vocabulary, batch: list[Problem],
               seed: int, temperature: float, top_p: float, max_tokens: int) -> list[int]:
    """One generate call for `batch` (one batch, in order); returns each problem's task loss, scored by the core."""
    requests = [{"request_id": p.id, "prompt": p.prompt, "seed": request_seed(seed, p.id),
                 "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens} for p in batch]
    report = client.call("generate", {"requests": requests, "layout": [list(range(len(requests)))],
                                      "adapter": adapter, "reference_adapter": None})
    outputs = report.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(batch):
        raise EvidenceError(f"generate returned {len(outputs) if isinstance(outputs, list) else 'no'} outputs for "
                            f"{len(batch)} requests")
    losses = []
    for p, out in zip(batch, outputs, strict=True):
        check_output(out, p.id, model_digest, report)
        losses.append(score(p.prompt, vocab.decode(out["tokens"])))
    return losses


def summarize(problems: list[Problem], losses: list[int], confidence: float) -> dict[str, Any]:
    """Accuracy (1 − mean task loss), its Clopper–Pearson interval, and the count per problem kind."""
    n = len(problems)
    correct = n - sum(losses)
    kinds: Counter[str] = Counter(p.kind for p in problems)
    right: Counter[str] = Counter(p.kind for p, loss in zip(problems, losses, strict=True) if loss == 0)
    lo, hi = clopper_pearson(correct, n, confidence)
    return {"problems": n, "correct": correct, "accuracy": correct / n, "interval": [lo, hi],
            "confidence": confidence, "interval_method": INTERVAL_METHOD,
            "by_kind": {k: {"problems": kinds[k], "correct": right[k]} for k in sorted(kinds)}}


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (stdout stays clean for --json); yields the function that advances it."""
    bar = Progress(TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task("evaluate", total=total)
        yield lambda done: bar.advance(task, done)
