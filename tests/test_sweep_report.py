"""A sweep runs every section robustjax evaluate runs: the 23 metrics, the sanity checks and
natural shift run per network (the ``report`` item) through evaluate's own runner, so each
network's stored report equals robustjax evaluate of that network alone, figure for figure;
export gives their figures as columns, and `robustjax report --db DB --arch ID` renders the
network's report.json and report.html from the sweep's records."""

import json

import numpy as np
import pytest

import robustjax as rj
from robustjax.cli import main
from robustjax.evaluation import evaluate
from robustjax.evaluation.items import REPORT, report_plan
from robustjax.evaluation.plan import load_plan, plan_from_dict
from robustjax.sweep import Sweep, engine, export, open_store, run_local
from robustjax.sweep.store import worker_id

ARCHS = [11472, 0]  # NB201 digits cells: resnet-like and all-none (each cell compiles its own programs)


def _plan():
    """The digits plan's sections (FGSM and PGD, the corruptions, the 23 metrics with
    digits_mlp as reference) on 32 examples, with fewer epsilons, PGD steps, corruptions and
    boundary probes, and the sanity checks on, on 8 examples: each NB201 cell compiles its
    own programs (the metrics read its own neurons), and on the CPU a loop's steps unroll."""
    raw = {"batch_size": 16, "num_examples": 32, "seed": 0,
           "attacks": [{"name": "fgsm", "eps": 0.1}, {"name": "pgd", "norm": "linf", "eps": [0.1, 0.2], "steps": 2}],
           "corruptions": {"names": ["brightness"], "severities": [3], "baseline": "reference"},
           "metrics": {"attack": {"name": "pgd", "norm": "linf", "eps": 0.1, "steps": 2}, "reference": "digits_mlp",
                       "rgb_sigma": 0.5, "ebd_directions": 8, "ebd2_step": 0.05, "ebd2_max_steps": 10},
           "sanity": {"enabled": True, "num_examples": 8, "steps": 2, "restarts": 2, "grid": 2}}
    digits = load_plan("digits")
    assert [run.attack.name for run in digits.runs] == ["fgsm", "pgd"] and digits.metrics.reference == "digits_mlp"
    return plan_from_dict(raw)


def figures(report):
    """The report without what differs between two identical runs: timing, timestamps."""
    if isinstance(report, dict):
        return {k: figures(v) for k, v in report.items() if k not in ("timing", "created", "seconds")}
    return [figures(v) for v in report] if isinstance(report, list) else report


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    sweep = Sweep(_plan(), space="nb201_digits", population_size=4, calibration_images=256)
    path = tmp_path_factory.mktemp("sweep") / "s.sqlite"
    store, ids = open_store(sweep, str(path), ARCHS)
    runner = engine.context(sweep).runner
    population_runs, run = [], runner.run
    runner.run = lambda item, *rest: population_runs.append(item.kind) or run(item, *rest)
    try:
        run_local(sweep, store, ids, worker=worker_id())
    finally:
        runner.run = run
    return sweep, store, path, ids, population_runs


def _stored_report(store, arch_id):
    from robustjax.evaluation.resume import ReplicaStore

    (key,) = [item["item_key"] for item in store.items() if item["kind"] == REPORT]
    return ReplicaStore(store.record(arch_id, key)).load(REPORT).section


def test_each_networks_report_equals_evaluate_of_that_network_alone(swept):
    sweep, store, _, ids, _ = swept
    context = engine.context(sweep)
    rows = {(r["arch_id"], r["item_key"]): r for r in store.results()}
    assert all(row["status"] == "ok" for row in rows.values()) and len(rows) == len(ids) * len(context.items)
    for arch_id in ids:
        network = context.alone(arch_id)
        alone = evaluate(network, context.dataset, report_plan(sweep.plan), profile=context.profile,
                         reference=context.reference)
        stored = _stored_report(store, arch_id)
        assert figures(stored) == figures(alone) and stored["status"] == "complete"
        assert {s["name"] for s in stored["sanity"]["checks"]} and stored["metrics"]["status"] == "ok"
        # the attack rows and the network's own report agree, entry by entry
        attacks = {f"{a['name']} eps={a['params']['eps']:g}": a["robust_accuracy"] for a in stored["attacks"]}
        for key, item in context.by_key.items():
            if item.kind == "attack":
                for label in item.labels:
                    assert rows[(arch_id, key)]["figures"][label] == pytest.approx(attacks[label], abs=1e-12)


def test_the_networks_evaluation_gives_its_item_rows_once_equal_to_a_populations(swept, tmp_path):
    """The report item's evaluation records the clean, attack and corruption outcomes: the
    sweep runs no population for them, and its rows equal those of a sweep of the same
    items without per-network sections, which runs them as one population."""
    sweep, store, _, ids, population_runs = swept
    assert population_runs == []
    raw = {"batch_size": 16, "num_examples": 32, "seed": 0, "attacks": [
        {"name": "fgsm", "eps": 0.1}, {"name": "pgd", "norm": "linf", "eps": [0.1, 0.2], "steps": 2}],
        "corruptions": {"names": ["brightness"], "severities": [3]}}  # a baseline changes no outcome
    plain = Sweep(plan_from_dict(raw), space="nb201_digits", population_size=4, calibration_images=256)
    other, _ = open_store(plain, str(tmp_path / "plain.sqlite"), ARCHS)
    run_local(plain, other, ids, worker=worker_id())
    populated = {(r["arch_id"], r["item_key"]): r for r in other.results()}
    reported = {(r["arch_id"], r["item_key"]): r for r in store.results()}
    assert len(populated) == len(ids) * 4  # clean, fgsm, pgd (both epsilons), brightness 3; no report item
    for key, row in populated.items():
        assert reported[key]["figures"] == row["figures"], key
        np.testing.assert_array_equal(reported[key]["outcome"], row["outcome"], err_msg=str(key))


def test_export_has_the_metrics_and_checks_as_columns(swept):
    _, store, _, ids, _ = swept
    table = export.table(store)
    for row, arch_id in zip(table.rows, ids):
        metrics = {e["name"]: e["value"] for e in _stored_report(store, arch_id)["metrics"]["results"]}
        assert row["metric AAW"] == metrics["AAW"] and row["metric mCE"] == metrics["mCE"]
        assert row["sanity unbounded_pgd"] in (0.0, 1.0)
    assert "metric AAW" not in table.figures  # columns, not accuracies the analysis ranks


def test_report_db_arch_renders_the_networks_report(swept, tmp_path, capsys):
    _, store, path, ids, _ = swept
    out = tmp_path / "one"
    assert main(["report", "--db", str(path), "--arch", ids[1], "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text()) == _stored_report(store, ids[1])
    assert "KMNC" in (out / "report.html").read_text()
    assert main(["report", "--db", str(path), "--arch", "nb201:99999", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has no network 'nb201:99999'" in err and "robustjax sweep export --db" in err


def test_a_rerun_finds_every_report_stored(swept):
    sweep, store, _, ids, _ = swept
    before = store.status()["rows"]
    run_local(sweep, store, ids, worker=worker_id())
    assert store.status()["rows"] == before
    assert np.all([r["status"] == "ok" for r in store.results()])


def test_sanity_unset_runs_in_evaluate_but_not_in_a_sweep():
    plan = plan_from_dict({"attacks": [{"name": "fgsm", "eps": 0.1}]})
    assert plan.sanity.enabled is None and report_plan(plan).sanity.enabled is False
    assert not [item for item in rj.evaluation.items.expand(plan) if item.kind == REPORT]
