"""An answer maps to its exit status; an agent reads the typed --json output of `use admit`."""

from invar.cli.outputs import UseAdmitOutput
from invar.contract.decide import EXIT_CODES, Answer


def status(answer: Answer) -> int:
    return EXIT_CODES[answer]


def from_output(text: str) -> int:
    out = UseAdmitOutput.model_validate_json(text)
    return EXIT_CODES[Answer(out.answer)] if out.exit_code in (0, 10, 11) else 2
