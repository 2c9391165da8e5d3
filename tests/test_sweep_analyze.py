"""Sweep analysis: rank correlations, Pareto fronts, dimension effects and the written files."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math

import numpy as np
import pytest
from matplotlib.figure import Figure
from scipy import stats

from robustjax.sweep import analyze as analysis
from robustjax.sweep.analyze import (
    Table,
    analyze,
    cost_relation,
    dimension_effects,
    noise_note,
    pareto_front,
    rank_correlations,
    slug,
    tau_noise_level,
)

FIGURES = ("clean", "pgd eps=0.1", "gaussian_noise 3")
DIMENSIONS = ("depth_1", "edge_2<-0")
# arch_id, params, flops, depth_1, edge_2<-0, clean, pgd eps=0.1, gaussian_noise 3
# (ties within each column; n07 is the most accurate network, n11 has the highest PGD accuracy)
NETWORKS = [
    ("n00", 1_000, 20_000, 1, "conv3x3", 0.90, 0.30, 0.70),
    ("n01", 2_000, 40_000, 1, "skip", 0.85, 0.30, 0.65),
    ("n02", 3_000, 60_000, 2, "conv3x3", 0.92, 0.25, 0.70),
    ("n03", 1_500, 30_000, 2, "none", 0.70, 0.10, 0.40),
    ("n04", 5_000, 90_000, 3, "conv3x3", 0.95, 0.35, 0.80),
    ("n05", 4_000, 80_000, 3, "skip", 0.90, 0.35, 0.75),
    ("n06", 2_500, 50_000, 1, "none", 0.60, 0.05, 0.40),
    ("n07", 6_000, 120_000, 3, "conv3x3", 0.97, 0.20, 0.85),
    ("n08", 3_500, 70_000, 2, "skip", 0.88, 0.40, 0.60),
    ("n09", 800, 10_000, 1, "conv3x3", 0.80, 0.15, 0.55),
    ("n10", 4_500, 85_000, 2, "none", 0.75, 0.25, 0.50),
    ("n11", 5_500, 100_000, 3, "skip", 0.93, 0.45, 0.80),
]
COLUMNS = ("arch_id", "params", "flops", *DIMENSIONS, *FIGURES)


def make_table(networks=NETWORKS) -> Table:
    return Table(rows=[dict(zip(COLUMNS, n)) for n in networks], dimensions=DIMENSIONS,
                 figures=FIGURES, context="Swept: models a, b; each network on 64 examples of digits.")


def with_none(table: Table, arch_id: str, figure: str) -> Table:
    rows = [dict(r, **{figure: None}) if r["arch_id"] == arch_id else dict(r) for r in table.rows]
    return dataclasses.replace(table, rows=rows)


def brute_kendall_tau_b(x, y) -> float:
    s = pairs_x = pairs_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        s += dx * dy  # concordant minus discordant
        pairs_x += dx != 0  # pairs not tied in x
        pairs_y += dy != 0
    return s / math.sqrt(pairs_x * pairs_y)


def brute_spearman_rho(x, y) -> float:
    def average_ranks(v):
        return np.array([1 + sum(w < u for w in v) + (sum(w == u for w in v) - 1) / 2 for u in v])

    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float(rx @ ry / math.sqrt((rx @ rx) * (ry @ ry)))


def brute_pareto(clean, robust) -> np.ndarray:
    n = len(clean)
    dominated = [any(clean[j] >= clean[i] and robust[j] >= robust[i]
                     and (clean[j] > clean[i] or robust[j] > robust[i]) for j in range(n))
                 for i in range(n)]
    return np.flatnonzero(~np.array(dominated, dtype=bool))


def column(table: Table, name: str) -> list:
    return [r[name] for r in table.rows]


def test_rank_correlations_match_scipy_and_brute_force():
    table = make_table()
    result = rank_correlations(table)
    assert [(c["a"], c["b"]) for c in result] == list(itertools.combinations(FIGURES, 2))
    for c in result:
        x, y = column(table, c["a"]), column(table, c["b"])
        assert c["n"] == 12
        tau, rho = stats.kendalltau(x, y), stats.spearmanr(x, y)
        assert c["kendall_tau"] == pytest.approx(tau.statistic, abs=1e-12)
        assert c["kendall_p"] == pytest.approx(tau.pvalue, abs=1e-12)
        assert c["spearman_rho"] == pytest.approx(rho.statistic, abs=1e-12)
        assert c["spearman_p"] == pytest.approx(rho.pvalue, abs=1e-12)
        assert c["kendall_tau"] == pytest.approx(brute_kendall_tau_b(x, y), abs=1e-12)
        assert c["spearman_rho"] == pytest.approx(brute_spearman_rho(x, y), abs=1e-12)
        assert 0.2 < c["kendall_tau"] < 1  # positively, not perfectly, related in this table


def test_cost_relation_matches_scipy():
    table = make_table()
    result = cost_relation(table)
    assert [(c["figure"], c["cost"]) for c in result] == [
        (f, cost) for f in FIGURES for cost in ("flops", "params")]
    for c in result:
        x, y = column(table, c["figure"]), column(table, c["cost"])
        assert c["n"] == 12
        assert c["kendall_tau"] == pytest.approx(brute_kendall_tau_b(x, y), abs=1e-12)
        assert c["spearman_rho"] == pytest.approx(brute_spearman_rho(x, y), abs=1e-12)


def test_constant_figure_gives_nan():
    table = make_table()
    rows = [dict(r, **{"gaussian_noise 3": 0.5}) for r in table.rows]
    result = rank_correlations(dataclasses.replace(table, rows=rows))
    constant = [c for c in result if "gaussian_noise 3" in (c["a"], c["b"])]
    assert len(constant) == 2 and all(math.isnan(c["kendall_tau"]) for c in constant)
    assert all(math.isnan(c["spearman_rho"]) for c in constant)
    assert not math.isnan(result[0]["kendall_tau"])  # clean / pgd is still defined


def test_pareto_front_hand_case():
    clean = [0.9, 0.8, 0.9, 0.7, 0.95, 0.8, 0.6, 0.95]
    robust = [0.3, 0.5, 0.3, 0.6, 0.1, 0.4, 0.6, 0.1]
    # 0 and 2 duplicate (kept), 4 and 7 duplicate (kept), 5 is dominated by 1, 6 by 3
    np.testing.assert_array_equal(pareto_front(clean, robust), [0, 1, 2, 3, 4, 7])
    np.testing.assert_array_equal(pareto_front([], []), [])
    np.testing.assert_array_equal(pareto_front([0.5], [0.5]), [0])


@pytest.mark.parametrize("seed", range(6))
def test_pareto_front_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    levels = int(rng.integers(2, 12))  # few distinct values: many ties and duplicates
    clean = rng.integers(0, levels, n) / levels
    robust = rng.integers(0, levels, n) / levels
    if seed % 2:  # anti-correlated: long fronts
        robust = np.round(1 - clean + rng.integers(-1, 2, n) / levels, 6)
    front = pareto_front(clean, robust)
    np.testing.assert_array_equal(front, brute_pareto(clean, robust))
    assert front.dtype.kind == "i" and len(front) >= 1


def test_pareto_front_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="1-D of one length"):
        pareto_front([0.1, 0.2], [0.1])


def test_dimension_effects_by_hand():
    effects = dimension_effects(make_table())
    keys = [(e["dimension"], e["value"], e["figure"]) for e in effects]
    assert len(keys) == len(set(keys)) == (3 + 3) * len(FIGURES)
    assert [e["value"] for e in effects if e["dimension"] == "edge_2<-0"][::3] == [
        "conv3x3", "none", "skip"]
    # depth_1 == 3: n04, n05, n07, n11
    pgd = [0.35, 0.35, 0.20, 0.45]
    (e,) = [e for e in effects if e["dimension"] == "depth_1" and e["value"] == 3
            and e["figure"] == "pgd eps=0.1"]
    mean = sum(pgd) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in pgd) / 4)
    assert e["n"] == 4
    assert e["mean"] == pytest.approx(mean, abs=1e-12)
    assert e["std"] == pytest.approx(std, abs=1e-12)
    assert (e["min"], e["max"]) == (0.20, 0.45)
    # every network with edge_2<-0 == none failed under PGD: that group has no statistics
    table = make_table()
    for arch_id in ("n03", "n06", "n10"):
        table = with_none(table, arch_id, "pgd eps=0.1")
    (e,) = [e for e in dimension_effects(table) if e["dimension"] == "edge_2<-0" and e["value"] == "none"
            and e["figure"] == "pgd eps=0.1"]
    assert e["n"] == 0 and all(math.isnan(e[k]) for k in ("mean", "std", "min", "max"))


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_slug():
    assert slug("pgd eps=0.1") == "pgd_eps_0_1"
    assert slug("  Gaussian-Noise (3) ") == "gaussian_noise_3"


def test_analyze_writes_every_file(tmp_path):
    table = with_none(make_table(), "n11", "pgd eps=0.1")  # n11 failed under PGD
    result = analyze(table, tmp_path / "out")
    expected = sorted([
        "correlations.csv", "cost_correlations.csv", "dimension_effects.csv",
        "pareto_pgd_eps_0_1.csv", "pareto_gaussian_noise_3.csv",
        "scatter_flops.png", "scatter_params.png", "correlations.png", "dimensions.png",
        "pareto_pgd_eps_0_1.png", "pareto_gaussian_noise_3.png", "summary.md"])
    assert result == {"files": expected, "networks": 12}
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == expected
    for name in expected:
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

    # the None is left out of every statistic involving PGD, and only those
    n = {(r["a"], r["b"]): int(r["n"]) for r in read_csv(out / "correlations.csv")}
    assert n == {("clean", "pgd eps=0.1"): 11, ("clean", "gaussian_noise 3"): 12,
                 ("pgd eps=0.1", "gaussian_noise 3"): 11}
    costs = {(r["figure"], r["cost"]): int(r["n"]) for r in read_csv(out / "cost_correlations.csv")}
    assert costs[("pgd eps=0.1", "flops")] == 11 and costs[("clean", "flops")] == 12
    effects = {(r["dimension"], r["value"], r["figure"]): r
               for r in read_csv(out / "dimension_effects.csv")}
    depth3 = effects[("depth_1", "3", "pgd eps=0.1")]
    assert int(depth3["n"]) == 3
    assert float(depth3["mean"]) == pytest.approx((0.35 + 0.35 + 0.20) / 3, abs=1e-12)
    assert int(effects[("depth_1", "3", "clean")]["n"]) == 4

    # Pareto fronts: brute force over the rows that have the figure, sorted by clean descending
    for figure in FIGURES[1:]:
        rows = [r for r in table.rows if r[figure] is not None]
        front = brute_pareto(column(dataclasses.replace(table, rows=rows), "clean"),
                             column(dataclasses.replace(table, rows=rows), figure))
        members = sorted((rows[i] for i in front), key=lambda r: -r["clean"])
        written = read_csv(out / f"pareto_{slug(figure)}.csv")
        assert list(written[0]) == ["arch_id", "params", "flops", "clean", figure]
        assert [r["arch_id"] for r in written] == [r["arch_id"] for r in members]
        assert [float(r[figure]) for r in written] == [r[figure] for r in members]
    pgd_front = [r["arch_id"] for r in read_csv(out / "pareto_pgd_eps_0_1.csv")]
    assert "n11" not in pgd_front and pgd_front == ["n07", "n04", "n08"]

    summary = (out / "summary.md").read_text()
    assert "12 networks" in summary and "Swept: models a, b; each network on 64 examples of digits." in summary
    assert noise_note(12) in summary
    assert "| clean | 12 | " in summary and "| n07 (0.9700) |" in summary  # best by clean
    assert "| pgd eps=0.1 | 11 | " in summary and "| n08 (0.4000) |" in summary  # n11 left out
    assert "- pgd eps=0.1: size 3: n07, n04, n08" in summary
    assert "- strongest: clean / gaussian_noise 3: " in summary
    assert "- weakest: clean / pgd eps=0.1: " in summary
    # means of PGD per edge value: conv3x3 0.25, none 0.1333, skip 0.35 (n11 left out): 0.2167;
    # per depth only 0.2, 0.25, 0.3
    assert "- edge_2<-0 moves pgd eps=0.1 most: its values' means span 0.2167" in summary


def test_analyze_writes_nan_as_empty(tmp_path):
    table = make_table()
    rows = [dict(r, **{"gaussian_noise 3": 0.5}) for r in table.rows]
    analyze(dataclasses.replace(table, rows=rows), tmp_path)
    written = read_csv(tmp_path / "correlations.csv")
    assert [r["kendall_tau"] for r in written if r["b"] == "gaussian_noise 3"] == ["", ""]
    assert written[0]["kendall_tau"] != ""


@pytest.mark.parametrize(("change", "match"), [
    (lambda t: dataclasses.replace(t, rows=[]), "no rows"),
    (lambda t: dataclasses.replace(t, rows=t.rows[:1]), "at least 2"),
    (lambda t: dataclasses.replace(t, figures=()), "start with 'clean'"),
    (lambda t: dataclasses.replace(t, figures=FIGURES[1:]), "start with 'clean'"),
    (lambda t: dataclasses.replace(
        t, rows=[{k: v for k, v in r.items() if not (k == "pgd eps=0.1" and r["arch_id"] == "n05")}
                 for r in t.rows]), "'pgd eps=0.1' is missing from network 'n05'"),
    (lambda t: dataclasses.replace(
        t, rows=[{k: v for k, v in r.items() if not (k == "edge_2<-0" and r["arch_id"] == "n03")}
                 for r in t.rows]), "'edge_2<-0' is missing from network 'n03'"),
    (lambda t: dataclasses.replace(
        t, rows=[{k: v for k, v in r.items() if k != "flops"} for r in t.rows]),
     "'flops' is missing from network 'n00'"),
    (lambda t: dataclasses.replace(t, rows=[dict(r, clean=90.0) for r in t.rows]),
     r"figure 'clean' of network 'n00' is 90.0, not None or a number in \[0, 1\]"),
    (lambda t: dataclasses.replace(t, figures=(*FIGURES, "pgd_eps=0.1")), "distinct"),
    (lambda t: dataclasses.replace(t, figures=(*FIGURES, "==")), "non-empty slugs"),
])
def test_analyze_rejects_bad_tables(tmp_path, change, match):
    table = change(make_table())
    with pytest.raises(ValueError, match=match):
        analyze(table, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written


def test_analyze_rejects_a_dimension_value_of_another_type(tmp_path):
    table = make_table()
    rows = [dict(r, depth_1=None) if r["arch_id"] == "n02" else r for r in table.rows]
    with pytest.raises(TypeError, match="dimension 'depth_1' of network 'n02' is None"):
        analyze(dataclasses.replace(table, rows=rows), tmp_path)


def test_the_tau_noise_level_is_the_spread_of_tau_over_every_ranking():
    """Under independence every ranking of n = 7 networks is equally likely: the level is 1.96
    standard deviations of tau over all 5,040 of them."""
    n = 7
    i, j = np.triu_indices(n, 1)
    taus = [np.sign(np.subtract(p[j], p[i])).mean() for p in map(np.array, itertools.permutations(range(n)))]
    assert tau_noise_level(n) == pytest.approx(1.96 * np.std(taus), rel=1e-12)
    assert "within +-0.57 " in noise_note(8) and "no Kendall tau" in noise_note(3)


def captured_figures(monkeypatch) -> list[Figure]:
    figures: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: figures.append(self))
    return figures


def test_the_pareto_plot_counts_and_names_networks_that_share_a_point(monkeypatch):
    figures = captured_figures(monkeypatch)
    clean, robust = np.array([0.9, 0.9, 0.8, 0.5]), np.array([0.3, 0.3, 0.4, 0.1])
    front = pareto_front(clean, robust)
    analysis._plot_pareto(clean, robust, front, ["a", "b", "c", "d"], "pgd", None)
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["networks", "Pareto front (3 networks)"]
    assert sorted(t.get_text() for t in ax.texts) == ["a, b", "c"]


def test_categorical_dimensions_are_not_joined_by_lines(monkeypatch):
    figures = captured_figures(monkeypatch)
    table = make_table()
    analysis._plot_dimensions(table, dimension_effects(table), None)
    depth, edge = figures[0].axes[:2]
    assert {bars.lines[0].get_linestyle() for bars in depth.containers} == {"-"}  # the data line of each
    assert {bars.lines[0].get_linestyle() for bars in edge.containers} == {"None"}
