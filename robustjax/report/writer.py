"""Writing ``report.json`` atomically, reading it back, and its JSON Schema."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from robustjax.files import write_atomically
from robustjax.output_folder import ITEMS_FOLDER, SCHEMA_VERSION, store_is_held


def write_report(path: str | Path, report: dict) -> None:
    """Writes ``report`` as JSON, replacing ``path`` atomically (a reader never sees half a
    file; a killed writer leaves a hidden ``.report.json.*.tmp`` beside it at most)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    write_atomically(path, lambda f: f.write(text.encode()))


def read_report(path: str | Path) -> dict:
    """The report in ``path``. One of a newer schema than this robustjax writes is refused.
    A report still ``running`` whose writer is gone (its output folder's item store is no
    longer locked: the process was killed) comes back with status ``killed``."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the report {path}: {error}") from None
    if not isinstance(report, dict) or not isinstance(report.get("schema_version"), int):
        raise ValueError(f"{path} is not a robustjax report (no schema_version)")
    if report["schema_version"] > SCHEMA_VERSION:
        raise ValueError(f"{path} has schema version {report['schema_version']}, newer than this robustjax reads "
                         f"({SCHEMA_VERSION}); upgrade robustjax to read it")
    if report.get("status") == "running" and store_is_held(path.parent / ITEMS_FOLDER) is False:
        report["status"] = "killed"
    return report


def schema() -> dict:
    """The JSON Schema of ``report.json`` (documented in docs/report-schema.md)."""
    return json.loads(resources.files("robustjax.report").joinpath("report.schema.json").read_text())
