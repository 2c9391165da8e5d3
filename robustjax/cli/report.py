"""``robustjax report PATH``: the tables of a ``report.json``, how far its run got, and its
``report.html`` rendered again (with the gallery beside it, if any); for a sweep database,
the HTML page of the sweep's analysis; ``robustjax report --db DB --arch ID --out DIR``: one
network of a sweep, its report.json and report.html from the sweep's records."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from robustjax.evaluation import gallery
from robustjax.evaluation.items import REPORT
from robustjax.evaluation.resume import ReplicaStore
from robustjax.report import TABLES, html, read_report, write_report
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


def network_report(path: Path, arch_id: str) -> dict:
    """The report of network ``arch_id`` of the sweep in database ``path``, as its ``report``
    item recorded it; a ValueError says how to find the ids, or why there is none."""
    store = Store.read(path)
    ids = [network for network, _, _ in store.networks()]
    if arch_id not in ids:
        raise ValueError(f"{path} has no network {arch_id!r} (it has {len(ids)}, e.g. {', '.join(ids[:3])}); "
                         f"`robustjax sweep export --db {path} --format csv --out FILE` lists every arch_id")
    keys = [item["item_key"] for item in store.items() if item["kind"] == REPORT]
    if not keys:
        raise ValueError(f"the sweep in {path} has no per-network report: its plan has none of [metrics], "
                         "[natural_shift] or [sanity] enabled = true, the sections each network runs alone; its "
                         f"figures are in `robustjax sweep export --db {path}`")
    record = store.record(arch_id, keys[0])
    if record is None:
        raise ValueError(f"network {arch_id!r} of {path} has no finished report yet (or it failed: see `robustjax "
                         f"sweep export --db {path}`'s errors column); rerun `robustjax sweep run` to finish it")
    return ReplicaStore(record).load(REPORT).section


def _print(report: dict, console: Console) -> None:
    for render in TABLES.values():
        if (table := render(report)) is not None:
            console.print(table)


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    if args.arch is not None or args.db is not None:
        if args.arch is None or (args.db or args.path) is None:
            raise ValueError("robustjax report --db DB --arch ID: give both the sweep database and the network's id")
        db = Path(args.db or args.path)
        if not (db.is_file() and _is_sqlite(db)):
            raise ValueError(f"no sweep database at {db}")
        report = network_report(db, args.arch)
        _print(report, console)
        folder = Path(args.out or f"{db.with_suffix('')}-{args.arch}")
        write_report(folder / "report.json", report)
        html.write_html(Path(args.html) if args.html else folder / html.FILE, report)
        console.print(f"report of network {args.arch} written to {folder}", highlight=False, soft_wrap=True)
        return 0
    if args.path is None:
        raise ValueError("robustjax report needs a report.json, an output folder or a sweep database")
    path = Path(args.path)
    if path.is_file() and _is_sqlite(path):
        return _sweep_report(path, args.html, console)
    path = path / "report.json" if path.is_dir() else path
    report = read_report(path)
    _print(report, console)
    status = report["status"]
    line = STATUS_LINES.get(status, status)
    if status == "failed":
        line += f": {report.get('error', 'no error recorded')}"
    console.print(f"{path}: {line}", highlight=False, soft_wrap=True)
    page = Path(args.html) if args.html else path.parent / html.FILE
    html.write_html(page, report, gallery.load(path.parent / gallery.FILE))
    console.print(f"HTML report written to {page}", highlight=False, soft_wrap=True)
    return 0
