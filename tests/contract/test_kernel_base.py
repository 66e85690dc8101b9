"""The batch-invariant base a kernel contract proposes (`invar.contract.kernel_base.propose_base`), where it is partial
and where it is absent: a `linear` kernel takes the linear layers' products (`aten.mm`, `aten.addmm`) but not
attention's (`aten.bmm`), and the base's one matmul kernel routes both together, so the base is absent with one line
saying why, and `use init` keeps the stock engine as the reference. Pure: kernel folders are written here and read
for their `op` or their literal `REPLACES`, never imported."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from invar.cli.app import app
from invar.contract.kernel_base import BASE, BaseProposal, propose_base

HF: dict[str, Any] = {"reference_engine": "hf", "candidate_engine": "hf", "dtypes": {"float32"}, "quantized": False,
      "attention": None}
WHOLE = tuple(BASE.values())
LINEAR_ABSENT = ("no batch-invariant base: the candidate's kernel takes the linear layers' products (aten.mm) but "
                 "not attention's (aten.bmm), and the base's matmul routes both together")


def _function_kernel(root: Path, name: str, op: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "kernel.toml").write_text(f'op = "{op}"\nengines = ["hf"]\ndtypes = ["float32"]\n', encoding="utf-8")
    (folder / "kernel.py").write_text(f"def {op}(*args, **kwargs):\n    raise NotImplementedError\n",
                                      encoding="utf-8")
    return folder


def _patch(root: Path, name: str, source: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "patch.py").write_text(source, encoding="utf-8")
    return folder


def test_a_linear_kernel_has_no_base(tmp_path: Path) -> None:
    linear = _function_kernel(tmp_path, "my-linear", "linear")
    assert propose_base({"./my-linear": linear}, **HF) == BaseProposal((), (), LINEAR_ABSENT)
    # The same products named by a patch.py patch (a set literal, not a frozenset call) are refused alike, and a
    # second kernel beside it does not make the base possible.
    mm = _patch(tmp_path, "mm-only", 'REPLACES = {"aten.mm", "aten.addmm"}\n')
    silu = _function_kernel(tmp_path, "my-silu", "silu")
    assert propose_base({"./mm-only": mm, "./my-silu": silu}, **HF).absent == LINEAR_ABSENT


@pytest.mark.parametrize(("replaces", "left_out"), [
    # every product, attention's with the linear layers': the base's matmul is left out, the rest kept
    ('REPLACES: frozenset[str] = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"})\n',
     {"invariant-matmul"}),
    # attention's products alone: no linear product is taken, yet the base's matmul (which routes both) is left out
    ('REPLACES = ("aten.bmm",)\n', {"invariant-matmul"}),
    ('REPLACES = frozenset(["aten._softmax", "aten._log_softmax"])\n', {"invariant-softmax", "invariant-log-softmax"}),
])
def test_a_patch_leaves_out_each_base_op_its_replaces_overlaps(tmp_path: Path, replaces: str,
                                                                left_out: set[str]) -> None:
    patch = _patch(tmp_path, "p", "import torch\n\nNAME = 'p'\n" + replaces)
    proposal = propose_base({"./p": patch}, **HF)
    assert proposal.absent is None
    assert proposal.reference == WHOLE
    assert proposal.candidate == tuple(name for name in WHOLE if name not in left_out)


def test_two_function_kernels_leave_out_both_ops(tmp_path: Path) -> None:
    kernels = {"./n": _function_kernel(tmp_path, "n", "rms_norm"),
               "./l": _function_kernel(tmp_path, "l", "log_softmax")}
    proposal = propose_base(kernels, **HF)
    assert (proposal.reference, proposal.candidate, proposal.absent) == \
        (WHOLE, ("invariant-matmul", "invariant-softmax"), None)


@pytest.mark.parametrize(("make", "why"), [
    (lambda root: _patch(root, "computed", "REPLACES = frozenset(name for name in ('aten.mm',))\n"),
     "states no literal REPLACES (a set of op names) to leave out of the base"),
    (lambda root: _patch(root, "numbers", "REPLACES = {1, 2}\n"),
     "states no literal REPLACES (a set of op names) to leave out of the base"),
    (lambda root: _patch(root, "broken", "REPLACES = {'aten.mm'\n"), "cannot be read for its REPLACES"),
    (lambda root: _patch(root, "none", "NAME = 'none'\n"),
     "states no literal REPLACES (a set of op names) to leave out of the base"),
])
def test_a_patch_whose_replaces_cannot_be_read_has_no_base(tmp_path: Path, make: Any, why: str) -> None:
    folder = make(tmp_path)
    proposal = propose_base({"./k": folder}, **HF)
    assert proposal.reference == proposal.candidate == ()
    assert proposal.absent == f"no batch-invariant base: ./k: {folder / 'patch.py'} {why}"


def test_a_bad_kernel_toml_is_named_not_raised(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "kernel.toml").write_text('op = "conv2d"\n', encoding="utf-8")
    absent = propose_base({"./bad": folder}, **HF).absent
    assert absent is not None
    assert absent.startswith(f"no batch-invariant base: ./bad: {folder / 'kernel.toml'}: op 'conv2d' is not in the "
                             "catalogue")


@pytest.mark.parametrize(("changed", "why"), [
    ({"reference_engine": "vllm"}, "it routes its ops on the hf engine only"),
    ({"candidate_engine": "mlx"}, "it routes its ops on the hf engine only"),
    ({"dtypes": {"float32", "bfloat16"}}, "its kernels take float32 inputs of unquantized weights only"),
    ({"quantized": True}, "its kernels take float32 inputs of unquantized weights only"),
    ({"attention": "sdpa"}, "its softmax runs under eager attention, and attn_implementation=sdpa was chosen"),
])
def test_where_the_base_cannot_route_it_is_absent_before_any_kernel_is_read(tmp_path: Path,
                                                                          changed: dict[str, Any],
                                                                          why: str) -> None:
    # The folder does not exist: the engine, dtype and attention are decided first.
    proposal = propose_base({"./gone": tmp_path / "gone"}, **{**HF, **changed})
    assert proposal == BaseProposal((), (), f"no batch-invariant base: {why}")
    assert propose_base({}, **{**HF, "attention": "eager"}) == BaseProposal(WHOLE, WHOLE, None)


def test_use_init_with_a_linear_kernel_keeps_the_stock_reference(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`use init --candidate-patch ./my-linear --invariance` says in one line why there is no base and writes the
    stock engine as the reference (the workers' identities stood in for: the claim is what the command writes)."""
    def probe(engine: Any, launch: dict[str, Any], patches: dict[str, str], *_: Any) -> SimpleNamespace:
        return SimpleNamespace(engine_version={"invar": "0.1.0", "torch": "2"},
                               settings={"attn_implementation": launch.get("attn_implementation", "sdpa"),
                                         "device": "cpu", "threads": 1})

    monkeypatch.setattr("invar.runner.engine.probe_identity", probe)
    _function_kernel(tmp_path, "my-linear", "linear")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "k.toml"
    result = CliRunner().invoke(app, ["use", "init", str(out), "--sample", "40", "--candidate-patch", "./my-linear",
                                      "--invariance"])
    assert result.exit_code == 0, (result.output, result.exception)
    said = [line for line in result.output.splitlines() if line.startswith("no batch-invariant base: ")]
    assert said == [f"{LINEAR_ABSENT}; the reference is the stock engine (invariance relative to it also judges the "
                    "engine's own layout dependence)"], result.output
    decl = tomllib.loads(out.read_text(encoding="utf-8"))
    assert "patches" not in decl["reference"]
    assert list(decl["candidate"]["patches"]) == ["./my-linear"]
