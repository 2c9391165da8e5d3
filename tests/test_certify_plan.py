"""[certify] and [proxies] in plans: certified items in robustjax evaluate's report (the
interval between certified and attacked robust accuracy) and in sweeps' exports, the
proxies' section; bad tables refused."""

import jax
import jsonschema
import numpy as np
import pytest

import robustjax as rj
from robustjax import certify
from robustjax.evaluation import plan_from_dict
from robustjax.evaluation.items import SMOOTHING_STREAM
from robustjax.metrics import proxies
from robustjax.report import html, schema
from robustjax.sweep import Sweep, export, open_store, run_local
from robustjax.sweep.store import worker_id

PLAN = {"batch_size": 8, "num_examples": 16, "seed": 3,
        "attacks": [{"name": "pgd", "eps": [0.01, 0.05], "steps": 10}, {"name": "pgd", "norm": "l2", "eps": 0.3,
                                                                        "steps": 10}],
        "certify": {"bounds": ["ibp", "crown"], "sigma": 0.25, "n0": 20, "n": 200, "radii": [0.0, 0.2]},
        "proxies": {"names": ["jacobian_norm", "ntk_condition_number"]}}


def test_evaluate_reports_the_bounds_of_the_library_and_the_interval_they_make_with_the_attacks():
    clf = rj.zoo.create("digits_mlp")
    dataset = rj.data.digits("test")
    x, y = dataset.arrays(limit=16)
    report = rj.evaluation.evaluate(clf, dataset, plan_from_dict(PLAN))
    jsonschema.validate(report, schema())
    section = report["certified"]
    assert section["status"] == "ok" and report["status"] == "complete"

    verified = {}
    for entry in section["bounds"]:
        mask = np.asarray(certify.verified(clf, x, y, entry["eps"], method=entry["method"], norm=entry["norm"]))
        verified.setdefault((entry["norm"], entry["eps"]), []).append(mask)
        assert entry["verified_accuracy"] == pytest.approx(mask.mean())
    assert {entry["norm"] for entry in section["bounds"]} == {"linf", "l2"}
    attacked = {(entry["params"]["norm"], entry["params"]["eps"]): entry["robust_accuracy"]
                for entry in report["attacks"]}
    for interval in section["intervals"]:
        budget = (interval["norm"], interval["eps"])
        either = np.logical_or.reduce(verified[budget])
        assert interval["certified"] == pytest.approx(either.mean())
        assert interval["attacked"] == attacked[budget]
        assert interval["certified"] <= interval["attacked"] and interval["contradictions"] == 0
        assert interval["width"] == pytest.approx(interval["attacked"] - interval["certified"])
    # the bounds differ and the interval is not trivial, so the checks above can tell them apart
    assert len({e["verified_accuracy"] for e in section["bounds"]}) > 1
    assert 0 < section["intervals"][1]["certified"] < section["intervals"][1]["attacked"]

    radii = PLAN["certify"]["radii"]
    expected = []
    for batch in range(2):  # the documented keys: fold_in(fold_in(key(seed), stream), batch)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(3), SMOOTHING_STREAM), batch)
        part = slice(8 * batch, 8 * batch + 8)
        result = certify.certify(clf, x[part], sigma=0.25, n0=20, n=200, key=key)
        expected.append((result.prediction == y[part])[None] & (result.radius[None] >= np.array(radii)[:, None]))
    expected = np.concatenate(expected, axis=1).mean(axis=1)
    assert [r["certified_accuracy"] for r in section["smoothing"]["results"]] == pytest.approx(expected)
    assert expected[0] > expected[1]

    page = html.render_html(report)
    assert "Certified robust accuracy" in page and "certified (best bound)" in page

    jacobian, ntk = report["proxies"]["results"]
    assert jacobian["mean"] == pytest.approx(float(proxies.jacobian_norm(clf, x).mean()), rel=1e-5)
    batches = [float(proxies.ntk_condition_number(clf, x[part])) for part in (slice(0, 8), slice(8, 16))]
    assert ntk["mean"] == pytest.approx(np.mean(batches), rel=1e-4)


def test_a_sweep_exports_the_certified_columns_each_network_gets_alone(tmp_path):
    plan = plan_from_dict({"batch_size": 8, "num_examples": 8, "certify": {"bounds": ["crown-ibp"], "eps": [0.01]}})
    sweep = Sweep(plan, models=("digits_mlp", "digits_cnn"))
    store, ids = open_store(sweep, str(tmp_path / "s.sqlite"), sweep.models)
    run_local(sweep, store, ids, worker=worker_id())
    rows = {row["arch_id"]: row for row in export.table(store).rows}
    x, y = rj.data.digits("test").arrays(limit=8)
    for name in sweep.models:
        alone = np.asarray(certify.verified(rj.zoo.create(name), x, y, 0.01, method="crown-ibp")).mean()
        assert rows[name]["crown-ibp eps=0.01"] == pytest.approx(alone)
    assert {rows[name]["crown-ibp eps=0.01"] for name in sweep.models} != {0.0}


@pytest.mark.parametrize("table, message", [
    ({"sigma": 0.0, "bounds": []}, "certify.sigma must be a number > 0"),
    ({"sigma": -1, "bounds": []}, "certify.sigma must be a number > 0"),
    ({"sigma": 0.25, "n0": 200, "n": 100, "bounds": []}, "n0=200 selection draws exceed n=100"),
    ({"sigma": 0.25, "alpha": 1.0, "bounds": []}, r"certify.alpha must be in \(0, 1\)"),
    ({"sigma": 0.25, "alpha": 0, "bounds": []}, r"certify.alpha must be in \(0, 1\)"),
    ({"eps": [1.0]}, r"certify.eps must be numbers in \[0, 1\) \(eps >= 1 covers the whole image box"),
    ({"bounds": ["lp"], "eps": [0.1]}, "certify.bounds must be one of"),
    ({"bounds": ["crown"]}, r"certify.bounds need an eps: set certify.eps \(or l2_eps\)"),
    ({"l2_eps": [-1]}, "certify.l2_eps must be numbers >= 0"),
    ({"bounds": []}, r"\[certify\] certifies nothing"),
    ({"sigmas": 0.25}, "did you mean 'sigma'"),
    ({"sigma": 0.25, "radii": [-0.5], "bounds": []}, "certify.radii must be numbers >= 0"),
])
def test_bad_certify_tables_are_refused_with_one_clear_line(table, message):
    with pytest.raises(ValueError, match=message):
        plan_from_dict({"certify": table})


def test_bounds_in_bfloat16_are_refused_as_unsound():
    with pytest.raises(ValueError, match="certify.bounds need precision"):
        plan_from_dict({"precision": "bfloat16", "certify": {"eps": [0.1]}})


def test_the_bounds_default_to_the_eps_of_the_attacks_in_each_norm():
    plan = plan_from_dict({"attacks": [{"name": "pgd", "eps": [0.1, 0.03]}, {"name": "fgsm", "eps": 0.1},
                                       {"name": "pgd", "norm": "l2", "eps": 0.5}], "certify": {}})
    assert plan.certify_eps() == {"linf": (0.03, 0.1), "l2": (0.5,)}
    assert [item.labels for item in rj.evaluation.items.certify_items(plan)] == [
        ("crown eps=0.03", "crown eps=0.1"), ("crown l2 eps=0.5",)]
