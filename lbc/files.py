"""Files that must survive a crash: written whole or not at all, and on disk before they are relied on."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_SUFFIX = ".tmp"


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write through `write` into a temporary beside `path`, fsync it, rename it over `path` and fsync
    the folder: a crash at any moment leaves the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def remove_stale_temporaries(directory: Path, log: logging.Logger | None = None) -> list[Path]:
    """Delete what a write killed midway left behind (nothing reads it); returns what was removed."""
    removed = sorted(directory.glob(f"*{TMP_SUFFIX}")) if directory.is_dir() else []
    for path in removed:
        path.unlink(missing_ok=True)
        if log:
            log.warning("removed %s, left by a write that did not finish", path)
    return removed
