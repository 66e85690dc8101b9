"""Tasks: what a model is asked, and how the core scores its responses from their tokens.

`ModelTokenizer` (the model's own `tokenizer.json`, run by the `tokenizers` library, and its chat template: both
in `invar.formats`, which the workers read too) turns a unit into the token ids every engine is sent, and decodes
the ids an engine returns: no worker's text is trusted. `population` reads the one population format; `scorers`
turns a unit and a response text into a task loss; `arithmetic` is the shipped task (its `population` generator is
not re-exported here: the name is the submodule's, and importing `invar.tasks.population` would rebind it).
"""

from invar.formats.tokenizer import ModelTokenizer
from invar.tasks.arithmetic import (
    KINDS,
    MAX_ANSWER_CHARS,
    SCORER_NAME,
    SCORERS,
    Problem,
    answer_of,
    draw,
    load_population,
    population_bytes,
    score,
    split_of,
    stream,
)

__all__ = [
    "KINDS",
    "MAX_ANSWER_CHARS",
    "SCORERS",
    "SCORER_NAME",
    "ModelTokenizer",
    "Problem",
    "answer_of",
    "draw",
    "load_population",
    "population_bytes",
    "score",
    "split_of",
    "stream",
]
