"""A handler that answers with score results cannot be registered as `generate`."""

from invar.protocol.results import Params, ScoreResult, method
from invar.protocol.server import Method


def score(params: Params) -> ScoreResult:
    return {"outputs": []}


ENTRY: tuple[str, Method] = method("generate", score)  # reject: No overload variant of "method" matches argument types "str", "Callable[[dict[str, Any]], ScoreResult]"
