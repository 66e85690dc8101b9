"""Option aliases shared by the commands that run an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invar.engines import DEFAULT_MODEL, ENGINE_TABLE, Dtype, Engine, Quantization
from invar.errors import InvarError

TemperatureOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature, in [0, 10] (0: greedy).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
EngineOpt = Annotated[Engine, typer.Option("--engine", help="The engine whose worker runs the model.")]


def _setting_help() -> str:
    """--setting's help, from the engine table, so an engine's required settings are named where they are defined."""
    required = [f"for --engine {e.name}: " + " and ".join(f"{n}=…" for n, s in e.settings.items() if s.required)
                for e in ENGINE_TABLE.values() if any(s.required for s in e.settings.values())]
    return ("A launch setting of the engine's worker, NAME=VALUE (e.g. threads=1" + "".join(f"; {r}" for r in required)
            + "), checked before it starts (repeatable); `invar use package ENGINE` prints an engine's settings.")


SettingOpt = Annotated[list[str] | None, typer.Option("--setting", help=_setting_help())]


def model_folder(model: Path) -> Path:
    """`--model FILE.gguf` names the GGUF model folder that holds the file: the model is that folder, pinned by its
    tree digest (docs/gguf.md); a file elsewhere is refused in one line saying what the folder needs."""
    if model.suffix.lower() != ".gguf" or not model.is_file():
        return model
    folder = model.parent
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    missing = [name for name in ("tokenizer.json", "tokenizer_config.json", "config.json")
               if not (folder / name).is_file()]
    if ggufs != [model.name] or missing:
        why = f"it has no {', '.join(missing)}" if missing else f"it holds {len(ggufs)} .gguf files"
        raise InvarError(f"--model {model}: a GGUF file runs from its own folder, and {why}; put the file alone "
                         "in a folder beside its tokenizer.json, tokenizer_config.json and config.json "
                         "(docs/gguf.md) and pass either")
    return folder


ModelOpt = Annotated[Path, typer.Option("--model", help=(
    "The model folder (named by its tree digest); for --engine llamacpp also FILE.gguf, run from its folder."))]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="The dtype the engine computes in.")]
QuantOpt = Annotated[
    Quantization, typer.Option("--quantization", help="Weight quantization, where the engine has it (nf4: hf).")
]
AdapterOpt = Annotated[Path | None, typer.Option("--adapter", help="A LoRA adapter folder to sample from.")]
PatchOpt = Annotated[
    list[str] | None, typer.Option("--patch", help="A patch or kernel the worker runs with (repeatable): a name under "
                                                   "INVAR_HOME's patches/, or a folder path (docs/kernels.md).")
]
RunOpt = Annotated[
    Path | None, typer.Option("--run", help="Run directory for the records; default: a fresh runs/<command>-<time>.")
]
CallTimeoutOpt = Annotated[
    float, typer.Option("--call-timeout", help="Seconds one worker call may take before the worker is stopped.")
]
DEFAULT_CALL_TIMEOUT = 1800.0

__all__ = [
    "DEFAULT_MODEL",
    "AdapterOpt",
    "CallTimeoutOpt",
    "DtypeOpt",
    "EngineOpt",
    "ModelOpt",
    "QuantOpt",
    "RunOpt",
    "SettingOpt",
    "TemperatureOpt",
    "TopPOpt",
]
