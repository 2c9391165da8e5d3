"""The parts every robustjax HTML page shares: its style, escaping, number formats, tables,
figures, the document around them, and the atomic write."""

from __future__ import annotations

import html
from pathlib import Path

from robustjax.files import write_atomically

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1000px; padding: 1em 2em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; padding-bottom: 0.2em; }
nav a { margin-right: 0.8em; white-space: nowrap; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 14px; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
figure { margin: 0.8em 0; } figure svg { max-width: 100%; height: auto; display: block; }
figcaption { font-size: 13px; color: #555; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 12px; }
.absent { color: #666; font-style: italic; }
.note { background: #fff7d6; border-left: 4px solid #e0b400; padding: 0.4em 0.8em; }
.error { background: #fde8e8; border-left: 4px solid #c33; padding: 0.4em 0.8em; }
.status-complete { color: #16794a; } .status-incomplete, .status-interrupted, .status-killed,
.status-running { color: #a86b00; } .status-failed { color: #c33; }
.failed { color: #c33; } .warn { color: #a86b00; font-weight: bold; } .pass { color: #16794a; }
.gallery td { text-align: center; font-size: 13px; }
.gallery img { width: 96px; height: 96px; image-rendering: pixelated; display: block; margin: auto; }
"""


def escape(value) -> str:
    return html.escape(str(value))


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}g}"  # None or NaN: '-'


def table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table; cells are HTML already (escape text with :func:`escape`)."""
    head = "".join(f"<th>{cell}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td class=num>{cell}</td>" if i in numeric else f"<td>{cell}</td>"
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{caption}</figcaption></figure>"


def document(title: str, body: str) -> str:
    """A whole page: ``title`` as its title and first heading, then ``body`` (HTML)."""
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><style>{CSS}</style></head>"
            f"<body><h1>{escape(title)}</h1>{body}</body></html>\n")


def write(path: str | Path, text: str) -> None:
    """Writes ``text`` to ``path`` (its folder made if missing), replacing it atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: f.write(text.encode()))
