"""A patch or kernel is a folder anywhere (`invar.patches`): found by name under INVAR_HOME's patches/ or by path,
pinned by digest in the contract (relative to it), checked by `use prepare`, and refused in one line when it changed;
a kernel's kernel.toml is checked against the op catalogue before any worker starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from invar import patches
from invar.cli.app import app
from invar.contract.inputs import check_patch_folders
from invar.contract.model import read_contract
from invar.errors import ContractError
from invar.home import HOME

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "kernels"
WALKTHROUGH = HOME / "contracts" / "walkthrough.toml"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def test_names_keep_their_digests_and_a_copy_elsewhere_has_the_same_one(tmp_path: Path) -> None:
    shipped = patches.available()
    assert shipped["fixed-block"] == patches.patch_digest(patches.PATCHES_DIR / "fixed-block")
    copy = _copy(patches.PATCHES_DIR / "fixed-block", tmp_path / "elsewhere" / "fb")
    digests, folders = patches.select(["fixed-block", str(copy)], "hf", "--patch")
    assert digests == {"fixed-block": shipped["fixed-block"], str(copy.resolve()): shipped["fixed-block"]}
    assert folders == {str(copy.resolve()): str(copy.resolve())}  # a name needs no folder: the worker finds it
    # Keyed relative to a declaration's folder, always with a slash, so it never reads as a name.
    assert patches.contract_key(copy, tmp_path / "elsewhere") == "./fb"
    assert patches.contract_key(copy, tmp_path / "other") == "../elsewhere/fb"


def test_an_unknown_reference_names_both_a_path_and_invar_home() -> None:
    with pytest.raises(ContractError) as info:
        patches.patch_dir("no-such-kernel")
    message = str(info.value)
    assert "\n" not in message
    assert "INVAR_HOME" in message
    assert "path" in message
    assert "fixed-block" in message
    with pytest.raises(ContractError, match="does not exist"):
        patches.patch_dir("./no-such-kernel")


@pytest.mark.parametrize(("toml", "words"), [
    ('op = "topk"\n', ["op 'topk'", "softmax"]),
    ('op = "softmax"\nengines = ["mlx"]\n', ["cannot be routed on the mlx engine", "hf"]),
    ('op = "attention"\nengines = ["vllm"]\n', ["cannot be routed on the vllm engine", "hf"]),
    ('op = "softmax"\ndtypes = ["int8"]\n', ["dtypes"]),
    ('op = "softmax"\nwhatever = 1\n', ["unknown key 'whatever'"]),
    ('op = softmax\n', ["not TOML"]),
])
def test_a_bad_kernel_toml_is_one_line(tmp_path: Path, toml: str, words: list[str]) -> None:
    folder = _copy(EXAMPLES / "softmax-fp32", tmp_path / "k")
    (folder / "kernel.toml").write_text(toml)
    with pytest.raises(ContractError) as info:
        patches.read_kernel(folder)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_a_kernel_for_another_engine_is_refused_before_any_worker(tmp_path: Path) -> None:
    folder = _copy(EXAMPLES / "softmax-fp32", tmp_path / "k")
    with pytest.raises(ContractError, match="cannot be routed on the mlx engine; the engines that can are hf"):
        patches.select([str(folder)], "mlx", "--candidate-patch")
    (folder / "kernel.toml").write_text('op = "matmul"\nengines = ["hf"]\n')
    with pytest.raises(ContractError, match="declares engines hf, not vllm"):
        patches.select([str(folder)], "vllm", "--candidate-patch")
    (folder / "kernel.py").unlink()
    with pytest.raises(ContractError, match=r"kernel\.py is not"):
        patches.read_kernel(folder)


def _declaration(tmp_path: Path, folder: Path) -> Path:
    """The shipped walkthrough declaration, its candidate's patch named by a folder path (relative to the file)."""
    text = WALKTHROUGH.read_text(encoding="utf-8").replace('"../', f'"{HOME.as_posix()}/')
    # Left out, so use prepare pins the worker code where it runs (this test is about the patch, not the pins).
    text = "\n".join(line for line in text.splitlines() if not line.startswith("worker_digest")) + "\n"
    digest = patches.patch_digest("fixed-block")
    text = text.replace(f'patches = {{ "fixed-block" = "{digest}" }}',
                        f'patches = {{ "{patches.contract_key(folder, tmp_path)}" = "{digest}" }}')
    assert patches.contract_key(folder, tmp_path) in text
    out = tmp_path / "decl.toml"
    out.write_text(text, encoding="utf-8")
    return out


def test_prepare_pins_a_folder_relative_to_the_contract_and_checks_it(tmp_path: Path) -> None:
    folder = _copy(patches.PATCHES_DIR / "fixed-block", tmp_path / "kernels" / "fb")
    decl = _declaration(tmp_path, folder)
    runner = CliRunner()
    result = runner.invoke(app, ["use", "prepare", str(decl), "--out", str(tmp_path / "prepared"), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    contract_path = tmp_path / "prepared" / "walkthrough.contract.json"
    doc = json.loads(contract_path.read_text())
    assert doc["candidate"]["patches"] == {"../kernels/fb": patches.patch_digest("fixed-block")}
    contract, _ = read_contract(contract_path)
    check_patch_folders(contract, contract_path.parent, None)  # the folder beside the contract is the pinned one

    # A folder edited after use prepare is refused where the contract is read again, in one line.
    (folder / "README.md").write_text("edited\n")
    with pytest.raises(ContractError) as info:
        check_patch_folders(contract, contract_path.parent, None)
    message = str(info.value)
    assert "\n" not in message
    assert str(folder) in message.replace("/prepared/../", "/")
    assert "changed after use prepare" in message
    # Away from the folder, the run's kept copy decides; a copy of other bytes is refused.
    shutil.rmtree(folder)
    kept = {"patches": {"candidate": {"../kernels/fb": patches.kept_files(patches.PATCHES_DIR / "fixed-block")}}}
    check_patch_folders(contract, contract_path.parent, kept)
    with pytest.raises(ContractError, match="keeps no copy"):
        check_patch_folders(contract, contract_path.parent, {})

    # use prepare itself checks the folder's digest (an edited README is refused now, not at use run).
    _copy(patches.PATCHES_DIR / "fixed-block", folder)
    (folder / "README.md").write_text("edited\n")
    result = runner.invoke(app, ["use", "prepare", str(decl), "--out", str(tmp_path / "again")])
    assert result.exit_code != 0
    message = str(result.exception)
    assert "\n" not in message
    assert message.startswith("candidate.patches.kernels/fb: the patch folder")
    assert "was declared" in message
