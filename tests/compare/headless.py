"""A page as a headless Chromium draws it: the report's check in a real browser (issue 27). `make test` installs
Chromium through apt-get where the machine has none and apt-get can run; elsewhere the tests that need it skip,
naming why, and the report is still checked by its structure (test_compare_runs.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "google-chrome-stable")
NO_BROWSER = "no Chromium on this machine (make test installs it with apt-get as root): the report is checked by " \
    "its structure only"


def browser() -> str:
    """The path of an installed Chromium; skips the calling test where there is none."""
    found = next((b for b in map(shutil.which, BROWSERS) if b is not None), None)
    if found is None:
        pytest.skip(NO_BROWSER)
    return found


def screenshot(page: Path, shot: Path, *, width: int = 1100, height: int = 2400) -> np.ndarray:
    """Draw `page` in a headless Chromium window of `width` × `height` pixels into the PNG `shot`; its RGB pixels
    (floats in [0, 1], shape (height, width, 3))."""
    import matplotlib.image

    subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels: np.ndarray = matplotlib.image.imread(shot)
    return pixels[..., :3]


def drawn_fraction(pixels: np.ndarray) -> float:
    """The share of pixels that are not the white page."""
    return float(np.mean(pixels.min(axis=-1) < 0.95))


def colours(pixels: np.ndarray) -> int:
    """How many distinct colours the picture holds, each channel cut to 16 levels (anti-aliasing merged)."""
    levels = np.round(pixels * 15).astype(np.int32)
    return len(np.unique(levels[..., 0] * 256 + levels[..., 1] * 16 + levels[..., 2]))


def saturated(pixels: np.ndarray) -> int:
    """How many pixels are plainly coloured (a chart's bars and lines), not grey, black or white."""
    return int(np.sum(pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3))
