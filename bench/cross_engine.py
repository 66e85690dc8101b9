"""How far apart the three engines' log-probabilities are on a model and its task: one command, one table.

    .venv/bin/python bench/cross_engine.py [--count 200] [--out docs/cross_engine.json]
    .venv/bin/python bench/cross_engine.py --model models/smollm2-135m-instruct --population data/chat-eval.jsonl \
        --scorer numeric --scorer-setting 'which="last"' --max-tokens 8 --temperatures 1.0,0.7,0 --alone \
        --engines hf,vllm --count 32 --batch-size 16 --out docs/cross_engine_smollm2.json
    ... the same with --engines hf,vllm,mlx --setting mlx:blas=openblas --out docs/cross_engine_smollm2_openblas.json

The first is the shipped tiny model on its arithmetic task (the defaults); the second the real model on its chat
task, on the two engines fast enough here for 32 chats (MLX's CPU backend with the BLAS its wheel bundles needs
about a quarter of a second per token of every forward on this model: docs/cross_engine.md runs it on fewer); the
third adds MLX with OpenBLAS (`--setting ENGINE:NAME=VALUE` gives one engine's worker a launch setting). For a
seeded sample of the population, at each temperature, every engine (Hugging Face, vLLM, MLX, or those `--engines`
names; float32, inference role) samples one response per unit with the same per-unit seed, and then EVERY engine
scores every engine's sampled tokens, teacher forced, at that temperature (at 1 for a greedy sample, T = 0, whose
`generate` log-probabilities are at 1). Reported, over every scored token:

- **pairs** (HF vs vLLM, HF vs MLX, vLLM vs MLX): the two engines' teacher-forced log-probabilities of the same
  tokens: the fraction bit-identical, max |diff| and p99 |diff| (nats);
- **self**: each engine's `generate` log-probabilities against its own `score` of the same tokens;
- **behavior vs another engine's reading**: engine A's `generate` log-probabilities against engine B's `score` of
  A's tokens, the learner–engine gap when A generates and B learns;
- **alone vs in a batch** (`--alone`): each engine's teacher-forced log-probabilities of the same tokens scored in a
  call of their own (a batch of one) against the same engine's score of them in the batch of `--batch-size`: the
  fraction bit-identical (of tokens, and of responses whose every token is), max and p99 |diff|.

Decisions this script embodies:

- **The prompts are `invar evaluate`'s**: each unit's text and token ids come from `ModelTokenizer.unit_prompt`, the
  function `invar evaluate` builds its requests with (a chat unit rendered by the model's own chat template), and
  each engine must report that it ran exactly those ids. Responses are scored by the core with the declared scorer
  (`--scorer`, as `invar evaluate` takes it).
- **MLX reads the folder as transformers wrote it**: its worker starts with its defaults, so it maps the config's
  `rope_parameters` onto what mlx-lm reads (`map_rope_parameters`; its identity in the JSON names the setting only
  when it is off).
- **Same seeds, not coupled sampling.** Request seeds are `invar evaluate`'s (`request_seed(seed, problem id)`), so
  a problem gets the same seed on every engine, but each engine draws with its own generator: responses differ. The
  comparison of numbers is therefore made on the same tokens, by teacher forcing each engine's responses through
  every engine, never by comparing two engines' samples.
- **Batches are the same everywhere**: the sample is cut into batches of `--batch-size` in population order; each
  batch is one `generate` call (one batch) and one `score` call per scoring engine, so the Hugging Face worker, which
  reproduces its bits only for the same batch composition, scores its own samples in the batch that drew them.
- **Bit-identical** means the float32 bit patterns are equal; |diff| is computed in float64 from the float32 values
  (exact). p99 is the 99th percentile taken as an observed value (`method="higher"`).
- Every call and report is kept in a run store under `runs/` (the workers share one store), so each number
  in the table can be recomputed from the records.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, launch_args, parse_launch_settings, start_worker  # noqa: E402
from invar.errors import EvidenceError, InvarError  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.runner.evaluate import population_digest, request_seed, sample_indices  # noqa: E402
from invar.runner.options import check_context, model_context  # noqa: E402
from invar.tasks import MAX_ANSWER_CHARS, ModelTokenizer  # noqa: E402
from invar.tasks.arithmetic import SCORER_NAME as ARITHMETIC  # noqa: E402
from invar.tasks.population import Unit, load_units  # noqa: E402
from invar.tasks.scorers import Scorer, check_units, load_scorer, scorer_identity  # noqa: E402
from invar.transport import WorkerClient  # noqa: E402

ENGINES = ("hf", "vllm", "mlx")
TEMPERATURES = (1.0, 0.7)
POPULATION = REPO / "data" / "arith-eval.jsonl"
BUDGET = MAX_ANSWER_CHARS + 1
"""Response tokens per request on the arithmetic task (the default `--max-tokens`): the longest answer plus EOS."""


# -- the numbers (pure) ---------------------------------------------------------------------------------------------


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """How two readings of the same tokens agree.

    a, b: float32 [N] log-probabilities (nats) of the same N tokens. Returns `tokens` N, `bit_identical` (count of
    equal float32 bit patterns), `fraction_bit_identical`, `bit_identical_nonzero` (those equal bit patterns that are
    not a log-probability of exactly 0, which every engine rounds a near-certain token to), `max_abs_diff`,
    `p99_abs_diff` (an observed value) and `mean_abs_diff`, the differences in nats computed in float64.
    """
    if a.shape != b.shape or a.ndim != 1 or a.dtype != np.float32 or b.dtype != np.float32:
        raise ValueError(f"need two float32 vectors of one length, got {a.dtype}{a.shape} and {b.dtype}{b.shape}")
    if a.size == 0:
        raise ValueError("no tokens to compare")
    equal = a.view(np.int32) == b.view(np.int32)
    same = int(np.count_nonzero(equal))
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return {"tokens": int(a.size), "bit_identical": same, "fraction_bit_identical": same / a.size,
            "bit_identical_nonzero": int(np.count_nonzero(equal & (a != 0))),
            "max_abs_diff": float(diff.max()), "p99_abs_diff": float(np.quantile(diff, 0.99, method="higher")),
            "mean_abs_diff": float(diff.mean())}


def items_bit_identical(a: list[np.ndarray], b: list[np.ndarray]) -> int:
    """How many responses two readings give exactly the same float32 bits on every token (a, b: one float32 [T_i]
    vector per response, in the same order)."""
    if len(a) != len(b):
        raise ValueError(f"need the same responses, got {len(a)} and {len(b)}")
    return sum(x.dtype == y.dtype == np.float32 and x.shape == y.shape and x.tobytes() == y.tobytes()
               for x, y in zip(a, b, strict=True))


def abs_diffs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a − b| in float64 nats, for float32 [N] readings of the same N tokens."""
    return np.abs(a.astype(np.float64) - b.astype(np.float64))


