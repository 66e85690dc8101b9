"""The report as a page: the example scripts/report_preview.py draws (the preview docs/compare.md shows) is a real
picture, and where a headless Chromium is installed the HTML itself is rendered and screenshotted."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import headless
import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("invar_report_preview", REPO_ROOT / "scripts" / "report_preview.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("preview")
    _script().main(out, html=True)
    return out


def _picture(path: Path) -> np.ndarray:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels: np.ndarray = matplotlib.image.imread(path)
    return pixels


def test_the_preview_is_a_picture_of_the_headline_and_charts(drawn: Path) -> None:
    pixels = _picture(drawn / "example-report-preview.png")
    assert pixels.shape[1] == 640  # 8 inches at 80 dpi
    assert pixels.shape[0] > 1000  # the headline and three charts below it
    assert float(np.std(pixels[..., :3])) > 0.05  # drawn on, not blank
    page = (drawn / "example-report.html").read_text(encoding="utf-8")
    head = page[:page.index("Where they part")]
    for phrase in ("500 units", "task loss", "change +", "<th>decision</th>", "<th>bound</th>",
                   "paired-binary-score/1"):
        assert phrase in head, phrase


def test_the_report_renders_in_headless_chromium(drawn: Path) -> None:
    pixels = headless.screenshot(drawn / "example-report.html", drawn / "screenshot.png", width=1100, height=2400)
    assert pixels.shape == (2400, 1100, 3)
    assert float(np.std(pixels)) > 0.05
    assert headless.colours(pixels) >= 20
    assert headless.drawn_fraction(pixels) > 0.03
    assert headless.saturated(pixels) > 2000
