"""The base of every model a command prints with `--json`.

Decision: the core returns the models the CLI prints (one spelling per output), so their base lives below every
package that defines one; the CLI-only models and the schema table stay in `invar.cli.outputs`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Closed(BaseModel):
    """An output object whose fields are all named: another field is an error."""

    # Built on first use, without the fields' docstrings: a command builds the one model it prints, and the
    # docstrings are the schemas' descriptions alone (`invar.cli.outputs.documented`). pydantic's
    # use_attribute_docstrings would read the source of every class at each command's start.
    model_config = ConfigDict(extra="forbid", defer_build=True)


__all__ = ["Closed"]
