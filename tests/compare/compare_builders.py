"""Runs written through the record store exactly as `invar evaluate` and `invar score` write them, with chosen
numbers: real records, no engine, so a comparison's every figure is known in advance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import log_softmax

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.protocol.messages import Call, Report
from invar.records import RunStore
from invar.tasks import ModelTokenizer

VOCAB = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
MODEL_DIGEST = canonical.tree_digest(DEFAULT_MODEL)
IDENTITY: dict[str, Any] = {"engine": "hf", "engine_version": {"torch": "2.13.0+cpu"}, "role": "inference",
                            "settings": {"device": "cpu", "threads": 1}, "methods": ["generate", "load_model", "score"],
                            "pid": 4242}


def tokens_of(text: str) -> np.ndarray:
    """A response: the characters' ids, then end-of-sequence."""
    return np.array([*VOCAB.encode(text), VOCAB.eos_token_id], dtype=np.int32)


def capture(seed: int, rows: int) -> np.ndarray:
    """float32[rows, V] log-softmax of seeded logits."""
    rng = np.random.default_rng(seed)
    return log_softmax(rng.normal(0, 4, (rows, VOCAB.size)), axis=1).astype(np.float32)


@dataclass
class Unit:
    """One request and the response a package gave it."""

    unit_id: str
    prompt: str
    text: str
    seed: int
    logprobs: np.ndarray | None = None
    temperature: float = 1.0

    @property
    def tokens(self) -> np.ndarray:
        return tokens_of(self.text)

    def lp(self) -> np.ndarray:
        if self.logprobs is not None:
            return self.logprobs
        rng = np.random.default_rng(self.seed)
        return (-rng.random(len(self.tokens))).astype(np.float32)


class _Writer:
    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.store = RunStore.create(path, meta=dict(meta))
        self.worker = self.store.record_worker(IDENTITY)
        self.next_id = 1
        self.call("load_model", {"model_dir": str(DEFAULT_MODEL), "model_digest": MODEL_DIGEST, "dtype": "float32",
                                 "quantization": "none", "adapter": None},
                  {"model_digest": MODEL_DIGEST, "adapter_digest": None, "vocab_size": VOCAB.size,
                   "eos_token_id": VOCAB.eos_token_id, "max_model_len": 128})

    def call(self, method: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        digest = self.store.record_call(canonical.encode(Call(self.next_id, method, params).to_wire()),
                                        worker=self.worker)
        report = Report(self.next_id, digest, self.worker, result=result)
        self.store.record_report(canonical.encode(report.to_wire()), worker=self.worker)
        self.next_id += 1

    def close(self) -> None:
        self.store.close_run()
        self.store.close()


def _meta(command: str, **extra: Any) -> dict[str, Any]:
    return {"command": command, "engine": "hf", "model": str(DEFAULT_MODEL), "model_digest": MODEL_DIGEST,
            "dtype": "float32", "quantization": "none", "adapter": None, "adapter_digest": None, **extra}


def generate_run(path: Path, units: Sequence[Unit], batch: int = 4) -> Path:
    """An evaluate run: one generate call per `batch` units, one batch each."""
    w = _Writer(path, _meta("evaluate"))
    for start in range(0, len(units), batch):
        part = units[start : start + batch]
        requests = [{"request_id": u.unit_id, "prompt": u.prompt, "prompt_ids": VOCAB.prompt_ids(prompt=u.prompt),
                     "seed": u.seed, "temperature": u.temperature, "top_p": 1.0, "max_tokens": 5} for u in part]
        outputs = [{"request_id": u.unit_id, "prompt_tokens": np.array(VOCAB.prompt_ids(prompt=u.prompt), np.int32),
                    "tokens": u.tokens, "logprobs": u.lp(), "finish_reason": "stop"} for u in part]
        w.call("generate", {"requests": requests, "layout": [list(range(len(part)))], "adapter": None,
                            "reference_adapter": None},
               {"outputs": outputs, "model_digest": MODEL_DIGEST, "adapter_digest": None})
    w.close()
    return path


@dataclass
class Scored:
    """One scored item: the reference unit it scores, its log-probabilities, its captures."""

    unit: Unit
    logprobs: np.ndarray
    steps: list[int] = field(default_factory=list)
    vocab: np.ndarray | None = None


def score_run(path: Path, items: Sequence[Scored], source: Path, batch: int = 4) -> Path:
    """A score run of `items` (each the reference's response), `batch` items per call."""
    w = _Writer(path, _meta("score", capture_steps="", source={"run": str(source), "head": "", "command": "evaluate"}))
    for start in range(0, len(items), batch):
        part = items[start : start + batch]
        params = [{"item_id": s.unit.unit_id, "prompt": s.unit.prompt,
                   "prompt_ids": VOCAB.prompt_ids(prompt=s.unit.prompt), "response_tokens": s.unit.tokens,
                   "temperature": s.unit.temperature, "vocab_steps": list(s.steps)} for s in part]
        outputs = [{"item_id": s.unit.unit_id, "logprobs": s.logprobs,
                    "vocab_logprobs": s.vocab if s.vocab is not None else np.zeros((0, VOCAB.size), np.float32)}
                   for s in part]
        w.call("score", {"items": params, "adapter": None},
               {"outputs": outputs, "model_digest": MODEL_DIGEST, "adapter_digest": None})
    w.close()
    return path


def units(count: int, texts: Mapping[int, str] | None = None) -> list[Unit]:
    """`count` arithmetic units with correct answers, except those whose index `texts` gives a response for."""
    from invar.tasks.arithmetic import population

    out = []
    for i, p in enumerate(population("eval", seed=5, count=count, id_prefix="u")):
        out.append(Unit(p.id, p.prompt, (texts or {}).get(i, p.answer), seed=1000 + i))
    return out
