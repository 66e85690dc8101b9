"""Numerical comparison: where and how far a candidate's numbers part from the reference's, from the records alone.

`metrics` holds the pure per-sequence and per-capture measurements and llama.cpp-style aggregates; `numerical`
compares many units, streaming the captures; `runs` reads what it needs from run stores; `report` draws it.
"""