# -- running the engines --------------------------------------------------------------------------------------------


@dataclass
class Readings:
    """One temperature's raw numbers, each a float32 [N] vector over the sample's tokens in sample order."""

    tokens: dict[str, list[np.ndarray]]
    """Source engine → its sampled responses (int32 [T_i] each)."""
    behavior: dict[str, np.ndarray]
    """Source engine → the log-probabilities it reported when sampling."""
    scored: dict[tuple[str, str], np.ndarray]
    """(scoring engine, source engine) → the scorer's teacher-forced log-probabilities of the source's tokens."""
    losses: dict[str, list[float]]
    """Source engine → the core's task loss of each response."""
    alone: dict[tuple[str, str], np.ndarray] | None = None
    """As `scored`, each response scored in a call of its own (a batch of one); None when not measured."""


def _check_outputs(outputs: Any, ids: list[str], key: str, what: str) -> list[dict[str, Any]]:
    if not isinstance(outputs, list) or [o.get(key) for o in outputs] != ids:
        raise EvidenceError(f"{what}: the outputs do not answer the requests in order")
    return outputs


def unit_prompts(vocab: ModelTokenizer, units: list[Unit], max_tokens: int, context: int | None) -> list[
        tuple[str, list[int]]]:
    """Each unit's text and prompt ids as `invar evaluate` sends them (`ModelTokenizer.unit_prompt`: a chat unit
    rendered by the model's template), each checked to fit the model's context with `max_tokens` more."""
    prompts = [vocab.unit_prompt(u) for u in units]
    for u, (_, ids) in zip(units, prompts, strict=True):
        check_context(len(ids), max_tokens, context, f"unit {u.id}")
    return prompts


