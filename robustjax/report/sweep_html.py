"""The HTML page of a sweep database: robustness against FLOPs and parameters, and the rank
correlations between noise types (RobustART), drawn and computed by ``sweep.analyze``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import matplotlib

from robustjax.report import page
from robustjax.sweep import analyze


def _analysis_svg(draw, name: str) -> str:
    """What one of ``analyze``'s plot functions draws, as an ``<svg>`` element (they save to
    a path or file; the format then comes from ``savefig.format``), without its metadata (the
    time it was drawn), so that one sweep gives one page."""
    buffer = io.BytesIO()
    with matplotlib.rc_context({"savefig.format": "svg", "svg.fonttype": "none", "svg.hashsalt": name}):
        draw(buffer)
    text = buffer.getvalue().decode()
    return re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], count=1, flags=re.S)


def render_sweep_html(table: analyze.Table, title: str) -> str:
    """The page of a sweep's ``table`` (``sweep.export.table``): ``analyze``'s scatter plots of
    each figure against FLOPs and parameters and its Kendall tau matrix, with the rank
    correlations as tables. Raises ``analyze``'s ValueError for fewer than 2 networks."""
    correlations, costs = analyze.rank_correlations(table), analyze.cost_relation(table)
    parts = [f"<p>{page.escape(table.context)} {len(table.rows)} networks; figures: "
             f"{page.escape(', '.join(table.figures))}. {page.escape(analyze.noise_note(len(table.rows)))}</p>"]
    for cost in analyze.COSTS:
        parts.append(f"<h2 id=against-{cost}>Robustness against {cost}</h2>" + page.figure(
            _analysis_svg(lambda f, cost=cost: analyze.plot_costs(table, cost, f), f"sweep-{cost}"),
            f"Each figure (accuracy) of every network against its {cost} (log scale)."))
    parts.append(page.table(["figure", "cost", "n", "Kendall tau", "Spearman rho"], [
        [page.escape(c["figure"]), page.escape(c["cost"]), str(c["n"]), page.number(c["kendall_tau"], 3),
         page.number(c["spearman_rho"], 3)] for c in costs], numeric={2, 3, 4}))
    parts.append("<h2 id=correlations>Rank correlations between noise types</h2>" + page.figure(
        _analysis_svg(lambda f: analyze.plot_correlations(table, correlations, f), "sweep-correlations"),
        "Kendall's tau between the networks' rankings by each pair of figures."))
    statistics = ("kendall_tau", "kendall_p", "spearman_rho", "spearman_p")
    parts.append(page.table(["a", "b", "n", "Kendall tau", "p", "Spearman rho", "p"], [
        [page.escape(c["a"]), page.escape(c["b"]), str(c["n"]), *(page.number(c[k], 3) for k in statistics)]
        for c in correlations], numeric={2, 3, 4, 5, 6}))
    return page.document(title, "".join(parts))


def write_sweep_html(path: str | Path, table: analyze.Table, title: str) -> None:
    """Writes :func:`render_sweep_html` to ``path`` (its folder made if missing), atomically."""
    page.write(path, render_sweep_html(table, title))
