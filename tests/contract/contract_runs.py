"""Builders for contract tests: a tiny model folder, a population, a declaration, and runs written through the
record store exactly as a worker's calls and reports would be (no mocks: the records are real records)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from support.char_model import write_char_model

from invar import canonical
from invar.contract.declaration_toml import toml_document
from invar.contract.inputs import run_inputs
from invar.contract.model import Contract
from invar.contract.plan import ExecutionPlan, PlannedCall
from invar.contract.prepare import prepare
from invar.engines import ENGINES, worker_digest
from invar.protocol.messages import Call, Report
from invar.records import RunStore
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import answer_of, population, population_bytes

# The code that answers, as an hf worker started here reports it: `use prepare` pins this digest in the contract.
HF_WORKER = {"module": ENGINES["hf"], "sha256": "0" * 64, "digest": worker_digest("hf")}

SPECIALS = ("<pad>", "<s>", "</s>")
CHARS = "0123456789+-*="

REFERENCE_IDENTITY: dict[str, Any] = {
    "engine": "hf",
    "engine_version": {"torch": "2.13.0+cpu", "transformers": "5.19.0"},
    "role": "inference",
    "settings": {"device": "cpu", "threads": 1},
    "methods": ["generate", "load_model", "score"],
    "pid": 101,
    "worker": HF_WORKER,
}
CANDIDATE_IDENTITY: dict[str, Any] = {
    "engine": "hf",
    "engine_version": {"bitsandbytes": "0.50.2", "torch": "2.13.0+cpu", "transformers": "5.19.0"},
    "role": "inference",
    "settings": {"device": "cpu", "threads": 1, "patches": {"fixed-softmax": "c" * 64}},
    "methods": ["generate", "load_model", "score"],
    "pid": 202,
    "worker": HF_WORKER,
}


def make_model(folder: Path) -> str:
    """A model folder holding a character-level tokenizer (all the core reads); returns its tree digest."""
    return write_char_model(folder, SPECIALS, CHARS)


def toml_text(data: Mapping[str, Any]) -> str:
    """A TOML document for `data` (the core's writer: top-level scalars, tables of inline values, arrays of tables)."""
    return toml_document(data)


def declaration(pop_sha: str, model_digest: str, **changes: Any) -> dict[str, Any]:
    """A valid population-standard declaration over `population.jsonl` and the model in `model/`."""
    decl: dict[str, Any] = {
        "name": "arith-test",
        "description": "test contract",
        "population": {"path": "population.jsonl", "sha256": pop_sha},
        "scorer": {"name": "arithmetic-exact"},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 5},
        "requirement": {"standard": "population", "epsilon": 0.05, "confidence": 0.95, "method": "maurer-pontil"},
        "pairing": {"seed": 20240601, "layout": "solo"},
        "layouts": {"solo": {"batch_size": 1}, "b4r": {"batch_size": 4, "order": "reverse"}},
        "invariance": {"required": True, "layouts": ["solo", "b4r"]},
        "reference": {
            "engine": "hf", "engine_version": REFERENCE_IDENTITY["engine_version"],
            "settings": {"device": "cpu", "threads": 1},
            "model_dir": "model", "model_digest": model_digest, "dtype": "float32", "quantization": "none",
        },
        "candidate": {
            "engine": "hf", "engine_version": CANDIDATE_IDENTITY["engine_version"],
            "settings": {"device": "cpu", "threads": 1}, "patches": {"fixed-softmax": "c" * 64},
            "model_dir": "model", "model_digest": model_digest, "dtype": "float32", "quantization": "nf4",
        },
        # One call per package and layout, so tests can name calls by layout; test_plan covers calls cut smaller.
        "execution": {"requests_per_call": 1 << 20},
        "premises": [{
            "statement": "The population represents the prompts the loop will see.",
            "party": "data-team", "basis_sha256": "d" * 64, "reliance": "vouched",
        }],
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(decl.get(key), dict) and key != "layouts":
            merged = {**decl[key], **value}
            decl[key] = {k: v for k, v in merged.items() if v is not None}
        else:
            decl[key] = value
    return decl


@dataclass
class Workspace:
    """A folder holding a model, a population, a declaration and the contract prepared from it."""

    root: Path
    contract_path: Path
    contract: Contract
    sha256: str
    plan: ExecutionPlan
    vocab: ModelTokenizer


def make_workspace(root: Path, units: int = 200, **changes: Any) -> Workspace:
    """Prepare a contract over `units` evaluation problems; `changes` update sections of the declaration."""
    root.mkdir(parents=True, exist_ok=True)
    model_digest = make_model(root / "model")
    data = population_bytes(population("eval", seed=11, count=units, id_prefix="u"))
    (root / "population.jsonl").write_bytes(data)
    decl = declaration(canonical.sha256(data), model_digest, **changes)
    (root / "decl.toml").write_text(toml_text(decl), encoding="utf-8")
    prepared = prepare(root / "decl.toml")
    return Workspace(root, prepared.path, prepared.contract, prepared.sha256, prepared.plan,
                     ModelTokenizer.from_model_dir(root / "model"))


def response_text(prompt: str, wrong: bool) -> str:
    """The correct answer to `prompt`, or a wrong one."""
    answer = answer_of(prompt)
    return str(answer + 1 if wrong else answer)


class RunWriter:
    """Writes a run through the record store: workers, their model loads, and generate calls with reports."""

    def __init__(self, ws: Workspace, run_dir: Path, contract_sha256: str | None = None, *,
                 keep_inputs: bool = False) -> None:
        self.ws = ws
        self.path = run_dir
        self.store = RunStore.create(run_dir, meta={"contract_sha256": contract_sha256 or ws.sha256})
        if keep_inputs:
            self.store.put_meta("inputs", run_inputs(ws.contract, ws.contract_path.parent))
        self._next_id: dict[str, int] = {}

    def _call(self, worker: str, method: str, params: dict[str, Any], result: dict[str, Any] | None) -> int:
        call_id = self._next_id.get(worker, 1)
        self._next_id[worker] = call_id + 1
        digest = self.store.record_call(canonical.encode(Call(call_id, method, params).to_wire()), worker=worker)
        if result is not None:
            report = Report(call_id, digest, worker, result=result)
            self.store.record_report(canonical.encode(report.to_wire()), worker=worker)
        return call_id

    def worker(self, role: str, identity: Mapping[str, Any] | None = None, **load_changes: Any) -> str:
        """Record a worker for `role` and its load_model call (with `load_changes` applied to the params)."""
        ident = dict(identity or (REFERENCE_IDENTITY if role == "reference" else CANDIDATE_IDENTITY))
        key = self.store.record_worker(ident)
        params = {**self.ws.plan.load_params[role], **load_changes}  # type: ignore[index]
        adapter = params["adapter"]
        result = {"model_digest": params["model_digest"],
                  "adapter_digest": None if adapter is None else adapter["digest"],
                  "vocab_size": self.ws.vocab.size, "eos_token_id": self.ws.vocab.eos_token_id, "max_model_len": 128}
        self._call(key, "load_model", params, result)
        return key

    def outputs(self, planned: PlannedCall, wrong: Iterable[str]) -> list[dict[str, Any]]:
        """Outputs for every request of `planned`: a correct answer, or a wrong one for units in `wrong`."""
        bad = set(wrong)
        out = []
        for req in planned.params.to_wire()["requests"]:
            text = response_text(req["prompt"], req["request_id"] in bad)
            tokens = np.array([*self.ws.vocab.encode(text), self.ws.vocab.eos_token_id], dtype=np.int32)
            rng = np.random.default_rng(req["seed"])
            logprobs = -rng.random(len(tokens)).astype(np.float32)
            out.append({"request_id": req["request_id"], "prompt_tokens": np.array(req["prompt_ids"], copy=True),
                "tokens": tokens, "logprobs": logprobs,
                "finish_reason": "stop"})
        return out

    def generate(
        self,
        worker: str,
        planned: PlannedCall,
        wrong: Iterable[str] = (),
        edit_params: Callable[[dict[str, Any]], None] | None = None,
        edit_outputs: Callable[[list[dict[str, Any]]], None] | None = None,
        answered: bool = True,
        result_changes: Mapping[str, Any] | None = None,
    ) -> int:
        """Record one generate call and its report; returns the call id."""
        params = planned.params.to_wire()  # a fresh map the edit may change
        if edit_params is not None:
            edit_params(params)
        outputs = self.outputs(planned, wrong)
        if edit_outputs is not None:
            edit_outputs(outputs)
        role = planned.package
        package = self.ws.contract.package(role)
        # A patched package's worker reports how often each patch ran in the call (docs/protocol.md).
        patch_calls = {"patch_calls": {name: len(outputs) for name in package.patches}} if package.patches else {}
        result = {"outputs": outputs, "model_digest": package.model_digest, "adapter_digest": None,
                  **patch_calls, **(result_changes or {})}
        return self._call(worker, "generate", params, result if answered else None)

    def complete(self, reference_wrong: Iterable[str] = (), candidate_wrong: Iterable[str] = ()) -> RunWriter:
        """Write the whole plan: one worker per package, every planned call once."""
        ref = self.worker("reference")
        cand = self.worker("candidate")
        for planned in self.ws.plan.calls:
            wrong = reference_wrong if planned.package == "reference" else candidate_wrong
            self.generate(ref if planned.package == "reference" else cand, planned, wrong)
        return self

    def close(self, *, closed: bool = True) -> Path:
        """Close the store; with `closed` (as every finished run is) append the closing record first."""
        if closed:
            self.store.close_run()
        self.store.close()
        return self.path


def unit_ids(ws: Workspace, count: int, start: int = 0) -> list[str]:
    """The ids of `count` planned units from position `start`."""
    return [u.unit_id for u in ws.plan.units[start : start + count]]


def tamper_body(run_dir: Path, seq: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite record `seq`'s body behind the store's back (dropping its append-only trigger first)."""
    conn = sqlite3.connect(run_dir / "records.sqlite")
    body = conn.execute("SELECT body FROM log WHERE seq = ?", (seq,)).fetchone()[0]
    message = canonical.decode(body)
    change(message)
    conn.execute("DROP TRIGGER log_no_update")
    conn.execute("UPDATE log SET body = ? WHERE seq = ?", (canonical.encode(message), seq))
    conn.commit()
    conn.close()
