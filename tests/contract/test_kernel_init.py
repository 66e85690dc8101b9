"""`use init --candidate-patch` proposes a contract that judges the kernel, not the engine around it: the task bound,
`[measurements]` with teacher forcing and a `max_kl` bound, and `[determinism]` (the pairing layout run twice,
relative to the stock reference), with no batch invariance; `--invariance` adds invariance relative to a reference
running the batch-invariant base (the candidate runs the base less the ops its kernel replaces); the reference runs the
attention the patched candidate runs. `use init` writes `[measurements]` on request for any candidate. The workers'
identities are stood in for (the claim is about what the command writes; tests/cli/test_use_init.py runs it on the
real engine), and each file is checked by `use prepare`'s checks as `use init` writes it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from invar.cli.app import app
from invar.cli.use_init import KERNEL_MAX_KL
from invar.contract.declaration_toml import declaration_toml
from invar.contract.kernel_base import BASE as BASE_NAMES
from invar.contract.model import parse_declaration
from invar.errors import InvarError
from invar.patches import patch_digest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "kernels"


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Each identity asked for; a patched worker reports eager attention, as the hf worker's patch host does, and
    an unpatched one the launch setting it was given (SDPA by default)."""
    started: list[tuple[Any, ...]] = []

    def probe(engine: Any, launch: dict[str, Any], patches: dict[str, str], *_: Any) -> SimpleNamespace:
        started.append((launch, patches))
        attention = "eager" if patches else launch.get("attn_implementation", "sdpa")
        return SimpleNamespace(engine_version={"invar": "0.1.0", "torch": "2"},
                               settings={"attn_implementation": attention, "device": "cpu", "threads": 1})

    monkeypatch.setattr("invar.runner.engine.probe_identity", probe)
    return started


