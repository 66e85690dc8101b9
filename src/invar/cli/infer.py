"""`invar infer`: one inference call through an engine's worker, with every call and report kept in a run store.

The command speaks only the protocol (`load_model`, `load_adapter`, `generate`), so it runs any engine the same
way. It names the model and the adapter by the tree digests the core computes itself, and the worker must report
the model digest back. The text it prints is the core's own decoding of the reported token ids (`Vocabulary`
read from the model's `tokenizer.json`), never text from the engine. `invar evaluate` starts its worker the same
way (`engine_session`).
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from invar import canonical
from invar.cli.common import JsonOpt, emit_json
from invar.engines import DEFAULT_MODEL, start_worker
from invar.errors import EvidenceError, InvarError
from invar.protocol import Role, WorkerClient
from invar.records import RunStore
from invar.tasks import Vocabulary


class Engine(enum.StrEnum):
    """The engines a command can run."""

    HF = "hf"
    VLLM = "vllm"
    MLX = "mlx"


class Dtype(enum.StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class Quantization(enum.StrEnum):
    NONE = "none"
    NF4 = "nf4"


TemperatureOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature (0: greedy).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
EngineOpt = Annotated[Engine, typer.Option("--engine", help="The engine whose worker runs the model.")]
ModelOpt = Annotated[Path, typer.Option("--model", help="The model folder (named by its tree digest).")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="The dtype the engine computes in.")]
QuantOpt = Annotated[
    Quantization, typer.Option("--quantization", help="Weight quantization, where the engine has it (nf4: hf).")
]
AdapterOpt = Annotated[Path | None, typer.Option("--adapter", help="A LoRA adapter folder to sample from.")]
RunOpt = Annotated[
    Path | None, typer.Option("--run", help="Run directory for the records; default: a fresh runs/<command>-<time>.")
]

ADAPTER_NAME = "policy"
"""The name under which the commands load `--adapter` into the worker."""


@dataclass(frozen=True)
class EngineSpec:
    """What a command asks the engine to load; the digests are the core's own."""

    engine: Engine
    model: Path
    dtype: Dtype
    quantization: Quantization
    adapter: Path | None

    @functools.cached_property
    def digests(self) -> tuple[str, str | None]:
        """Tree digests of the model and adapter folders (computed once); `InvarError` naming a missing folder."""
        for what, path in (("--model", self.model), ("--adapter", self.adapter)):
            if path is not None and not path.is_dir():
                raise InvarError(f"{what} {path}: no such folder; pass the folder that holds the "
                                 f"{'model' if what == '--model' else 'LoRA adapter'}")
        model = canonical.tree_digest(str(self.model))
        adapter = None if self.adapter is None else canonical.tree_digest(str(self.adapter))
        return model, adapter

    def meta(self) -> dict[str, Any]:
        model, adapter = self.digests
        return {"engine": self.engine.value, "model": str(self.model), "model_digest": model,
                "dtype": self.dtype.value, "quantization": self.quantization.value,
                "adapter": None if self.adapter is None else str(self.adapter), "adapter_digest": adapter}


def default_run_dir(command: str) -> Path:
    """A fresh run directory under ./runs, named by the command and the local time to the microsecond."""
    return Path("runs") / f"{command}-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}"


@dataclass(frozen=True)
class Session:
    """A started worker with the model (and adapter) loaded as the core asked."""

    client: WorkerClient
    adapter: str | None
    """The adapter name to pass in calls (None: the model as loaded)."""
    model_digest: str
    adapter_digest: str | None
    eos_token_id: int


