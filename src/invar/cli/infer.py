"""`invar infer`: one inference call through an engine's worker, with every call and report kept in a run store.

The command speaks only the protocol (`load_model`, `load_adapter`, `generate`), so it runs any engine the same
way, through `invar.runner.engine`. The text it prints is the core's own decoding of the reported token ids
(`ModelTokenizer`, the model's own `tokenizer.json`), never text from the engine.
"""

from __future__ import annotations

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
    TemperatureOpt,
    TopPOpt,
    model_folder,
)
from invar.engines import Dtype, Engine, Quantization
from invar.errors import EvidenceError, InvarError

# The protocol's payloads, the run store, the runner and the tokenizer (numpy, msgpack, tokenizers) are imported
# when the command runs: its `--help` needs none of them (tests/cli/test_lazy_imports.py).
if TYPE_CHECKING:
    from invar.protocol.payloads import GenerateOutput, GenerateRequest


def infer(
    prompts: Annotated[list[str], typer.Argument(help="One or more prompts, sent as one generate call.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the first request; request i uses seed + i.")] = 0,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most response tokens per request.")] = 16,
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
    from invar.protocol.methods import GENERATE
    from invar.protocol.payloads import GenerateParams, GenerateRequest
    from invar.records import RunStore
    from invar.runner.engine import EngineSpec, default_run_dir, engine_session, parse_launch_settings, read_generate
    from invar.runner.options import check_context, check_sampling, model_context
    from invar.tasks import ModelTokenizer

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
    meta = spec.meta()
    vocab = ModelTokenizer.from_model_dir(model)
    context = model_context(model)
    conversations: list[list[dict[str, str]] | None] = [
        ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": p}]
        if chat else None for p in prompts]
    ids = [vocab.prompt_ids(prompt=p) if c is None else vocab.prompt_ids(messages=c)
           for p, c in zip(prompts, conversations, strict=True)]
    for i, one in enumerate(ids):
        check_context(len(one), max_tokens, context, f"prompt {i}")
    run_dir = run if run is not None else default_run_dir("infer")
    # `top_logprobs` absent unless asked: a request without it stays the bytes it always was
    params = GenerateParams([GenerateRequest(str(i), one, seed + i, temperature, max_tokens, top_p, prompt=p,
                                             top_logprobs=top_logprobs or None)
                             for i, (p, one) in enumerate(zip(prompts, ids, strict=True))],
                            [list(range(len(prompts)))])
    with RunStore.create(run_dir, meta={"command": "infer", **meta, **({"chat": True} if chat else {})}) as store:
        with reporting(quiet) as shown, engine_session(spec, store, call_timeout=call_timeout,
                                                       phase=shown.phase) as session:
            shown.phase("generating")
            report = session.client.call(GENERATE, GenerateParams(params.requests, params.layout, session.adapter,
                                                                  None))
            received = read_generate(report, params, session.model_digest)
        rows: list[dict[str, Any]] = []
        for req, out, messages in zip(params.requests, received.outputs, conversations, strict=True):
            rows.append({
                "request_id": req.request_id, "prompt": req.prompt, "seed": req.seed,
                **({} if messages is None else {"messages": messages}),
                "prompt_ids": [int(t) for t in req.prompt_ids],
                "tokens": [int(t) for t in out.tokens], "text": vocab.decode(out.tokens),
                "logprobs": [float(x) for x in out.logprobs], "finish_reason": out.finish_reason,
                **(_top(out, req) if top_logprobs else {}),
            })
        head = store.close_run()
    result = {"run": str(run_dir), "chain_head": head, **meta, "temperature": temperature, "top_p": top_p,
              "outputs": rows}
    if as_json:
        from invar.outputs import InferOutput  # the models cost a start that prints text nothing

        emit_model(InferOutput.model_validate(result), exclude_unset=True)  # `messages` only with --chat
        return
    typer.echo(f"{engine.value} on {model} ({meta['model_digest'][:12]}…), T={temperature:g}, top-p={top_p:g}; "
               f"records: {run_dir}")
    typer.echo(f"chain head {head} (keep it to check these records later: --expect-head)")
    for r in rows:
        if chat:  # the rendered template is not the user's text: show the message, then the answer
            typer.echo(f"[{r['request_id']}] user: {r['prompt']}")
            typer.echo(f"    answer:   {r['text']}   ({r['finish_reason']}, seed {r['seed']})")
        else:
            typer.echo(f"[{r['request_id']}] {r['prompt']}{r['text']}   ({r['finish_reason']}, seed {r['seed']})")
        typer.echo(f"    prompt ids: {r['prompt_ids']}")  # what the model read: a missing BOS shows here
        typer.echo(f"    tokens:   {r['tokens']}")
        typer.echo(f"    logprobs: [{', '.join(f'{x:.6g}' for x in r['logprobs'])}]")
        for i, (t, v) in enumerate(zip(r.get("top_ids", []), r.get("top_logprobs", []), strict=True)):
            typer.echo(f"    top at {i}: " + ", ".join(f"{a} ({b:.6g})" for a, b in zip(t, v, strict=True)))


def _top(out: GenerateOutput, req: GenerateRequest) -> dict[str, Any]:
    """The output's top-k ids and log-probabilities as lists; an engine that returned other shapes is refused."""
    ids, values = out.top_ids, out.top_logprobs
    want = (int(out.tokens.size), int(req.top_logprobs or 0))
    if ids is None or values is None or not ids.shape == values.shape == want:
        raise EvidenceError(f"generate output for request {req.request_id!r}: no top-k log-probabilities of shape "
                            f"{want} although they were asked")
    return {"top_ids": ids.astype(int).tolist(), "top_logprobs": values.astype(float).tolist()}
