"""Option aliases shared by every command that takes the option: one flag, type, metavar and help text, right for
each command that uses it (a default stays with the command's parameter, where it may differ: `--max-tokens`).

Where a command gives a flag another meaning, it keeps its own option and no alias is forced on it: `score
--temperature` (the temperature of items that state none, > 0) and `score --batch-size` (items per score call);
`infer --seed` (request i uses seed + i) beside `evaluate --seed` (each problem's seed derives from it); `use
package --model` (optional: prints the folder's digests) and `kernel check --model`, `--population`; `use init`'s
`--model`, `--engine`, `--setting`, `--patch`, `--dtype` and `--quantization` (the reference's, beside each
`--candidate-*`); `use init --confidence` (1 − δ as a decimal text); `train --run`, `use run --run` (resumed) and
`use verify --run` (the run decided).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invar.engines import DEFAULT_MODEL, ENGINE_TABLE, Dtype, Engine, Quantization
from invar.errors import InvarError

TemperatureOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature, in [0, 10] (0: greedy).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="Most response tokens per request.")]
EngineOpt = Annotated[Engine, typer.Option("--engine", help="The engine whose worker runs the model.")]


def _setting_help() -> str:
    """--setting's help, from the engine table, so an engine's required settings are named where they are defined
    (an engine as `use package` names it too, which takes it as an argument)."""
    required = [f"for the {e.name} engine: " + " and ".join(f"{n}=…" for n, s in e.settings.items() if s.required)
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
PopulationOpt = Annotated[Path, typer.Option("--population", help="The population file (JSON lines).")]
ScorerOpt = Annotated[
    str, typer.Option("--scorer", help="A built-in scorer (exact-match, numeric, regex, choice, contains, "
                                       "arithmetic-exact) or path.py:function (relative to this folder).")
]
ScorerSettingOpt = Annotated[
    list[str] | None, typer.Option("--scorer-setting", metavar="NAME=JSON",
                                   help="A scorer setting, its value as JSON (e.g. case_fold=true, "
                                        "'options=[\"A\",\"B\"]'); repeatable.")
]
ConfidenceOpt = Annotated[float, typer.Option("--confidence", help="Confidence of each interval reported.")]
CallTimeoutOpt = Annotated[
    float, typer.Option("--call-timeout", help="Seconds one worker call may take before the worker is stopped.")
]
DEFAULT_CALL_TIMEOUT = 1800.0

__all__ = [
    "DEFAULT_MODEL",
    "AdapterOpt",
    "CallTimeoutOpt",
    "ConfidenceOpt",
    "DtypeOpt",
    "EngineOpt",
    "MaxTokensOpt",
    "ModelOpt",
    "PatchOpt",
    "PopulationOpt",
    "QuantOpt",
    "RunOpt",
    "ScorerOpt",
    "ScorerSettingOpt",
    "SettingOpt",
    "TemperatureOpt",
    "TopPOpt",
]
