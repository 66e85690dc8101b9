"""A worker's method table: each handler registered under the method whose result it returns."""

from invar.protocol.results import GenerateResult, LoadModelResult, Params, ScoreResult, method
from invar.protocol.server import Method


def generate(params: Params) -> GenerateResult:
    return {"outputs": []}


def score(params: Params) -> ScoreResult:
    return {"outputs": [{"item_id": "0", "logprobs": [], "vocab_logprobs": []}]}


def load_model(params: Params) -> LoadModelResult:
    return {"model_digest": "0" * 64}


METHODS: dict[str, Method] = dict([method("generate", generate), method("score", score),
                                   method("load_model", load_model)])
