"""A full disk, made real on a small tmpfs (the `mount_tmpfs` fixture)."""

from __future__ import annotations

from pathlib import Path


def fill(folder: Path) -> Path:
    """Fill the file system under `folder` to its last byte (a file that grows until ENOSPC); returns that file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler
