"""Exit statuses are keyed by the Answer enum, not by its text."""

from invar.contract.decide import EXIT_CODES


def status(answer: str) -> int:
    return EXIT_CODES[answer]  # reject: Invalid index type "str" for "Mapping[Answer, int]"; expected type "Answer"
