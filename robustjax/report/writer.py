"""Writing ``report.json`` atomically, and its JSON Schema."""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path


def write_report(path: str | Path, report: dict) -> None:
    """Writes ``report`` as JSON, replacing ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
        json.dump(report, f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(f.name, path)


def schema() -> dict:
    """The JSON Schema of ``report.json`` (documented in docs/report-schema.md)."""
    return json.loads(resources.files("robustjax.report").joinpath("report.schema.json").read_text())
