"""``robustjax report PATH``: the tables of a ``report.json``, how far its run got, and its
``report.html`` rendered again (with the gallery beside it, if any); for a sweep database,
the HTML page of the sweep's analysis."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from robustjax.evaluation import gallery
from robustjax.report import TABLES, html, read_report
from robustjax.report.sweep_html import write_sweep_html
from robustjax.sweep import export
from robustjax.sweep.store import Store

STATUS_LINES = {
    "complete": "complete",
    "incomplete": "finished, but some items failed (their errors are in the tables)",
    "running": "still running (another process is writing it)",
    "interrupted": "interrupted before it finished; rerun the same `robustjax evaluate` to resume",
    "killed": "ended before it finished: its process was killed; rerun the same `robustjax evaluate` to resume",
    "failed": "failed",
}


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(16) == b"SQLite format 3\x00"


def _sweep_report(path: Path, out: str | None, console: Console) -> int:
    """The page of the sweep in database ``path`` (``robustjax sweep run --db``), beside it or at ``out``."""
    table = export.table(Store.read(path))
    page = Path(out) if out else path.with_suffix(".html")
    write_sweep_html(page, table, f"robustjax sweep: {path.name}")
    console.print(f"HTML page of the sweep's {len(table.rows)} networks written to {page}", highlight=False,
                  soft_wrap=True)
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.path)
    if path.is_file() and _is_sqlite(path):
        return _sweep_report(path, args.html, console)
    path = path / "report.json" if path.is_dir() else path
    report = read_report(path)
    for render in TABLES.values():
        if (table := render(report)) is not None:
            console.print(table)
    status = report["status"]
    line = STATUS_LINES.get(status, status)
    if status == "failed":
        line += f": {report.get('error', 'no error recorded')}"
    console.print(f"{path}: {line}", highlight=False, soft_wrap=True)
    page = Path(args.html) if args.html else path.parent / html.FILE
    html.write_html(page, report, gallery.load(path.parent / gallery.FILE))
    console.print(f"HTML report written to {page}", highlight=False, soft_wrap=True)
    return 0
