"""`invar infer`: one inference call through an engine's worker, with every call and report kept in a run store.

The command parses its options, shows progress and prints what `invar.runner.infer` returns: the call, its records
and the core's decoding of the reported token ids.
"""

from __future__ import annotations

from typing import Annotated

import typer

from invar.cli.common import JsonOpt, QuietOpt, emit_model
from invar.cli.options import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_MODEL,
    AdapterOpt,
    CallTimeoutOpt,
    DtypeOpt,
    EngineOpt,
    MaxTokensOpt,
    ModelOpt,
    PatchOpt,
    QuantOpt,
    RunOpt,
    SettingOpt,
    TemperatureOpt,
    TopPOpt,
    model_folder,
)
from invar.engines import Dtype, Engine, Quantization
from invar.errors import InvarError

# The runner (numpy, msgpack, tokenizers, the output models) is imported when the command runs: its `--help` needs
# none of it (tests/cli/test_lazy_imports.py).


def infer(
    prompts: Annotated[list[str], typer.Argument(help="One or more prompts, sent as one generate call.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the first request; request i uses seed + i.")] = 0,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    max_tokens: MaxTokensOpt = 16,
    engine: EngineOpt = Engine.HF,
    setting: SettingOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DtypeOpt = Dtype.FLOAT32,
    quantization: QuantOpt = Quantization.NONE,
    adapter: AdapterOpt = None,
    patch: PatchOpt = None,
    run: RunOpt = None,
    call_timeout: CallTimeoutOpt = DEFAULT_CALL_TIMEOUT,
    chat: Annotated[bool, typer.Option(
        "--chat", help="Send each prompt as a user message, rendered by the model's chat template (what an "
                       "instruct model answers); without it a prompt is plain text the model continues.")] = False,
    system: Annotated[str | None, typer.Option(
        "--system", help="A system message before each prompt (with --chat).")] = None,
    top_logprobs: Annotated[int, typer.Option(
        "--top-logprobs", help="Also report the K most likely tokens at each response position (engines that "
                               "report them: openai); 0 for none.")] = 0,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Make one inference call: print each response's tokens, text and log-probabilities; keep the records."""
    from invar.cli.progress import reporting
    from invar.patches import select as select_patches
    from invar.runner.engine import EngineSpec, default_run_dir, parse_launch_settings
    from invar.runner.infer import InferSampling, conversations, infer
    from invar.runner.options import check_sampling

    check_sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                   seeds=(seed, seed + len(prompts) - 1), call_timeout=call_timeout)
    if top_logprobs < 0:
        raise InvarError(f"--top-logprobs {top_logprobs}: must be ≥ 0 (0 for none)")
    if system is not None and not chat:
        raise InvarError("--system is a chat message: add --chat (or drop --system)")
    model = model_folder(model)  # --model FILE.gguf names the folder that holds it
    patches, patch_dirs = select_patches(patch or [], engine.value, "--patch")
    spec = EngineSpec(engine, model, dtype, quantization, adapter, patches=patches, patch_dirs=patch_dirs,
                      settings=parse_launch_settings(engine.value, setting or []))
    messages = conversations(prompts, system) if chat else [None] * len(prompts)
    run_dir = run if run is not None else default_run_dir("infer")
    with reporting(quiet) as shown:
        result = infer(spec, prompts, messages, InferSampling(seed, temperature, top_p, max_tokens, top_logprobs),
                       run_dir, call_timeout=call_timeout, phase=shown.phase)
    if as_json:
        emit_model(result, exclude_unset=True)  # `messages` only with --chat
        return
    typer.echo(f"{engine.value} on {model} ({result.model_digest[:12]}…), T={temperature:g}, top-p={top_p:g}; "
               f"records: {run_dir}")
    typer.echo(f"chain head {result.chain_head} (keep it to check these records later: --expect-head)")
    for r in result.outputs:
        if chat:  # the rendered template is not the user's text: show the message, then the answer
            typer.echo(f"[{r.request_id}] user: {r.prompt}")
            typer.echo(f"    answer:   {r.text}   ({r.finish_reason}, seed {r.seed})")
        else:
            typer.echo(f"[{r.request_id}] {r.prompt}{r.text}   ({r.finish_reason}, seed {r.seed})")
        typer.echo(f"    prompt ids: {r.prompt_ids}")  # what the model read: a missing BOS shows here
        typer.echo(f"    tokens:   {r.tokens}")
        typer.echo(f"    logprobs: [{', '.join(f'{x:.6g}' for x in r.logprobs)}]")
        for i, (t, v) in enumerate(zip(r.top_ids or [], r.top_logprobs or [], strict=True)):
            typer.echo(f"    top at {i}: " + ", ".join(f"{a} ({b:.6g})" for a, b in zip(t, v, strict=True)))