def generate_requests(units: list[Unit], prompts: list[tuple[str, list[int]]], *, seed: int, temperature: float,
                      max_tokens: int) -> list[dict[str, Any]]:
    """The `generate` requests of one batch: `invar evaluate`'s per-unit seed, the unit's text as the label."""
    return [{"request_id": u.id, "prompt": text, "prompt_ids": ids, "seed": request_seed(seed, u.id),
             "temperature": temperature, "top_p": 1.0, "max_tokens": max_tokens}
            for u, (text, ids) in zip(units, prompts, strict=True)]


def score_temperature(temperature: float) -> float:
    """The temperature samples drawn at `temperature` are scored at: a greedy sample's log-probabilities are at 1."""
    return temperature if temperature > 0 else 1.0


def _read_scores(pending: Any, ids: list[str], drawn: list[dict[str, Any]], what: str) -> list[np.ndarray]:
    outs = _check_outputs(pending.result()["outputs"], ids, "item_id", what)
    for o, t in zip(outs, drawn, strict=True):
        if o["logprobs"].shape != t["tokens"].shape:
            raise EvidenceError(f"{what}: {o['item_id']} has {o['logprobs'].size} log-probabilities "
                                f"for {t['tokens'].size} tokens")
    return [o["logprobs"] for o in outs]


def run_temperature(workers: dict[str, WorkerClient], units: list[Unit], prompts: list[tuple[str, list[int]]],
                    vocab: ModelTokenizer, scorer: Scorer, *, temperature: float, seed: int, batch_size: int,
                    max_tokens: int, alone: bool = False) -> Readings:
    """Every engine samples every unit at `temperature`; every engine scores every engine's samples (and with
    `alone`, scores each of them again in a call of its own). The engines are `workers`' names."""
    engines = tuple(workers)
    tokens: dict[str, list[np.ndarray]] = {e: [] for e in engines}
    behavior: dict[str, list[np.ndarray]] = {e: [] for e in engines}
    scored: dict[tuple[str, str], list[np.ndarray]] = {(s, e): [] for s in engines for e in engines}
    single: dict[tuple[str, str], list[np.ndarray]] = {(s, e): [] for s in engines for e in engines}
    forced_t = score_temperature(temperature)
    for start in range(0, len(units), batch_size):
        batch = units[start:start + batch_size]
        ids = [u.id for u in batch]
        asked_prompts = prompts[start:start + batch_size]
        reqs = generate_requests(batch, asked_prompts, seed=seed, temperature=temperature, max_tokens=max_tokens)
        pending = {e: workers[e].submit("generate", {"requests": reqs, "layout": [list(range(len(reqs)))],
                                                     "adapter": None, "reference_adapter": None})
                   for e in engines}
        drawn = {e: _check_outputs(p.result()["outputs"], ids, "request_id", f"{e} generate")
                 for e, p in pending.items()}
        for e in engines:
            for o, (_, asked) in zip(drawn[e], asked_prompts, strict=True):
                if not isinstance(o.get("prompt_tokens"), np.ndarray) or o["prompt_tokens"].tolist() != asked:
                    raise EvidenceError(f"{e} generate: {o['request_id']} ran other prompt tokens than asked")
            tokens[e] += [o["tokens"] for o in drawn[e]]
            behavior[e] += [o["logprobs"] for o in drawn[e]]
        for source in engines:
            items = [{"item_id": u.id, "prompt": text, "prompt_ids": asked, "response_tokens": o["tokens"],
                      "temperature": forced_t, "vocab_steps": []}
                     for u, (text, asked), o in zip(batch, asked_prompts, drawn[source], strict=True)]
            waiting = {s: workers[s].submit("score", {"items": items, "adapter": None}) for s in engines}
            for s, p in waiting.items():
                scored[(s, source)] += _read_scores(p, ids, drawn[source], f"{s} score of {source}'s samples")
            if alone:  # every item in a call of its own, all submitted at once: the engines work side by side
                calls = {s: [workers[s].submit("score", {"items": [it], "adapter": None}) for it in items]
                         for s in engines}
                for s, each in calls.items():
                    for p, i, o in zip(each, ids, drawn[source], strict=True):
                        single[(s, source)] += _read_scores(p, [i], [o], f"{s} score of {source}'s {i} alone")
    losses = {e: [scorer.loss(u, vocab.decode(t)) for u, t in zip(units, tokens[e], strict=True)] for e in engines}
    return Readings(tokens, {e: np.concatenate(v) for e, v in behavior.items()},
                    {k: np.concatenate(v) for k, v in scored.items()}, losses,
                    {k: np.concatenate(v) for k, v in single.items()} if alone else None)


