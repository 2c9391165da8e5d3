"""Writing ``report.json`` atomically, and its JSON Schema."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from robustjax.evaluation.resume import write_atomically


def write_report(path: str | Path, report: dict) -> None:
    """Writes ``report`` as JSON, replacing ``path`` atomically (a reader never sees half a
    file; a killed writer leaves a hidden ``.report.json.*.tmp`` beside it at most)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    write_atomically(path, lambda f: f.write(text.encode()))


def schema() -> dict:
    """The JSON Schema of ``report.json`` (documented in docs/report-schema.md)."""
    return json.loads(resources.files("robustjax.report").joinpath("report.schema.json").read_text())
