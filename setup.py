"""Build step that carries the shipped folders inside the wheel.

A wheel installed anywhere must find the tiny model, its populations, the patches and the example contracts
without the source checkout. `build_py` copies the folders named by `invar.home.SHIPPED` into `invar/_home/`
of the build, byte for byte (bytecode caches aside), so every digest is the checkout's. An editable install
reads the checkout itself and gets no copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Kept in step with invar.home.SHIPPED (a test checks both name the same folders).
SHIPPED = ("models/tiny-arith", "data", "patches", "contracts", "configs")


class BuildWithHome(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        home = Path(self.build_lib) / "invar" / "_home"
        if home.exists():
            shutil.rmtree(home)
        for rel in SHIPPED:
            shutil.copytree(ROOT / rel, home / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithHome})