def _split(r: Readings, values: np.ndarray, source: str) -> list[np.ndarray]:
    """A source's concatenated readings cut back into one vector per response."""
    return np.split(values, np.cumsum([t.size for t in r.tokens[source]])[:-1])


def summarize(r: Readings) -> dict[str, Any]:
    """The table's rows for one temperature, from its readings."""
    engines = tuple(r.tokens)
    pairs = {}
    for a, b in combinations(engines, 2):
        row = agreement(np.concatenate([r.scored[(a, e)] for e in engines]),
                        np.concatenate([r.scored[(b, e)] for e in engines]))
        row["by_source"] = {e: agreement(r.scored[(a, e)], r.scored[(b, e)]) for e in engines}
        pairs[f"{a}-{b}"] = row
    n = len(r.losses[engines[0]])
    same_tokens = {f"{a}-{b}": sum(x.tobytes() == y.tobytes() for x, y in zip(r.tokens[a], r.tokens[b], strict=True))
                   for a, b in combinations(engines, 2)}
    out = {
        "pairs": pairs,
        "self": {e: agreement(r.behavior[e], r.scored[(e, e)]) for e in engines},
        "behavior_vs_other": {f"{a}-by-{b}": agreement(r.behavior[a], r.scored[(b, a)])
                              for a in engines for b in engines if a != b},
        "identical_responses": same_tokens,
        "accuracy": {e: 1 - sum(r.losses[e]) / n for e in engines},
        "response_tokens": {e: int(r.behavior[e].size) for e in engines},
    }
    if r.alone is not None:
        single = r.alone
        rows = {}
        for s in engines:
            row = agreement(np.concatenate([single[(s, e)] for e in engines]),
                            np.concatenate([r.scored[(s, e)] for e in engines]))
            row["responses"] = n * len(engines)
            row["responses_bit_identical"] = sum(
                items_bit_identical(_split(r, single[(s, e)], e), _split(r, r.scored[(s, e)], e)) for e in engines)
            row["by_source"] = {e: agreement(single[(s, e)], r.scored[(s, e)]) for e in engines}
            rows[s] = row
        out["alone_vs_batch"] = rows
    return out


