"""Writing a file atomically: a reader never sees half of it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable) -> None:
    """Writes ``path`` through ``write(file)`` (a binary file) into a temporary file beside
    it, ``.NAME.*.tmp``, flushed to disk, then replaces ``path`` with it: a reader never sees
    half a file, and a writer killed at any moment leaves the old one whole."""
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                     delete=False) as file:
        try:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        except BaseException:
            os.unlink(file.name)
            raise
    os.replace(file.name, path)
