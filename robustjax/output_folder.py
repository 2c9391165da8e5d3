"""An evaluation's output folder, as its writer (the evaluation) and its readers (the report,
the command line) both know it: ``report.json`` of schema ``SCHEMA_VERSION`` and, beside it,
``items/``, the store of finished items, whose ``lock`` file the writing process holds."""

from __future__ import annotations

import fcntl
from pathlib import Path

SCHEMA_VERSION = 6  # of report.json
ITEMS_FOLDER = "items"
LOCK_FILE = "lock"


def store_is_held(folder: str | Path) -> bool | None:
    """Whether a process (this one included) holds the item store in ``folder`` open for
    writing; None when there is no store there."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file():
        return None
    with open(path) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False  # closing the file released the shared lock