# -- output ---------------------------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The measured tables, as markdown."""
    lines = ["| T | pair | tokens scored | bit-identical | max \\|diff\\| (nats) | p99 \\|diff\\| (nats) |",
             "|---|---|---|---|---|---|"]
    for t, res in result["temperatures"].items():
        for name, row in res["pairs"].items():
            lines.append(f"| {t} | {name.replace('-', ' vs ')} | {row['tokens']} | {row['fraction_bit_identical']:.1%} "
                         f"| {row['max_abs_diff']:.3g} | {row['p99_abs_diff']:.3g} |")
    lines += ["",
              "| T | engine: generate vs its own score | tokens | bit-identical | max \\|diff\\| | p99 \\|diff\\| |",
              "|---|---|---|---|---|---|"]
    for t, res in result["temperatures"].items():
        for name, row in res["self"].items():
            lines.append(f"| {t} | {name} | {row['tokens']} | {row['fraction_bit_identical']:.1%} | "
                         f"{row['max_abs_diff']:.3g} | {row['p99_abs_diff']:.3g} |")
    lines += ["", "| T | A's generate vs B's score of A's tokens | bit-identical | max \\|diff\\| | p99 \\|diff\\| |",
              "|---|---|---|---|---|"]
    for t, res in result["temperatures"].items():
        for name, row in res["behavior_vs_other"].items():
            a, b = name.split("-by-")
            lines.append(f"| {t} | {a} by {b} | {row['fraction_bit_identical']:.1%} | {row['max_abs_diff']:.3g} | "
                         f"{row['p99_abs_diff']:.3g} |")
    first = next(iter(result["temperatures"].values()))
    engines = [e for e in ENGINES if e in first["accuracy"]]
    lines += ["", f"| T | accuracy ({' / '.join(engines)}) | identical responses "
              f"({' / '.join(first['identical_responses'])}) |", "|---|---|---|"]
    for t, res in result["temperatures"].items():
        acc = " / ".join(f"{res['accuracy'][e]:.3f}" for e in engines)
        same = " / ".join(str(v) for v in res["identical_responses"].values())
        lines.append(f"| {t} | {acc} | {same} of {result['count']} |")
    if any("alone_vs_batch" in res for res in result["temperatures"].values()):
        lines += ["", f"| T | engine: alone vs in a batch of {result['batch_size']} | tokens | bit-identical | "
                  "responses bit-identical | max \\|diff\\| | p99 \\|diff\\| |", "|---|---|---|---|---|---|---|"]
        for t, res in result["temperatures"].items():
            for name, row in res.get("alone_vs_batch", {}).items():
                lines.append(f"| {t} | {name} | {row['tokens']} | {row['fraction_bit_identical']:.1%} | "
                             f"{row['responses_bit_identical']} of {row['responses']} | {row['max_abs_diff']:.3g} | "
                             f"{row['p99_abs_diff']:.3g} |")
    return "\n".join(lines)


