"""Tasks: what a model is asked, and how the core scores its responses from their tokens.

Scorers are looked up by the name a contract gives them in `SCORERS`; a scorer maps (prompt, response text) to a
task loss of 0 or 1. The core decodes response tokens itself with `Vocabulary`, so no worker's text is trusted.
"""

from invar.tasks.arithmetic import (
    KINDS,
    MAX_ANSWER_CHARS,
    SCORER_NAME,
    SCORERS,
    Problem,
    answer_of,
    draw,
    load_population,
    population,
    population_bytes,
    score,
    split_of,
    stream,
)
from invar.tasks.tokenizer import ModelTokenizer
from invar.tasks.vocabulary import Vocabulary

__all__ = [
    "KINDS",
    "MAX_ANSWER_CHARS",
    "SCORERS",
    "SCORER_NAME",
    "ModelTokenizer",
    "Problem",
    "Vocabulary",
    "answer_of",
    "draw",
    "load_population",
    "population",
    "population_bytes",
    "score",
    "split_of",
    "stream",
]