@contextlib.contextmanager
def engine_session(spec: EngineSpec, store: RunStore) -> Iterator[Session]:
    """Start the engine's inference worker (recording into `store`), load the model and adapter, stop it after."""
    model_digest, adapter_digest = spec.digests
    client = start_worker(spec.engine.value, Role.INFERENCE, recorder=store)
    try:
        loaded = client.call("load_model", {
            "model_dir": str(spec.model.resolve()), "model_digest": model_digest, "dtype": spec.dtype.value,
            "quantization": spec.quantization.value, "adapter": None,
        })
        if loaded.get("model_digest") != model_digest:
            raise EvidenceError(f"the {spec.engine.value} worker reports model digest "
                                f"{str(loaded.get('model_digest'))[:16]}…, not {model_digest[:16]}…: it loaded "
                                "other files than the core named")
        name = None
        if spec.adapter is not None:
            got = client.call("load_adapter", {"name": ADAPTER_NAME, "path": str(spec.adapter.resolve()),
                                               "digest": adapter_digest})
            if got.get("adapter_digest") != adapter_digest:
                raise EvidenceError(f"the {spec.engine.value} worker reports adapter digest "
                                    f"{str(got.get('adapter_digest'))[:16]}…, not {adapter_digest}")
            name = ADAPTER_NAME
        yield Session(client, name, model_digest, adapter_digest, int(loaded["eos_token_id"]))
    finally:
        client.close()


def check_output(output: dict[str, Any], request_id: str, model_digest: str, report: dict[str, Any]) -> None:
    """A generate output must answer the request it is listed for, from the model the core named."""
    if report.get("model_digest") != model_digest:
        raise EvidenceError(f"generate reports model digest {str(report.get('model_digest'))[:16]}…, not "
                            f"{model_digest[:16]}…")
    if output.get("request_id") != request_id:
        raise EvidenceError(f"generate output for request {request_id!r} is labelled "
                            f"{output.get('request_id')!r}: outputs must come back in request order")
    tokens, logprobs = output.get("tokens"), output.get("logprobs")
    if not isinstance(tokens, np.ndarray) or not isinstance(logprobs, np.ndarray) or tokens.shape != logprobs.shape:
        raise EvidenceError(f"generate output for request {request_id!r} lacks tokens and logprobs of one length")


def infer(
    prompts: Annotated[list[str], typer.Argument(help="One or more prompts, sent as one generate call.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the first request; request i uses seed + i.")] = 0,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most response tokens per request.")] = 16,
    engine: EngineOpt = Engine.HF,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DtypeOpt = Dtype.FLOAT32,
    quantization: QuantOpt = Quantization.NONE,
    adapter: AdapterOpt = None,
    run: RunOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make one inference call: print each response's tokens, text and log-probabilities; keep the records."""
    spec = EngineSpec(engine, model, dtype, quantization, adapter)
    meta = spec.meta()
    vocab = Vocabulary.from_model_dir(model)
    run_dir = run if run is not None else default_run_dir("infer")
    requests: list[dict[str, Any]] = [
        {"request_id": str(i), "prompt": p, "seed": seed + i, "temperature": temperature, "top_p": top_p,
         "max_tokens": max_tokens}
        for i, p in enumerate(prompts)
    ]
    with RunStore.create(run_dir, meta={"command": "infer", **meta}) as store, \
            engine_session(spec, store) as session:
        report = session.client.call("generate", {"requests": requests, "layout": [list(range(len(requests)))],
                                                  "adapter": session.adapter, "reference_adapter": None})
        outputs = report.get("outputs")
        if not isinstance(outputs, list) or len(outputs) != len(requests):
            raise EvidenceError(f"generate returned {len(outputs) if isinstance(outputs, list) else 'no'} outputs "
                                f"for {len(requests)} requests")
        rows = []
        for req, out in zip(requests, outputs, strict=True):
            check_output(out, req["request_id"], session.model_digest, report)
            rows.append({
                "request_id": req["request_id"], "prompt": req["prompt"], "seed": req["seed"],
                "tokens": [int(t) for t in out["tokens"]], "text": vocab.decode(out["tokens"]),
                "logprobs": [float(x) for x in out["logprobs"]], "finish_reason": out.get("finish_reason"),
            })
    result = {"run": str(run_dir), **meta, "temperature": temperature, "top_p": top_p, "outputs": rows}
    if as_json:
        emit_json(result)
        return
    typer.echo(f"{engine.value} on {model} ({meta['model_digest'][:12]}…), T={temperature:g}, top-p={top_p:g}; "
               f"records: {run_dir}")
    for r in rows:
        typer.echo(f"[{r['request_id']}] {r['prompt']}{r['text']}   ({r['finish_reason']}, seed {r['seed']})")
        typer.echo(f"    tokens:   {r['tokens']}")
        typer.echo(f"    logprobs: [{', '.join(f'{x:.6g}' for x in r['logprobs'])}]")
