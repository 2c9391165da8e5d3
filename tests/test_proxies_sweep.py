"""[proxies] in sweeps: each network of a population gets the proxies it gets alone, the export
keeps them as predictors, and sweep analyze ranks them against every robust figure."""

import jax
import numpy as np
import pytest
from scipy import stats

from robustjax.evaluation import plan_from_dict
from robustjax.evaluation.items import PROXY_STREAM
from robustjax.metrics import proxies
from robustjax.sweep import Sweep, analyze, engine, export, open_store, run_local
from robustjax.sweep.store import worker_id

PLAN = plan_from_dict({"batch_size": 8, "num_examples": 12, "seed": 2,
                       "attacks": [{"name": "fgsm", "eps": 0.1}], "proxies": {"iterations": 3}})


def test_population_proxies_equal_each_network_alone_and_the_analysis_ranks_them(tmp_path):
    sweep = Sweep(PLAN, space="nb201_digits", population_size=4, calibration_images=64)
    archs = [11472, 0, 9, 1200]  # one population of 4
    store, ids = open_store(sweep, str(tmp_path / "s.sqlite"), archs)
    run_local(sweep, store, ids, worker=worker_id())
    table = export.table(store)
    names = ("jacobian_norm", "hessian_eigenvalue", "ntk_condition_number")
    assert table.predictors == tuple(f"proxy {n}" for n in names)
    assert not set(table.predictors) & set(table.figures)

    context = engine.context(sweep)
    x, y = context.dataset.arrays(limit=12)
    for arch, row in zip(archs, table.rows):
        network = context.supernet.subnet(context.space.resolve(arch), calibration=context.calibration)
        expected = {"jacobian_norm": [], "hessian_eigenvalue": [], "ntk_condition_number": []}
        for b, part in enumerate((slice(0, 8), slice(8, 12))):
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(2), PROXY_STREAM), b)
            expected["jacobian_norm"] += list(np.asarray(proxies.jacobian_norm(network, x[part])))
            expected["hessian_eigenvalue"] += list(np.asarray(
                proxies.hessian_eigenvalue(network, x[part], y[part], key=key, iterations=3)))
            expected["ntk_condition_number"] += [float(proxies.ntk_condition_number(network, x[part]))] * len(
                range(12)[part])
        for name in names:
            assert row[f"proxy {name}"] == pytest.approx(np.mean(expected[name]), rel=1e-4)

    result = analyze.analyze(table, tmp_path / "analysis")
    assert "proxy_ranking.csv" in result["files"]
    ranking = analyze.predictor_ranking(table)
    assert {(r["predictor"], r["figure"]) for r in ranking} == {(p, f) for p in table.predictors for f in table.figures}
    jacobian = next(r for r in ranking if r["predictor"] == "proxy jacobian_norm" and r["figure"] == "clean")
    clean = [row["clean"] for row in table.rows]
    norms = [row["proxy jacobian_norm"] for row in table.rows]
    assert jacobian["kendall_tau"] == pytest.approx(stats.kendalltau(norms, clean).statistic)
    assert "Training-free proxies" in (tmp_path / "analysis" / "summary.md").read_text()
