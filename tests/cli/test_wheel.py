"""Invar installed like any package: a wheel built from this checkout, installed into a fresh virtual environment,
runs `invar infer` and `invar use prepare` from a folder outside the checkout, on the model the wheel carries."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from invar import home
from invar.patches import patch_digest

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "src")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", home.ENV, "VIRTUAL_ENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_setup_py_ships_the_folders_the_core_looks_for() -> None:
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    shipped = next(ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SHIPPED")
    assert tuple(shipped) == home.SHIPPED
    for rel in home.SHIPPED:
        assert (REPO_ROOT / rel).is_dir(), rel


def test_home_is_the_setting_then_the_bundled_copy_then_the_checkout(tmp_path: Path) -> None:
    assert home.resolve({home.ENV: str(tmp_path)}) == tmp_path.resolve()
    # This checkout is installed editable: no bundled copy, so the checkout itself.
    assert home.resolve({}) == REPO_ROOT
    assert home.HOME == REPO_ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel; the engines come from this interpreter's site-packages through a .pth."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for rel in (*BUILD_INPUTS, *home.SHIPPED):
        target = src / rel
        if (REPO_ROOT / rel).is_dir():
            shutil.copytree(REPO_ROOT / rel, target, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", "*.egg-info", "_home"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, target)
    dist = base / "dist"
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                         capture_output=True, text=True, timeout=600, env=_clean_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheel = next(dist.glob("invar-*.whl"))

    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # The engines and the core's dependencies are this interpreter's; a directory named in a .pth is not a site
    # directory, so the editable install of the checkout that lives there is not activated in the new venv.
    (purelib / "engines-from-the-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                          "--no-index", str(wheel)], capture_output=True, text=True, timeout=300, env=_clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    return venv


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "invar"), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=_clean_env())


def test_the_wheel_imports_its_own_core_and_home(installed: Path, tmp_path: Path) -> None:
    code = "import invar, invar.home, invar.workers.hf_worker as w; print(invar.__file__); print(invar.home.HOME)"
    out = subprocess.run([str(installed / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=_clean_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    core, where = out.stdout.split()
    assert Path(core).is_relative_to(installed), core
    assert Path(where) == Path(core).parent / "_home"
    assert not Path(where).is_relative_to(REPO_ROOT)


@pytest.mark.engine
def test_the_wheel_runs_infer_from_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = _run(installed, "infer", "37+58=", "--seed", "5", "--max-tokens", "6", "--json", "--run", "runs/infer",
               cwd=work)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["outputs"][0]["prompt"] == "37+58="
    # The same shipped model, found inside the installed package: its digest is the checkout's.
    from invar import canonical
    assert doc["model_digest"] == canonical.tree_digest(REPO_ROOT / "models" / "tiny-arith")
    assert (work / "runs" / "infer").is_dir()


def test_the_wheel_prepares_a_shipped_contract_from_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run([str(installed / "bin" / "python"), "-c", "import invar.home; print(invar.home.HOME)"],
                           capture_output=True, text=True, check=True, env=_clean_env(), cwd=tmp_path).stdout.strip()
    out = _run(installed, "use", "prepare", str(Path(where) / "contracts" / "walkthrough.toml"), "--out", "prepared",
               "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    contract = json.loads((tmp_path / "prepared" / "walkthrough.contract.json").read_text())
    # The wheel's copy of the patch is the checkout's, byte for byte: the same digest.
    assert contract["candidate"]["patches"] == {"fixed-block": patch_digest(REPO_ROOT / "patches" / "fixed-block")}
    assert doc["sha256"] == (tmp_path / "prepared" / "walkthrough.contract.json.sha256").read_text().split()[0]


@pytest.mark.engine
def test_the_wheel_runs_a_kernel_folder_from_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    """A function kernel in a folder of its own, beside no checkout: hashed, self-checked and applied by the
    installed worker, which reports the folder's digest."""
    work = tmp_path / "elsewhere"
    shutil.copytree(REPO_ROOT / "examples" / "kernels" / "silu-fp32", work / "my-silu")
    out = _run(installed, "use", "package", "hf", "--patch", "./my-silu", "--json", cwd=work)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    folder = str((work / "my-silu").resolve())
    assert doc["patches"] == {folder: patch_digest(work / "my-silu")}
    assert doc["settings"]["attn_implementation"] == "sdpa"  # a kernel other than softmax keeps SDPA
    (work / "my-silu" / "kernel.py").write_text("def silu(x):\n    return x[..., :1]\n")
    out = _run(installed, "use", "package", "hf", "--patch", "./my-silu", cwd=work)
    assert out.returncode == 2, out.stderr
    assert "returned shape" in out.stderr
