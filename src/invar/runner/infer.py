"""One inference call through an engine's worker, with every call and report kept in a run store: what `invar infer`
runs.

The worker runs on the command's `invar.runner.pool.WorkerPool`, as `evaluate`'s does: at a signal the call under way
gets the pool's grace to answer and be recorded, and a worker still loading its model is stopped at once.

The call speaks only the protocol (`load_model`, `load_adapter`, `generate`), so it runs any engine the same way,
through `invar.runner.engine`. The text of each output is the core's own decoding of the reported token ids
(`ModelTokenizer`, the model's own `tokenizer.json`), never text from the engine. Every prompt is tokenized and
checked against the model's context before a worker starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar.errors import EvidenceError
from invar.protocol.methods import GENERATE
from invar.protocol.payloads import GenerateOutput, GenerateParams, GenerateRequest, GenerateResult
from invar.records import RunStore
from invar.runner.engine import EngineSpec, Lease, engine_session, read_generate
from invar.runner.options import check_context, model_context
from invar.runner.outputs import InferOutput
from invar.runner.pool import WorkerPool
from invar.tasks import ModelTokenizer


@dataclass(frozen=True)
class InferSampling:
    """The sampling of every request of the call; request i uses seed `seed + i`."""

    seed: int
    temperature: float
    top_p: float
    max_tokens: int
    top_logprobs: int = 0
    """The K most likely tokens reported at each response position; 0 for none."""


def conversations(prompts: Sequence[str], system: str | None) -> list[list[dict[str, str]]]:
    """Each prompt as a user message, after the system message if one is given."""
    return [([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": p}]
            for p in prompts]


def infer(spec: EngineSpec, prompts: Sequence[str], messages: Sequence[list[dict[str, str]] | None],
          sampling: InferSampling, run_dir: Path, *, call_timeout: float | None,
          phase: Callable[[str], object] = lambda text: None) -> InferOutput:
    """One generate call of `prompts` (each sent as its chat `messages` where given, rendered by the model's chat
    template) through `spec`'s worker, recorded in a new run store at `run_dir`: the output `invar infer` prints.
    `phase` is told what is under way (starting the worker, loading the model, generating)."""
    meta = spec.meta()  # the digests first: a missing model folder is named as the option that gave it
    vocab = ModelTokenizer.from_model_dir(spec.model)
    context = model_context(spec.model)
    ids = [vocab.prompt_ids(prompt=p) if c is None else vocab.prompt_ids(messages=c)
           for p, c in zip(prompts, messages, strict=True)]
    for i, one in enumerate(ids):
        check_context(len(one), sampling.max_tokens, context, f"prompt {i}")
    s = sampling
    # `top_logprobs` absent unless asked: a request without it stays the bytes it always was
    params = GenerateParams([GenerateRequest(str(i), one, s.seed + i, s.temperature, s.max_tokens, s.top_p, prompt=p,
                                             top_logprobs=s.top_logprobs or None)
                             for i, (p, one) in enumerate(zip(prompts, ids, strict=True))],
                            [list(range(len(prompts)))])
    chat = any(m is not None for m in messages)
    pool = WorkerPool(1)

    def generate(lease: Lease) -> GenerateResult | None:
        session = lease.session
        assert session is not None
        phase("generating")
        answer = pool.ask(lease, GENERATE, GenerateParams(params.requests, params.layout, session.adapter, None))
        return None if answer is None else read_generate(GENERATE.received(answer.result), params,
                                                         session.model_digest)

    with RunStore.create(run_dir, meta={"command": "infer", **meta, **({"chat": True} if chat else {})}) as store:
        received = pool.one(lambda ready: engine_session(spec, store, call_timeout=call_timeout, ready=ready,
                                                         phase=phase, watch=pool.starting),
                            generate, f"the {spec.engine.value} worker", lambda how: f"stopped at {how}", "infer")
        assert received is not None  # the pool halts only by a failure or a signal, and both raise
        rows = [{"request_id": req.request_id, "prompt": req.prompt, "seed": req.seed,
                 **({} if conversation is None else {"messages": conversation}),
                 "prompt_ids": [int(t) for t in req.prompt_ids],
                 "tokens": [int(t) for t in out.tokens], "text": vocab.decode(out.tokens),
                 "logprobs": [float(x) for x in out.logprobs], "finish_reason": out.finish_reason,
                 **(_top(out, req) if s.top_logprobs else {})}
                for req, out, conversation in zip(params.requests, received.outputs, messages, strict=True)]
        head = store.close_run()
    # Validated from the dict, so the fields left out stay unset: `messages` only for chat, `patches` only with them
    return InferOutput.model_validate({"run": str(run_dir), "chain_head": head, **meta, "temperature": s.temperature,
                                       "top_p": s.top_p, "outputs": rows})


def _top(out: GenerateOutput, req: GenerateRequest) -> dict[str, Any]:
    """The output's top-k ids and log-probabilities as lists; an engine that returned other shapes is refused."""
    ids, values = out.top_ids, out.top_logprobs
    want = (int(out.tokens.size), int(req.top_logprobs or 0))
    if ids is None or values is None or not ids.shape == values.shape == want:
        raise EvidenceError(f"generate output for request {req.request_id!r}: no top-k log-probabilities of shape "
                            f"{want} although they were asked")
    return {"top_ids": ids.astype(int).tolist(), "top_logprobs": values.astype(float).tolist()}
