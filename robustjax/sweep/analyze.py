"""Analysis of a sweep over many networks, after RobustART (arXiv 2109.05211).

Robustness against FLOPs and parameters, rank correlations between noise types, the effect
of each search dimension, the Pareto front of clean against robust accuracy, and how well
each training-free proxy ranks each figure: CSV tables, PNG plots and a markdown summary.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import numbers
import pathlib
import re
import warnings

import numpy as np
from matplotlib.figure import Figure
from scipy import stats

COSTS = ("flops", "params")


@dataclasses.dataclass(frozen=True)
class Table:
    """One row per network.

    ``rows``: dicts with "arch_id" (str), "params" (int), "flops" (int), every dimension column
    and every figure column. ``dimensions``: the search-dimension columns (ints or strings).
    ``figures``: accuracy columns in [0, 1], the first "clean", the rest noise types; a value may
    be None (failed), and such a row is left out of every statistic involving that column.
    ``context``: what was swept, on which data, in a sentence (shown above the analysis).
    ``predictors``: columns of any real values (None: failed) that may predict the figures,
    such as the training-free proxies of a plan's ``[proxies]``; each is ranked against
    every figure.
    """

    rows: list[dict]
    dimensions: tuple[str, ...]
    figures: tuple[str, ...]
    context: str = ""
    predictors: tuple[str, ...] = ()


def tau_noise_level(n: int, z: float = 1.96) -> float:
    """The |Kendall tau| that ``n`` unrelated rankings exceed with probability 5% (``z`` = 1.96):
    ``z`` standard deviations of tau under independence, sqrt(2 (2n + 5) / (9 n (n - 1)))
    (Kendall 1938; the normal approximation)."""
    return z * math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1))) if n > 1 else math.inf


def noise_note(n: int) -> str:
    """What a rank correlation over ``n`` networks can tell apart from none."""
    level = tau_noise_level(n)
    if level >= 1:
        return f"With {n} networks, no Kendall tau is distinguishable from no correlation."
    return (f"With {n} networks, a Kendall tau within +-{level:.2f} is indistinguishable from no correlation "
            "(5% level); see each pair's p-value.")


def slug(name: str) -> str:
    """``"pgd eps=0.1"`` -> ``"pgd_eps_0_1"``."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _validate(table: Table) -> None:
    if not table.rows:
        raise ValueError("the table has no rows")
    if len(table.rows) < 2:
        raise ValueError(f"the table has {len(table.rows)} row; correlations need at least 2")
    if not table.figures or table.figures[0] != "clean":
        raise ValueError(f"figures must start with 'clean', got {tuple(table.figures)}")
    slugs = [slug(f) for f in table.figures]
    if "" in slugs or len(set(slugs)) < len(slugs):
        raise ValueError(f"figure names must have distinct, non-empty slugs, got {slugs}")
    for i, row in enumerate(table.rows):
        arch = row.get("arch_id", f"<row {i}>")
        for column in ("arch_id", *COSTS, *table.dimensions, *table.figures, *table.predictors):
            if column not in row:
                raise ValueError(f"column {column!r} is missing from network {arch!r}")
        for column in table.figures:
            value = row[column]
            if value is not None and not (isinstance(value, numbers.Real) and 0 <= value <= 1):
                raise ValueError(f"figure {column!r} of network {arch!r} is {value!r}, "
                                 "not None or a number in [0, 1]")
        for column in table.predictors:
            value = row[column]
            if value is not None and not (isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ValueError(f"predictor {column!r} of network {arch!r} is {value!r}, not None or a finite number")
        for column in table.dimensions:
            if not isinstance(row[column], (numbers.Real, str)):
                raise TypeError(f"dimension {column!r} of network {arch!r} is {row[column]!r}, "
                                "not a number or a string")


def _pairs(table: Table, a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    """Columns ``a`` and ``b`` over the rows where neither is None."""
    kept = [(r[a], r[b]) for r in table.rows if r[a] is not None and r[b] is not None]
    x, y = np.array(kept, dtype=float).reshape(-1, 2).T
    return x, y


def _ranks(x: np.ndarray, y: np.ndarray) -> dict:
    """Kendall's tau-b and Spearman's rho with p-values; NaN where undefined."""
    if len(x) < 2:
        return {"kendall_tau": math.nan, "kendall_p": math.nan,
                "spearman_rho": math.nan, "spearman_p": math.nan}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        tau, rho = stats.kendalltau(x, y), stats.spearmanr(x, y)
    return {"kendall_tau": float(tau.statistic), "kendall_p": float(tau.pvalue),
            "spearman_rho": float(rho.statistic), "spearman_p": float(rho.pvalue)}


def rank_correlations(table: Table) -> list[dict]:
    """Kendall's tau-b and Spearman's rho between every pair of figures (in ``figures`` order):
    keys "a", "b", "n", "kendall_tau", "kendall_p", "spearman_rho", "spearman_p"."""
    _validate(table)
    out = []
    for a, b in itertools.combinations(table.figures, 2):
        x, y = _pairs(table, a, b)
        out.append({"a": a, "b": b, "n": len(x), **_ranks(x, y)})
    return out


def predictor_ranking(table: Table) -> list[dict]:
    """Kendall's tau-b (and Spearman's rho) of every predictor against every figure, over the
    networks where both are defined, as Jung et al. (ICLR 2023) rank robustness proxies
    against robust accuracy: keys "predictor", "figure", "n", "kendall_tau", "kendall_p",
    "spearman_rho", "spearman_p". A proxy where lower means more robust (the Jacobian norm)
    predicts well with a tau near -1."""
    _validate(table)
    out = []
    for predictor in table.predictors:
        for figure in table.figures:
            x, y = _pairs(table, predictor, figure)
            out.append({"predictor": predictor, "figure": figure, "n": len(x), **_ranks(x, y)})
    return out


def cost_relation(table: Table) -> list[dict]:
    """Kendall's tau and Spearman's rho of each figure against each cost ("flops", "params"):
    keys "figure", "cost", "n", "kendall_tau", "spearman_rho"."""
    _validate(table)
    out = []
    for figure, cost in itertools.product(table.figures, COSTS):
        x, y = _pairs(table, figure, cost)
        ranks = _ranks(x, y)
        out.append({"figure": figure, "cost": cost, "n": len(x),
                    "kendall_tau": ranks["kendall_tau"], "spearman_rho": ranks["spearman_rho"]})
    return out


def pareto_front(clean, robust) -> np.ndarray:
    """Ascending indices of the points not dominated when both coordinates are maximised
    (duplicated points are all kept); O(n log n)."""
    clean, robust = np.asarray(clean, dtype=float), np.asarray(robust, dtype=float)
    if clean.ndim != 1 or clean.shape != robust.shape:
        raise ValueError(f"clean and robust must be 1-D of one length, got {clean.shape} "
                         f"and {robust.shape}")
    if clean.size == 0:
        return np.zeros(0, dtype=np.intp)
    order = np.lexsort((-robust, -clean))  # clean descending, then robust descending
    c, r = clean[order], robust[order]
    new = np.r_[True, c[1:] != c[:-1]]  # the first point of each clean value
    group = np.cumsum(new) - 1
    best = r[new]  # the highest robust value of each clean value
    before = np.r_[-np.inf, np.maximum.accumulate(best)[:-1]]  # the best of any higher clean
    keep = (r == best[group]) & (r > before[group])
    return np.sort(order[keep])


def _sort_key(value):
    return (isinstance(value, str), value)


def dimension_effects(table: Table) -> list[dict]:
    """Per dimension, value (sorted) and figure: the figure's "n", "mean", "std" (ddof=0), "min"
    and "max" over the networks with that value (NaN where there are none)."""
    _validate(table)
    out = []
    for dimension in table.dimensions:
        for value in sorted({r[dimension] for r in table.rows}, key=_sort_key):
            rows = [r for r in table.rows if r[dimension] == value]
            for figure in table.figures:
                v = np.array([r[figure] for r in rows if r[figure] is not None], dtype=float)
                moments = (v.mean(), v.std(), v.min(), v.max()) if len(v) else (math.nan,) * 4
                out.append({"dimension": dimension, "value": value, "figure": figure, "n": len(v),
                            **dict(zip(("mean", "std", "min", "max"), map(float, moments)))})
    return out


def _cell(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def _write_csv(path: pathlib.Path, rows: list[dict], fields: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: _cell(row[k]) for k in fields} for row in rows)


def _grid(n: int, width: float = 4.0, height: float = 3.2):
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def plot_costs(table: Table, cost: str, path: pathlib.Path) -> None:
    """Saves to ``path`` each figure of every network against its ``cost`` (log scale)."""
    fig, axes = _grid(len(table.figures))
    for ax, figure in zip(axes, table.figures):
        y, x = _pairs(table, figure, cost)
        ax.scatter(x, y, s=14, alpha=0.7)
        ax.set(xscale="log", xlabel=cost, ylabel="accuracy", title=figure, ylim=(-0.02, 1.02))
        ax.tick_params(axis="x", which="both", labelrotation=30, labelsize="small")  # minor labels of a short range
    fig.savefig(path, dpi=100)


def plot_correlations(table: Table, correlations: list[dict], path: pathlib.Path) -> None:
    """Saves to ``path`` the Kendall tau matrix of ``correlations`` (:func:`rank_correlations`)."""
    k = len(table.figures)
    tau = np.eye(k)
    index = {f: i for i, f in enumerate(table.figures)}
    for c in correlations:
        tau[index[c["a"]], index[c["b"]]] = tau[index[c["b"]], index[c["a"]]] = c["kendall_tau"]
    fig = Figure(figsize=(1.2 * k + 2.5, 1.0 * k + 1.5), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(tau, cmap="RdBu_r", vmin=-1, vmax=1)
    for (i, j), value in np.ndenumerate(tau):
        ax.text(j, i, "-" if math.isnan(value) else f"{value:.2f}", ha="center", va="center",
                color="white" if abs(value) > 0.5 else "black")
    ax.set_xticks(range(k), table.figures, rotation=45, ha="right")
    ax.set_yticks(range(k), table.figures)
    ax.set_title("Kendall tau between figures")
    fig.colorbar(image, ax=ax)
    fig.savefig(path, dpi=100)


def _plot_dimensions(table: Table, effects: list[dict], path: pathlib.Path) -> None:
    """Each figure's mean and std per value of each dimension; numeric values are joined by
    lines, categorical ones (an NB201 edge's ops) are not, and each figure is shifted a little
    so that their error bars stay apart."""
    fig, axes = _grid(max(len(table.dimensions), 1))
    for ax, dimension in zip(axes, table.dimensions):
        for i, figure in enumerate(table.figures):
            rows = [e for e in effects if e["dimension"] == dimension and e["figure"] == figure]
            categorical = any(isinstance(e["value"], str) for e in rows)
            shift = 0.3 * (i / max(len(table.figures) - 1, 1) - 0.5)
            ax.errorbar(np.arange(len(rows)) + shift, [e["mean"] for e in rows], [e["std"] for e in rows],
                        marker="o", capsize=3, label=figure, linestyle="none" if categorical else "-")
        ax.set_xticks(range(len(rows)), [str(e["value"]) for e in rows], rotation=30, ha="right")
        ax.set(xlabel=dimension, ylabel="accuracy (mean +- std)", ylim=(-0.02, 1.02))
    if table.dimensions:
        axes[0].legend(fontsize="small")
    fig.savefig(path, dpi=100)


def _plot_pareto(clean: np.ndarray, robust: np.ndarray, front: np.ndarray, names: list[str], figure: str,
                 path: pathlib.Path) -> None:
    """The networks and the Pareto front, each front point labelled with its networks' ids (one
    point may stand for several networks with equal figures)."""
    fig = Figure(figsize=(5, 4), layout="constrained")
    ax = fig.subplots()
    ax.scatter(clean, robust, s=14, color="0.6", label="networks")
    order = front[np.argsort(clean[front], kind="stable")]
    ax.plot(clean[order], robust[order], "o-", color="C3", label=f"Pareto front ({len(front)} networks)")
    points: dict[tuple[float, float], list[str]] = {}
    for i in order:
        points.setdefault((clean[i], robust[i]), []).append(names[i])
    for (x, y), ids in points.items():
        ax.annotate(", ".join(ids[:3]) + (f" +{len(ids) - 3}" if len(ids) > 3 else ""), (x, y),
                    textcoords="offset points", xytext=(4, 4), fontsize="x-small")
    ax.set(xlabel="clean", ylabel=figure, title=f"clean vs {figure}")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.4f}"


def _summary(table: Table, correlations: list[dict], effects: list[dict],
             fronts: dict[str, list[str]], ranking: list[dict]) -> str:
    counts = (f"{len(table.rows)} networks, {len(table.dimensions)} search dimensions, "
              f"{len(table.figures)} figures.")
    lines = ["# Sweep analysis", "", *([table.context, ""] if table.context else []), counts, "",
             "| figure | n | mean | min | max | best network |", "|---|---|---|---|---|---|"]
    for figure in table.figures:
        rows = [r for r in table.rows if r[figure] is not None]
        v = np.array([r[figure] for r in rows], dtype=float)
        if not len(v):
            lines.append(f"| {figure} | 0 | - | - | - | - |")
            continue
        best = rows[int(np.argmax(v))]
        lines.append(f"| {figure} | {len(v)} | {_fmt(v.mean())} | {_fmt(v.min())} | "
                     f"{_fmt(v.max())} | {best['arch_id']} ({_fmt(best[figure])}) |")
    defined = [c for c in correlations if not math.isnan(c["kendall_tau"])]
    if defined:
        high = max(defined, key=lambda c: c["kendall_tau"])
        low = min(defined, key=lambda c: c["kendall_tau"])
        lines += ["", "## Correlations (Kendall tau)", "", noise_note(len(table.rows)), "",
                  f"- strongest: {high['a']} / {high['b']}: {_fmt(high['kendall_tau'])}",
                  f"- weakest: {low['a']} / {low['b']}: {_fmt(low['kendall_tau'])}"]
    if defined_ranking := [r for r in ranking if not math.isnan(r["kendall_tau"])]:
        lines += ["", "## Training-free proxies (Kendall tau against each figure)", "", noise_note(len(table.rows)),
                  "", "| figure | best proxy | tau |", "|---|---|---|"]
        for figure in table.figures:
            of_figure = [r for r in defined_ranking if r["figure"] == figure]
            if of_figure:
                best = max(of_figure, key=lambda r: abs(r["kendall_tau"]))
                lines.append(f"| {figure} | {best['predictor']} | {_fmt(best['kendall_tau'])} |")
    if len(table.figures) > 1 and table.dimensions:
        robust = table.figures[1]

        def spread(dimension: str) -> float:
            means = [e["mean"] for e in effects if e["dimension"] == dimension
                     and e["figure"] == robust and not math.isnan(e["mean"])]
            return max(means) - min(means) if means else -math.inf

        top = max(table.dimensions, key=spread)
        lines += ["", "## Search dimensions", "",
                  f"- {top} moves {robust} most: its values' means span {_fmt(spread(top))}"]
    if fronts:
        lines += ["", "## Pareto fronts (clean vs robust)", ""]
        for figure, members in fronts.items():
            shown = ", ".join(members[:10]) + (f", ... ({len(members) - 10} more)"
                                               if len(members) > 10 else "")
            lines.append(f"- {figure}: size {len(members)}: {shown}")
    return "\n".join(lines) + "\n"


def analyze(table: Table, out: str | pathlib.Path) -> dict:
    """Writes the CSV tables, the plots and ``summary.md`` into folder ``out`` (created if
    missing). Returns ``{"files": sorted relative names, "networks": number of rows}``.

    Raises ValueError for a table without at least 2 rows, a column missing from a row, a figure
    value outside [0, 1], or figures that do not start with "clean" (TypeError for a dimension
    value that is neither a number nor a string)."""
    _validate(table)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    correlations, costs = rank_correlations(table), cost_relation(table)
    effects, ranking = dimension_effects(table), predictor_ranking(table)
    _write_csv(out / "correlations.csv", correlations,
               ["a", "b", "n", "kendall_tau", "kendall_p", "spearman_rho", "spearman_p"])
    _write_csv(out / "cost_correlations.csv", costs,
               ["figure", "cost", "n", "kendall_tau", "spearman_rho"])
    _write_csv(out / "dimension_effects.csv", effects,
               ["dimension", "value", "figure", "n", "mean", "std", "min", "max"])
    files = ["correlations.csv", "cost_correlations.csv", "dimension_effects.csv",
             "correlations.png", "dimensions.png", "summary.md"]
    if table.predictors:
        _write_csv(out / "proxy_ranking.csv", ranking,
                   ["predictor", "figure", "n", "kendall_tau", "kendall_p", "spearman_rho", "spearman_p"])
        files.append("proxy_ranking.csv")
    fronts = {}
    for figure in table.figures[1:]:
        rows = [r for r in table.rows if r["clean"] is not None and r[figure] is not None]
        clean = np.array([r["clean"] for r in rows], dtype=float)
        robust = np.array([r[figure] for r in rows], dtype=float)
        front = pareto_front(clean, robust)
        front_rows = [rows[i] for i in sorted(front, key=lambda i: (-clean[i], i))]
        fronts[figure] = [r["arch_id"] for r in front_rows]
        name = f"pareto_{slug(figure)}"
        _write_csv(out / f"{name}.csv", front_rows, ["arch_id", "params", "flops", "clean", figure])
        _plot_pareto(clean, robust, front, [r["arch_id"] for r in rows], figure, out / f"{name}.png")
        files += [f"{name}.csv", f"{name}.png"]
    for cost in COSTS:
        plot_costs(table, cost, out / f"scatter_{cost}.png")
        files.append(f"scatter_{cost}.png")
    plot_correlations(table, correlations, out / "correlations.png")
    _plot_dimensions(table, effects, out / "dimensions.png")
    (out / "summary.md").write_text(_summary(table, correlations, effects, fronts, ranking))
    return {"files": sorted(files), "networks": len(table.rows)}