def _init(out: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["use", "init", str(out), "--sample", "40", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    text = out.read_text(encoding="utf-8")
    decl = tomllib.loads(text)
    declaration = parse_declaration(decl, str(out))  # the declaration model reads it as written
    # and writes it again to the same bytes: the file is written from the model
    digests = dict(zip(("reference", "candidate"), re.findall(r"tokenizer digest, ([0-9a-f]{64}),", text), strict=True))
    assert declaration_toml(declaration, out.name, digests) == text
    return decl


BASE = {name: patch_digest(name) for name in BASE_NAMES.values()}


DETERMINISM = {"required": True, "layout": "b16", "runs": 2, "relative_to": "reference"}


def test_a_patched_candidate_gets_a_kernel_contract(tmp_path: Path, probes: list[tuple[Any, ...]]) -> None:
    decl = _init(tmp_path / "k.toml", "--candidate-patch", "split-k")
    # The task bound, max_kl and determinism; batch invariance is not required, so there is no base.
    assert decl["invariance"] == {"required": False}
    assert decl["layouts"] == {"b16": {"batch_size": 16}}
    assert decl["determinism"] == DETERMINISM
    assert decl["measurements"] == {"teacher_forcing": True, "capture_steps": ["every:1"], "max_kl": KERNEL_MAX_KL}
    assert "patches" not in decl["reference"]
    assert decl["candidate"]["patches"] == {"split-k": patch_digest("split-k")}
    assert "determinism" in decl["description"]
    assert "--invariance" in decl["description"]
    # The reference runs the attention the patched candidate runs: the kernel is the difference.
    assert decl["reference"]["settings"]["attn_implementation"] == "eager"
    assert [launch.get("attn_implementation") for launch, _ in probes] == [None, None, "eager"]


def test_invariance_adds_batch_invariance_on_the_base(tmp_path: Path, probes: list[tuple[Any, ...]]) -> None:
    decl = _init(tmp_path / "k.toml", "--candidate-patch", "split-k", "--invariance")
    assert decl["invariance"] == {"required": True, "relative_to": "reference",
                                  "layouts": ["b16", "b32-shuffled", "solo"]}
    assert decl["determinism"] == DETERMINISM
    assert decl["measurements"] == {"teacher_forcing": True, "capture_steps": ["every:1"], "max_kl": KERNEL_MAX_KL}
    # The batch-invariant base: all of it on the reference; on the candidate all but the products split-k replaces.
    assert decl["reference"]["patches"] == BASE
    assert decl["candidate"]["patches"] == {**{k: v for k, v in BASE.items() if k != "invariant-matmul"},
                                            "split-k": patch_digest("split-k")}
    # Both sides run eager attention (the base's softmax is on the model's path there): the kernel is the difference.
    assert decl["reference"]["settings"]["attn_implementation"] == "eager"
    assert decl["candidate"]["settings"]["attn_implementation"] == "eager"
    assert [launch.get("attn_implementation") for launch, _ in probes] == [None, None]


@pytest.mark.parametrize(("kernel", "left_out"), [
    (EXAMPLES / "silu-fp32", set()),
    (EXAMPLES / "softmax-fp32", {"invariant-softmax"}),
    (EXAMPLES / "matmul-cached", {"invariant-matmul"}),
    (REPO / "patches" / "fixed-block", set(BASE)),
])
def test_the_base_leaves_out_the_ops_the_kernel_replaces(tmp_path: Path, probes: list[tuple[Any, ...]],
                                                         kernel: Path, left_out: set[str]) -> None:
    decl = _init(tmp_path / "k.toml", "--candidate-patch", str(kernel), "--invariance")
    assert decl["reference"]["patches"] == BASE
    base = {k: v for k, v in decl["candidate"]["patches"].items() if k in BASE}
    assert base == {k: v for k, v in BASE.items() if k not in left_out}
    assert len(decl["candidate"]["patches"]) == len(base) + 1  # and the kernel


def test_no_base_keeps_the_stock_reference(tmp_path: Path, probes: list[tuple[Any, ...]]) -> None:
    decl = _init(tmp_path / "k.toml", "--candidate-patch", "split-k", "--invariance", "--no-base")
    assert "patches" not in decl["reference"]
    assert decl["candidate"]["patches"] == {"split-k": patch_digest("split-k")}
    assert decl["reference"]["settings"]["attn_implementation"] == "eager"  # asked again with the candidate's
    assert [launch.get("attn_implementation") for launch, _ in probes] == [None, None, "eager"]
    decl = _init(tmp_path / "n.toml", "--candidate-patch", "split-k", "--no-invariance")
    assert "patches" not in decl["reference"]  # nothing for the base to make invariant


@pytest.mark.parametrize(("args", "why"), [
    (["--candidate-patch", "split-k", "--setting", "attn_implementation=sdpa"], "attn_implementation=sdpa"),
    (["--candidate-patch", "split-k", "--dtype", "bfloat16"], "float32 inputs"),
    (["--candidate-patch", "./my-attention"], "it replaces attention, which runs under SDPA"),
])
def test_where_the_base_cannot_route_one_line_says_why(tmp_path: Path, probes: list[tuple[Any, ...]],
                                                       args: list[str], why: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    attention = tmp_path / "my-attention"
    attention.mkdir()
    (attention / "kernel.toml").write_text('op = "attention"\nengines = ["hf"]\n', encoding="utf-8")
    (attention / "kernel.py").write_text("from torch.nn.functional import scaled_dot_product_attention as attention\n",
                                         encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "k.toml"
    result = CliRunner().invoke(app, ["use", "init", str(out), "--sample", "40", "--invariance", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    said = [line for line in result.output.splitlines() if line.startswith("no batch-invariant base: ")]
    assert len(said) == 1, result.output
    assert why in said[0], result.output
    assert "patches" not in tomllib.loads(out.read_text(encoding="utf-8"))["reference"]


def test_the_kernel_defaults_can_each_be_changed(tmp_path: Path, probes: list[tuple[Any, ...]]) -> None:
    decl = _init(tmp_path / "k.toml", "--candidate-patch", "split-k", "--invariance-relative-to", "none",
                 "--max-kl", "none", "--capture-step", "0", "--capture-step", "last", "--setting",
                 "attn_implementation=sdpa", "--candidate-setting", "attn_implementation=eager")
    assert decl["invariance"] == {"required": True, "layouts": ["b16", "b32-shuffled", "solo"]}
    assert decl["measurements"] == {"teacher_forcing": True, "capture_steps": [0, "last"]}
    assert decl["reference"]["settings"]["attn_implementation"] == "sdpa"  # chosen: kept
    decl = _init(tmp_path / "n.toml", "--candidate-patch", "split-k", "--no-measurements", "--invariance")
    assert "measurements" not in decl
    assert decl["invariance"]["relative_to"] == "reference"
    decl = _init(tmp_path / "d.toml", "--candidate-patch", "split-k", "--no-determinism")
    assert "determinism" not in decl
    assert decl["invariance"] == {"required": False}


def test_without_patches_nothing_changes_unless_asked(tmp_path: Path, probes: list[tuple[Any, ...]]) -> None:
    decl = _init(tmp_path / "q.toml", "--candidate-quantization", "nf4")
    assert "measurements" not in decl
    assert "determinism" not in decl
    assert decl["invariance"] == {"required": True, "layouts": ["b16", "b32-shuffled", "solo"]}
    decl = _init(tmp_path / "m.toml", "--candidate-quantization", "nf4", "--measurements", "--max-kl", "0.01",
                 "--invariance-relative-to", "reference")
    assert decl["measurements"] == {"teacher_forcing": True, "capture_steps": ["every:1"], "max_kl": "0.01"}
    assert decl["invariance"]["relative_to"] == "reference"


@pytest.mark.parametrize(("args", "says"), [
    (["--invariance-relative-to", "stock"], "--invariance-relative-to 'stock': write reference or none"),
    (["--invariance-relative-to", "reference", "--no-invariance"], "--invariance-relative-to reference judges"),
    (["--max-kl", "0.01", "--no-measurements"], "--max-kl and --capture-step set [measurements]"),
    (["--measurements", "--sequential", "--no-invariance"], "--measurements covers batches"),
    (["--measurements", "--max-kl", "-1"], "measurements.max_kl"),
    (["--determinism", "--sequential", "--no-invariance"], "--determinism runs every unit again"),
    (["--measurements", "--capture-step", "every:0"], "measurements.capture_steps"),
])
def test_bad_kernel_options_are_one_line_and_nothing_is_written(tmp_path: Path, probes: list[tuple[Any, ...]],
                                                                 args: list[str], says: str) -> None:
    out = tmp_path / "decl.toml"
    result = CliRunner().invoke(app, ["use", "init", str(out), "--candidate-quantization", "nf4", *args])
    assert isinstance(result.exception, InvarError), (result.output, result.exception)
    assert "\n" not in str(result.exception)
    assert says in str(result.exception), str(result.exception)
    assert not out.exists()
    assert probes == []
