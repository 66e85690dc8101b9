"""The example's own scorer: loss 0 when the first number in the response is the unit's answer, else 1.

Invar calls it as `loss(unit, response, params)`: `unit` has `.id`, `.prompt` or `.messages`, `.answer`; `response`
is the core's decoding of the tokens the engine returned; `params` are the declaration's `params` (none here).
"""

import re

NUMBER = re.compile(r"-?[0-9]+")


def loss(unit, response, params):
    found = NUMBER.search(response)
    return 0 if found is not None and found.group() == str(unit.answer) else 1
