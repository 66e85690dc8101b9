"""`invar score`: teacher-forced log-probabilities of given tokens, and whole-vocabulary captures at chosen steps.

The scoring itself (items, batches, checks) is `invar.runner.score`; this module parses options and prints. The
tokens come from a JSON-lines file (`--tokens`) or from a run's sampled responses (`--from-run`, each scored at its
request's temperature in the batches it was sampled in). Every call and report is kept in the run's records.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from invar.cli.common import JsonOpt, QuietOpt, emit_model
from invar.cli.options import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_MODEL,
    AdapterOpt,
    CallTimeoutOpt,
    DtypeOpt,
    EngineOpt,
    ModelOpt,
    PatchOpt,
    QuantOpt,
    RunOpt,
    SettingOpt,
    model_folder,
)
from invar.engines import Dtype, Engine, Quantization, parse_launch_settings
from invar.errors import InvarError

# The runner, the run store, the step parser, the patches and the tokenizer (numpy, msgpack, tokenizers) are imported
# when the command runs: its `--help` needs none of them (tests/cli/test_lazy_imports.py).
if TYPE_CHECKING:
    from invar.runner.score import ScoredOutput
    from invar.tasks import ModelTokenizer

_SHOWN = 50
"""Items printed one by one in text mode; --json lists every item."""


def score(
    tokens: Annotated[
        Path | None, typer.Option("--tokens", help="JSON lines: {\"item_id\", \"prompt\", \"tokens\": [ids], "
                                                   "\"temperature\"?}.")
    ] = None,
    from_run: Annotated[
        Path | None, typer.Option("--from-run", help="Score the sampled responses of this infer or evaluate run, "
                                                     "at each request's temperature, in its batches.")
    ] = None,
    capture_steps: Annotated[
        str | None, typer.Option("--capture-steps", help="Steps with a whole-vocabulary capture: numbers, 'last', "
                                                         "'every:K', comma-separated (e.g. 0,1,last); leave it out "
                                                         "for none. A step past a response's end is refused.")
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Temperature of --tokens items that state none (> 0).")
    ] = 1.0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Items per score call (--tokens).")] = 64,
    engine: EngineOpt = Engine.HF,
    setting: SettingOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DtypeOpt = Dtype.FLOAT32,
    quantization: QuantOpt = Quantization.NONE,
    adapter: AdapterOpt = None,
    patch: PatchOpt = None,
    run: RunOpt = None,
    call_timeout: CallTimeoutOpt = DEFAULT_CALL_TIMEOUT,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Score given tokens teacher-forced: each token's log-probability and, at the capture steps, the whole
    vocabulary's; keep the records."""
    import numpy as np

    from invar.cli.progress import reporting
    from invar.compare.steps import parse_steps, show_steps
    from invar.patches import select as select_patches
    from invar.runner.engine import EngineSpec, default_run_dir
    from invar.runner.options import TEMPERATURE_MAX, check_sampling
    from invar.runner.score import score_run, score_source
    from invar.tasks import ModelTokenizer

    if (tokens is None) == (from_run is None):
        raise InvarError("give the tokens to score: --tokens FILE or --from-run RUN (one of them)")
    if not 0 < temperature <= TEMPERATURE_MAX:  # also refuses NaN
        raise InvarError(f"--temperature {temperature}: scoring needs a temperature in (0, {TEMPERATURE_MAX:g}]")
    check_sampling(temperature=temperature, top_p=1.0, max_tokens=1, batch_size=batch_size,
                   call_timeout=call_timeout)
    if capture_steps is not None and not capture_steps.strip():
        raise InvarError(f"--capture-steps {capture_steps!r}: name at least one step (e.g. 0,last), or leave the "
                         "option out for no captures")
    try:
        spec_steps = parse_steps(capture_steps) if capture_steps is not None else ()
    except ValueError as exc:
        raise InvarError(f"--capture-steps {capture_steps!r}: {exc}") from None
    patches, patch_dirs = select_patches(patch or [], engine.value, "--patch")
    model = model_folder(model)  # --model FILE.gguf names the folder that holds it
    spec = EngineSpec(engine, model, dtype, quantization, adapter, patches=patches, patch_dirs=patch_dirs,
                      settings=parse_launch_settings(engine.value, setting or []))
    source = score_source(spec, spec_steps, tokens=tokens, from_run=from_run, temperature=temperature,
                          batch_size=batch_size)
    run_dir = run if run is not None else default_run_dir("score")
    # Outputs are kept as the float32 arrays they arrived as: a whole-vocabulary capture of a real model (49,152
    # tokens) is 192 KiB so, and six times that as Python floats. Only --json needs every item.
    kept: list[ScoredOutput] = []

    scored = [0]

    def keep(out: ScoredOutput) -> None:
        scored[0] += 1
        shown.count(scored[0])
        if as_json or len(kept) < _SHOWN:
            kept.append(out)

    with reporting(quiet) as shown:
        done = score_run(spec, source, run_dir, show_steps(spec_steps), call_timeout=call_timeout, on_output=keep,
                         phase=lambda text: shown.phase(text, total=source.total, unit="items")
                         if text == "scoring" else shown.phase(text))
    meta, head, counts = done.meta, done.head, done.counts
    vocab = ModelTokenizer.from_model_dir(model)
    if as_json:
        from invar.cli.outputs import ScoreOutput  # the models cost a start that prints text nothing

        result = {"run": str(run_dir), "chain_head": head, **meta, **counts,
                  "items": [_json_item(out, vocab) for out in kept]}
        emit_model(ScoreOutput.model_validate(result), exclude_unset=True)  # `patches` only with --patch
        return
    captured = "no captures" if not counts["captures"] else \
        f"{counts['captures']} captures of {counts['vocab_size']} tokens"
    typer.echo(f"{engine.value} on {model} ({meta['model_digest'][:12]}…): {counts['items']} items in "
               f"{counts['calls']} score calls, {captured}; records: {run_dir}")
    typer.echo(f"chain head {head} (keep it to check these records later: --expect-head)")
    for out in kept:
        it = out.item
        typer.echo(f"[{it.item_id}] {it.prompt}{vocab.decode(it.tokens, stop_at_eos=False)}   "
                   f"(T={it.temperature:g})")
        typer.echo(f"    logprobs: [{', '.join(f'{x:.6g}' for x in out.logprobs.tolist())}]")
        for step, row in zip(it.steps, out.vocab_logprobs, strict=True):
            top = np.argsort(-row, kind="stable")[:3]
            typer.echo(f"    step {step}: top " + ", ".join(
                f"{vocab.decode([int(i)], stop_at_eos=False)!r} {float(row[int(i)]):.6g}" for i in top))
    if counts["items"] > len(kept):
        typer.echo(f"… {counts['items'] - len(kept)} more items (--json lists them all)")


def _json_item(out: ScoredOutput, vocab: ModelTokenizer) -> dict[str, Any]:
    """One scored item as `--json` lists it; `tolist()` gives each float32 value as the Python float it equals."""
    it = out.item
    return {"item_id": it.item_id, "prompt": it.prompt, "temperature": it.temperature,
            "tokens": [int(t) for t in it.tokens], "text": vocab.decode(it.tokens, stop_at_eos=False),
            "logprobs": out.logprobs.tolist(),
            "captures": [{"step": s, "vocab_logprobs": row.tolist()}
                         for s, row in zip(it.steps, out.vocab_logprobs, strict=True)]}