def plot(diffs: dict[str, dict[str, np.ndarray]], out: Path) -> None:
    """ECDF of |diff| per engine pair (solid), per engine's generate vs its own score (dashed) and, where measured,
    per engine alone vs in a batch (dotted); one panel per temperature, log x. A curve's height at the left edge is
    the fraction of bit-identical tokens (|diff| = 0 cannot sit on a log axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(diffs), figsize=(6 * len(diffs), 4.8), sharey=True, squeeze=False)
    every = np.concatenate([d for by_pair in diffs.values() for d in by_pair.values()])
    positive = every[every > 0]
    # The axis spans every nonzero difference, so the left edge holds exactly the zeros.
    floor = 10.0 ** (np.floor(np.log10(positive.min())) - 1) if positive.size else 1e-12
    ceiling = 10.0 ** np.ceil(np.log10(positive.max())) if positive.size else 1.0
    for ax, (t, by_pair) in zip(axes[0], diffs.items(), strict=True):
        all_zero = []
        for name, d in by_pair.items():
            x = np.sort(d)
            y = np.arange(1, x.size + 1) / x.size
            zero = float(np.mean(x == 0))
            nz = x > 0
            xs = np.concatenate([[floor, ceiling] if zero == 1 else [floor], x[nz]])
            ys = np.concatenate([[1.0, 1.0] if zero == 1 else [zero], y[nz]])
            style = "--" if name.endswith("(self)") else ":" if name.endswith("(alone)") else "-"
            ax.step(xs, ys, where="post", linestyle=style, label=name)
            if zero == 1:
                all_zero.append(name)
        if all_zero:  # such a curve lies on the top edge
            ax.text(0.02, 0.97, "every token exactly equal:\n" + "\n".join(all_zero), transform=ax.transAxes,
                    va="top", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(floor, ceiling)
        ax.set_ylim(0, 1.01)
        ax.set_title(f"T = {t}: teacher-forced log-probabilities of the same tokens")
        ax.set_xlabel("|diff| (nats); left edge: exactly 0")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("fraction of tokens with |diff| ≤ x")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _temperatures(text: str) -> tuple[float, ...]:
    """`--temperatures 1.0,0.7,0` as numbers, each ≥ 0 (0 is greedy), none twice."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write numbers separated by commas, e.g. 1.0,0.7,0") from None
    if not values or any(not (np.isfinite(v) and v >= 0) for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: each temperature finite and ≥ 0 (0 is greedy), each once")
    return values


def _engines(text: str) -> tuple[str, ...]:
    """`--engines hf,vllm` as engine names in the table's order: two or more of hf, vllm, mlx."""
    names = [n.strip() for n in text.split(",")]
    if len(names) < 2 or len(set(names)) != len(names) or not set(names) <= set(ENGINES):
        raise argparse.ArgumentTypeError(f"{text!r}: name two or more of {','.join(ENGINES)}, each once")
    return tuple(e for e in ENGINES if e in names)


def _shown(path: Path) -> str:
    """A path as the JSON names it: relative to the checkout where it lies inside it (links not followed)."""
    absolute = Path(os.path.abspath(path))
    return str(absolute.relative_to(REPO)) if absolute.is_relative_to(REPO) else str(path)


def main(argv: list[str] | None = None) -> int:
    from invar.cli.evaluate import _settings as scorer_settings  # `--scorer-setting` read as `invar evaluate` does

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200, help="problems in the seeded sample")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (per problem: invar evaluate's)")
    parser.add_argument("--batch-size", type=int, default=64, help="requests per generate / score call")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model folder, read by every engine")
    parser.add_argument("--population", type=Path, default=POPULATION,
                        help="population file (JSON lines), its sha256 in the .sha256 file beside it")
    parser.add_argument("--scorer", default=ARITHMETIC, help="a built-in scorer, as `invar evaluate --scorer`")
    parser.add_argument("--scorer-setting", action="append", default=[], metavar="NAME=JSON",
                        help="a scorer setting, as `invar evaluate --scorer-setting`; repeatable")
    parser.add_argument("--max-tokens", type=int, default=BUDGET, help="most response tokens per unit")
    parser.add_argument("--temperatures", type=_temperatures, default=TEMPERATURES,
                        help="sampling temperatures, comma-separated (0: greedy); default 1.0,0.7")
    parser.add_argument("--engines", type=_engines, default=ENGINES,
                        help="the engines compared, comma-separated, at least two; default hf,vllm,mlx")
    parser.add_argument("--alone", action="store_true",
                        help="also score every response in a call of its own, against its score in the batch")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "cross_engine.json",
                        help="JSON result; the plot is written beside it as .png")
    parser.add_argument("--run", type=Path, default=None, help="run directory (default: runs/cross-engine-<time>)")
    parser.add_argument("--setting", action="append", default=[], metavar="ENGINE:NAME=VALUE",
                        help="a launch setting of one engine's worker, e.g. mlx:blas=openblas (repeatable)")
    args = parser.parse_args(argv)
    launch: dict[str, dict[str, Any]] = {}
    for item in args.setting:
        engine, sep, setting = item.partition(":")
        if not sep or engine not in args.engines:
            parser.error(f"--setting {item!r}: write ENGINE:NAME=VALUE for one of {','.join(args.engines)}")
        try:
            launch.setdefault(engine, {}).update(parse_launch_settings(engine, [setting]))
        except InvarError as exc:
            parser.error(str(exc))
    if args.batch_size < 1:
        parser.error(f"--batch-size {args.batch_size}: must be at least 1")
    if args.max_tokens < 1:
        parser.error(f"--max-tokens {args.max_tokens}: must be at least 1")

    started = time.perf_counter()
    now = datetime.datetime.now(datetime.UTC)
    pop_digest = population_digest(args.population, None)
    units = load_units(args.population, pop_digest)
    scorer = load_scorer(args.scorer, scorer_settings(args.scorer_setting), REPO)
    check_units(scorer, units)
    chosen = [units[i] for i in sample_indices(len(units), args.count, args.sample_seed)]
    model = args.model
    vocab = ModelTokenizer.from_model_dir(model)
    prompts = unit_prompts(vocab, chosen, args.max_tokens, model_context(model))
    load = {"model_dir": str(model), "model_digest": canonical.tree_digest(model), "dtype": "float32",
            "quantization": "none", "adapter": None}
    run_dir = args.run or REPO / "runs" / f"cross-engine-{now:%Y%m%d-%H%M%S}"
    settings = {"count": len(chosen), "sample_seed": args.sample_seed, "seed": args.seed,
                "batch_size": args.batch_size, "temperatures": list(args.temperatures), "max_tokens": args.max_tokens,
                "population": _shown(args.population), "population_sha256": pop_digest,
                "scorer": scorer_identity(scorer), "model": _shown(model), "model_digest": load["model_digest"],
                "dtype": "float32", "alone": args.alone, "engine_names": list(args.engines),
                "launch_settings": launch}
    command = ".venv/bin/python bench/cross_engine.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    results: dict[str, Any] = {}
    diffs: dict[str, dict[str, np.ndarray]] = {}
    workers: dict[str, WorkerClient] = {}
    with RunStore.create(run_dir, meta={"command": "bench/cross_engine", **settings}) as store:
        try:
            for e in args.engines:
                workers[e] = start_worker(e, Role.INFERENCE, recorder=store,
                                          args=launch_args(e, launch.get(e, {}), {}))
            loading = {e: w.submit("load_model", load) for e, w in workers.items()}
            for e, p in loading.items():
                if p.result()["model_digest"] != load["model_digest"]:
                    raise EvidenceError(f"{e} load_model: reported another model digest")
            ready_s = time.perf_counter() - started
            seconds: dict[str, float] = {}
            for t in args.temperatures:
                began = time.perf_counter()
                engines = tuple(workers)
                r = run_temperature(workers, chosen, prompts, vocab, scorer, temperature=t, seed=args.seed,
                                    batch_size=args.batch_size, max_tokens=args.max_tokens, alone=args.alone)
                seconds[str(t)] = round(time.perf_counter() - began, 1)
                results[str(t)] = summarize(r)
                by_pair = {f"{a} vs {b}": abs_diffs(np.concatenate([r.scored[(a, e)] for e in engines]),
                                                    np.concatenate([r.scored[(b, e)] for e in engines]))
                           for a, b in combinations(engines, 2)}
                by_pair.update({f"{e} generate vs score (self)": abs_diffs(r.behavior[e], r.scored[(e, e)])
                                for e in engines})
                if r.alone is not None:
                    by_pair.update({f"{e} alone vs batch (alone)": abs_diffs(
                        np.concatenate([r.alone[(e, s)] for s in engines]),
                        np.concatenate([r.scored[(e, s)] for s in engines])) for e in engines})
                diffs[str(t)] = by_pair
            identities = {e: {"engine_version": w.identity.engine_version, "settings": w.identity.settings,
                              "identity_digest": w.worker_key} for e, w in workers.items()}
        finally:
            for w in workers.values():
                w.close()
        wall_s = time.perf_counter() - started
        shown = run_dir.resolve().relative_to(REPO) if run_dir.resolve().is_relative_to(REPO) else run_dir
        result = {"command": command, "date_utc": now.isoformat(timespec="seconds"), "run": str(shown),
                  **settings, "engines": identities, "temperatures": results,
                  "wall_s": round(wall_s, 1), "engines_ready_s": round(ready_s, 1), "temperature_s": seconds}
        store.put_meta("cross_engine", result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    png = args.out.with_suffix(".png")
    plot(diffs, png)
    print(markdown(result))
    print(f"\n{len(chosen)} units, {wall_s:.0f} s ({ready_s:.0f} s starting engines); "
          f"JSON {args.out}, plot {png}, records {run_dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InvarError as exc:  # bad input or a worker's error: one line, no traceback
        print(f"cross_engine: {exc}", file=sys.stderr)
        sys.exit(2)
