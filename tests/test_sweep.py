"""Sweeps: the store keeps each (network, item) once and refuses another sweep; claims free
when their worker dies; a sweep's rows are the population evaluation's results; an item
that fails is recorded for its network and the sweep goes on; export and analysis."""

import io
import json
import sqlite3
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from rich.console import Console

import robustjax as rj
from robustjax.cli import main
from robustjax.cli.progress import NetworkDisplay
from robustjax.evaluation import items
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.population import evaluate_population
from robustjax.nas.population import from_supernet, network_count
from robustjax.sweep import Store, Sweep, SweepMismatch, engine, export, open_store, run_local
from robustjax.sweep import store as store_module
from robustjax.sweep.store import pack, unpack, worker_id

PLAN = plan_from_dict({"batch_size": 16, "num_examples": 24, "attacks": [
    {"name": "fgsm", "eps": 0.1}, {"name": "pgd", "eps": [0.05, 0.1], "steps": 3}],
    "corruptions": {"names": ["gaussian_noise"], "severities": [3]},
    "sequences": {"names": ["translate"], "batch_size": 8},
    "system_noise": {"decoders": ["pil"], "resizes": ["pil-bilinear"]}})


def test_outcomes_pack_to_one_bit_per_example_or_float32_values_and_back():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (2, 7), (3, 256), (1, 1001)]:
        outcome = rng.random(shape) < 0.5
        blob = pack(outcome)
        assert len(blob) == shape[0] * -(-shape[1] // 8)
        np.testing.assert_array_equal(unpack(blob, *shape), outcome)
        rates = rng.random(shape).astype(np.float32)  # a sequence item's per-example values
        np.testing.assert_array_equal(unpack(pack(rates), *shape, np.float32), rates)


def _store(tmp_path, definition=None):
    return Store.open(tmp_path / "s.sqlite", definition or {"plan": 1, "data_key": "d"})


def test_store_refuses_another_sweep_and_says_how_to_start_anew(tmp_path):
    _store(tmp_path).close()
    with pytest.raises(SweepMismatch, match=r"holds another sweep: its plan differ.*Pass a new --db"):
        _store(tmp_path, {"plan": 2, "data_key": "d"})
    _store(tmp_path).close()  # the same sweep opens again


def test_store_fails_before_any_work_on_an_unwritable_file_or_a_full_disk(tmp_path):
    (tmp_path / "s.sqlite").mkdir()  # not a file SQLite can write, whoever runs the test
    with pytest.raises(OSError, match="cannot write the sweep database"):
        _store(tmp_path)
    with pytest.raises(OSError, match="MiB free on its disk"):
        Store.open(tmp_path / "other.sqlite", {"data_key": "d"}, expected_bytes=1 << 60)


def test_claims_are_exclusive_and_free_again_when_the_worker_dies_or_the_lease_expires(tmp_path):
    store = _store(tmp_path)
    store.set_items([("clean", "clean", {}, ("clean",))])
    store.add_networks([(f"n{i}", "b0" if i < 4 else "b1", {}) for i in range(6)])
    ids = [f"n{i}" for i in range(6)]
    alive = worker_id()
    assert store.claim(alive, ids, 60, lambda a: 3) == ["n0", "n1", "n2"]
    assert store.claim(alive, ids, 60, lambda a: 3) == ["n3"]  # one bucket per chunk
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = f"{alive.split(':')[0]}:{dead.stdout.strip()}:x"
    assert store.claim(gone, ids, 60, lambda a: 3) == ["n4", "n5"]
    assert store.claim(alive, ids, 60, lambda a: 3) == ["n4", "n5"]  # its process is gone
    store.release(alive, ["n0"])
    assert store.claim("elsewhere:1:x", ids, -1, lambda a: 3) == ["n0"]  # a lease that has expired
    assert store.claim(alive, ids, 60, lambda a: 3) == ["n0"]
    store.commit([{"arch_id": "n1", "item_key": "clean", "status": "ok", "figures": {"clean": 1.0},
                   "outcome": pack(np.ones((1, 3), bool)), "examples": 3, "seconds": 0.0, "worker": alive}])
    assert store.commit([{"arch_id": "n1", "item_key": "clean", "status": "ok", "figures": {"clean": 0.0},
                          "outcome": pack(np.zeros((1, 3), bool)), "examples": 3, "seconds": 0.0,
                          "worker": alive}]) == 0  # a row is never written twice
    store.release(alive, ids)
    assert store.done() == {"n1"}
    assert store.claim(alive, ids, 60, lambda a: 6)[:2] == ["n0", "n2"]


def test_commit_returns_how_many_of_its_rows_were_new(tmp_path):
    store = _store(tmp_path)
    store.set_items([("clean", "clean", {}, ("clean",))])
    store.add_networks([(f"n{i}", "b0", {}) for i in range(5)])
    row = lambda i: {"arch_id": f"n{i}", "item_key": "clean", "status": "ok", "figures": {"clean": 1.0},  # noqa: E731
                     "outcome": pack(np.ones((1, 3), bool)), "examples": 3, "seconds": 0.0, "worker": "w"}
    assert [store.commit([row(i) for i in batch]) for batch in ([0], [0, 1], [1, 2, 3], [3], [2, 4])] == [
        1, 1, 2, 0, 1]


def test_status_counts_a_populations_networks_once_and_not_the_claims_of_dead_workers(tmp_path, monkeypatch):
    store = _store(tmp_path)
    store.set_items([("clean", "clean", {}, ("clean",))])
    store.add_networks([(f"n{i}", "b0", {}) for i in range(16)])
    clock = {"now": 1000.0}
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time=lambda: clock["now"]))
    for moment, population in ((1000.0, range(0, 4)), (1100.0, range(4, 8)), (1200.0, range(8, 12))):
        clock["now"] = moment
        store.commit([{"arch_id": f"n{i}", "item_key": "clean", "status": "ok", "figures": {"clean": 1.0},
                       "outcome": pack(np.ones((1, 3), bool)), "examples": 3, "seconds": 25.0, "worker": "w"}
                      for i in population])
    clock["now"] = 1300.0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    alive = worker_id()
    gone = f"{alive.split(':')[0]}:{dead.stdout.strip()}:x"
    ids = [f"n{i}" for i in range(16)]
    assert store.claim(alive, ids, 600, lambda a: 2) == ["n12", "n13"]
    assert store.claim(gone, ids, 600, lambda a: 2) == ["n14", "n15"]  # a worker whose process has ended
    status = store.status()
    assert status["networks_per_hour"] == pytest.approx(8 / 200 * 3600)  # 8 networks in the 200 s after the first 4
    assert status["claimed"] == {alive: 2} and status["done"] == 12


def test_a_heartbeat_keeps_claims_past_their_lease_while_an_item_runs(tmp_path):
    store = _store(tmp_path)
    store.set_items([("clean", "clean", {}, ("clean",))])
    store.add_networks([("n0", "b0", {}), ("n1", "b0", {})])
    alive, other = worker_id(), "elsewhere:1:x"
    # A 2 s lease renewed every 0.5 s: a busy machine would have to stall the thread 1.5 s.
    with store.heartbeat(alive, 2.0):
        assert store.claim(alive, ["n0", "n1"], 2.0, lambda a: 2) == ["n0", "n1"]
        time.sleep(6.0)  # three leases: an item longer than the lease
        assert store.claim(other, ["n0", "n1"], 2.0, lambda a: 2) == []
    time.sleep(2.5)  # no heartbeat: the lease runs out
    assert store.claim(other, ["n0", "n1"], 2.0, lambda a: 2) == ["n0", "n1"]


@pytest.fixture(scope="module")
def nb201_sweep(tmp_path_factory):
    sweep = Sweep(PLAN, space="nb201_digits", population_size=4, calibration_images=256)
    archs = [11472, 0, 9, 1200, 15624, 77, 5000]  # two populations: 4, then 3 padded to 4 (items.rung)
    store, ids = open_store(sweep, str(tmp_path_factory.mktemp("sweep") / "s.sqlite"), archs)
    run_local(sweep, store, ids, worker=worker_id())
    return sweep, store, archs


def test_sweep_rows_are_the_population_results(nb201_sweep):
    sweep, store, archs = nb201_sweep
    context = engine.context(sweep)
    expected = evaluate_population(context.supernet, archs, context.dataset, PLAN,
                                   calibration=context.calibration, population_size=4)
    rows = {(r["arch_id"], r["item_key"]): r for r in store.results()}
    assert len(rows) == len(archs) * len(context.items) and all(r["status"] == "ok" for r in rows.values())
    for result in expected:
        for key, item in context.by_key.items():
            row = rows[(result["arch_id"], key)]
            for label, outcome in zip(item.labels, row["outcome"]):
                np.testing.assert_array_equal(outcome, result["per_example"][label])
                assert row["figures"][label] == result["per_example"][label].mean()
    table = export.table(store)
    assert [r["arch_id"] for r in table.rows] == [f"nb201:{a}" for a in archs]
    assert table.context.startswith("Swept: NAS space nb201 (") and "subnets of its supernet" in table.context
    assert f"on 24 examples of digits (test split), under the plan's {len(context.items)} items" in table.context
    resnet = table.rows[0]
    assert resnet["index"] == 11472 and resnet["edge_1<-0"] == "nor_conv_3x3" and resnet["params"] > 0
    assert resnet["clean"] == expected[0]["clean_accuracy"]
    robust = expected[0]["per_example"]
    assert resnet["worst linf eps=0.1"] == (robust["fgsm eps=0.1"] & robust["pgd eps=0.1"]).mean()


def test_a_finished_sweep_reruns_nothing(nb201_sweep):
    sweep, store, archs = nb201_sweep
    before = store.status()["rows"]
    calls = []
    context = engine.context(sweep)
    original = context.runner.run
    context.runner.run = lambda *a: calls.append(a) or original(*a)
    try:
        run_local(sweep, store, [f"nb201:{a}" for a in archs], worker=worker_id())
    finally:
        context.runner.run = original
    assert calls == [] and store.status()["rows"] == before


def test_rows_go_to_their_networks_when_only_some_of_a_population_lack_an_item(nb201_sweep, tmp_path):
    """A store holding the finished sweep's rows but a few (network, item) pairs, different
    networks per item (a failed row forgotten as --retry-failed does, rows never run): the
    rerun evaluates whole populations and must store each network's own outcome, as the
    uninterrupted sweep did, not the outcome at the network's place among those missing."""
    sweep, finished, archs = nb201_sweep
    ids = [f"nb201:{a}" for a in archs]
    keys = finished.item_keys()
    clean, fgsm, pgd = keys[0], keys[1], keys[2]
    gaps = {(ids[2], clean), (ids[1], fgsm), (ids[3], fgsm), (ids[6], pgd)}
    expected = {(r["arch_id"], r["item_key"]): r for r in finished.results()}
    for arch_id, key in gaps:  # a row stored at another network's place would show
        population = ids[:4] if arch_id in ids[:4] else ids[4:]
        assert not any(np.array_equal(expected[arch_id, key]["outcome"], expected[other, key]["outcome"])
                       for other in population if other != arch_id)
    store, _ = open_store(sweep, str(tmp_path / "s.sqlite"), archs)
    store.commit([{**row, "outcome": pack(row["outcome"]), "examples": row["outcome"].shape[-1]}
                  for key, row in expected.items() if key not in gaps])
    store.commit([{"arch_id": ids[2], "item_key": clean, "status": "failed", "error": "RuntimeError: earlier",
                   "seconds": 0.0, "worker": "w"}])
    assert store.forget_failed([ids[2]]) == 1
    assert {(a, k) for k, missing in store.missing(ids).items() for a in missing} == gaps
    run_local(sweep, store, ids, worker=worker_id())
    rows = {(r["arch_id"], r["item_key"]): r for r in store.results()}
    assert rows.keys() == expected.keys()
    for gap in gaps:
        assert rows[gap]["status"] == "ok"
        np.testing.assert_array_equal(rows[gap]["outcome"], expected[gap]["outcome"], err_msg=str(gap))
        assert rows[gap]["figures"] == expected[gap]["figures"]


def test_a_population_forced_to_shrink_mid_way_gives_the_rows_of_an_unconstrained_run(
        nb201_sweep, tmp_path, monkeypatch):
    """With the memory of 2 networks' FGSM program free, a sweep runs the clean pass on its
    populations of 4 whole and FGSM in parts of 2 or fewer: its rows are the unconstrained
    sweep's, example for example."""
    _, unconstrained, archs = nb201_sweep
    plan = plan_from_dict({"batch_size": 16, "num_examples": 24, "attacks": [{"name": "fgsm", "eps": 0.1}]})
    sweep = Sweep(plan, space="nb201_digits", population_size=4, calibration_images=256, layout="masks")
    context = engine.context(sweep)
    fgsm = context.items[1]
    two = from_supernet(context.supernet, archs[:2], calibration=context.calibration)
    free = context.runner.memory_needed(fgsm, two.classifier, two.axes)
    monkeypatch.setattr(items, "free_memory_bytes", lambda: free)
    sizes = []
    original = context.runner._run
    monkeypatch.setattr(context.runner, "_run", lambda item, clf, axes, *rest: sizes.append(
        (item.kind, network_count(clf.params, axes))) or original(item, clf, axes, *rest))
    store, ids = open_store(sweep, str(tmp_path / "s.sqlite"), archs)
    shares = []
    run_local(sweep, store, ids, worker=worker_id(), on_item=lambda chunk, share: shares.append((len(chunk), share)))
    assert shares == [(4, 0.5), (4, 1.0), (3, 0.5), (3, 1.0)]  # progress after each item: clean, then FGSM
    # each population of 4 (the second: 3 networks and a copy) in two parts of 2
    assert [size for kind, size in sizes if kind == "attack"] == [2, 2, 2, 2]
    assert [size for kind, size in sizes if kind == "clean"] == [4, 4]
    expected = {(r["arch_id"], r["item_key"]): r for r in unconstrained.results()}
    rows = list(store.results())
    assert len(rows) == 2 * len(archs)
    for row in rows:
        np.testing.assert_array_equal(row["outcome"], expected[(row["arch_id"], row["item_key"])]["outcome"])


def test_progress_moves_with_each_item_at_the_rate_measured_so_far():
    console = Console(file=io.StringIO(), width=200)
    display = NetworkDisplay(console, 10)
    display.ITEM_LINE_S, display.started = 0.0, display.started - 100.0  # 100 s into the sweep
    display.item(["a", "b", "c", "d"], 0.5)  # half of a population of 4: 2 networks' work
    assert "2/10 networks done, 72 networks/h, 400 s left" in console.file.getvalue()
    display.advance(["a", "b", "c", "d"])
    assert "4/10 networks done, 144 networks/h, 150 s left" in console.file.getvalue()


def test_an_item_that_fails_on_one_network_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    plan = plan_from_dict({"batch_size": 16, "num_examples": 16, "attacks": [{"name": "fgsm", "eps": 0.1}]})
    sweep = Sweep(plan, models=("digits_cnn", "digits_mlp"))
    context = engine.context(sweep)
    mlp_params = rj.zoo.count_params(context.model("digits_mlp"))
    original = context.runner.run

    def run(item, classifier, axes, sequential):
        if item.kind == "attack" and rj.zoo.count_params(classifier) == mlp_params:
            raise RuntimeError("boom on the mlp")
        return original(item, classifier, axes, sequential)

    monkeypatch.setattr(context.runner, "run", run)
    store, ids = open_store(sweep, str(tmp_path / "s.sqlite"), sweep.models)
    run_local(sweep, store, ids, worker=worker_id())
    rows = {(r["arch_id"], r["status"]) for r in store.results()}
    assert rows == {("digits_cnn", "ok"), ("digits_mlp", "ok"), ("digits_mlp", "failed")}
    failed = [r for r in store.results() if r["status"] == "failed"][0]
    assert failed["error"] == "RuntimeError: boom on the mlp"
    table = export.table(store)
    mlp = table.rows[1]
    assert mlp["fgsm eps=0.1"] is None and "boom on the mlp" in mlp["errors"] and mlp["clean"] > 0.9
    run_local(sweep, store, ids, worker=worker_id())  # a failed item is kept, not rerun
    assert len(list(store.results())) == 4
    monkeypatch.setattr(context.runner, "run", original)
    assert store.forget_failed(ids) == 1
    run_local(sweep, store, ids, worker=worker_id())
    assert {r["status"] for r in store.results()} == {"ok"} and len(list(store.results())) == 4


def test_a_nas_network_among_models_carries_its_space_ids_so_its_row_joins_as_a_space_sweeps_does(tmp_path):
    plan = plan_from_dict({"batch_size": 8, "num_examples": 8})
    # a model's id is the spec as typed, though its classifier has another name
    sweep = Sweep(plan, models=("nas.nb201_digits", "digits_mlp", "tests.helpers:tiny_model"))
    store, ids = open_store(sweep, str(tmp_path / "s.sqlite"), sweep.models)
    cards = {arch_id: card for arch_id, _, card in store.networks()}
    space = rj.nas.space("nb201_digits")
    default = space.resolve(rj.nas.models.DEFAULT_ARCH["nb201"])
    assert cards["nas.nb201_digits"]["index"] == 11472 == space.index(default)
    assert cards["nas.nb201_digits"]["canonical_index"] == space.canonical(default)
    assert cards["nas.nb201_digits"]["macs"] == space.cost(default).macs
    assert "index" not in cards["digits_mlp"]
    run_local(sweep, store, ids, worker=worker_id())
    rows = export.table(store).rows
    assert [row["arch_id"] for row in rows] == list(sweep.models) and all(row["clean"] is not None for row in rows)
    assert rows[0]["index"] == 11472 and rows[0]["edge_1<-0"] == default.ops[0]


def test_an_item_failing_on_every_network_exits_non_zero_naming_its_cause(tmp_path, monkeypatch, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text('batch_size = 8\nnum_examples = 8\n[system_noise]\ndecoders = ["pil"]\n'
                    'resizes = ["pil-bilinear", "opencv-area"]\n')
    command = ["sweep", "run", "--db", str(tmp_path / "s.sqlite"), "--models", "digits_cnn,digits_mlp",
               "--plan", str(plan), "--quiet"]
    monkeypatch.setitem(sys.modules, "cv2", None)  # as on an install without OpenCV
    assert main(command) == 1
    out = capsys.readouterr().out.replace("\n", "")
    assert "pil+opencv-area failed on every network: ImportError: the 'opencv' system-noise variants need" in out
    assert "pil+pil-bilinear" not in out and "--retry-failed" in out
    monkeypatch.delitem(sys.modules, "cv2")
    assert main([*command, "--retry-failed"]) == 0
    assert "failed on every network" not in capsys.readouterr().out


def test_cli_export_formats_join_status_and_analysis(nb201_sweep, tmp_path, capsys):
    _, store, archs = nb201_sweep
    db = str(store.path)
    assert main(["sweep", "status", "--db", db]) == 0
    assert f"{len(archs)}/{len(archs)} networks done" in capsys.readouterr().out
    published = tmp_path / "published.csv"
    published.write_text("index,test_accuracy\n11472,93.76\n0,10.0\n")
    assert main(["sweep", "export", "--db", db, "--out", str(tmp_path / "r.csv"), "--join", str(published)]) == 0
    assert f"joined 2 of {len(archs)} networks with {published} on index ({len(archs) - 2} without a match)" in \
        capsys.readouterr().out.replace("\n", "")  # the console wraps long lines
    import csv

    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert rows[0]["published_test_accuracy"] == "93.76" and rows[2].get("published_test_accuracy") in ("", None)
    assert main(["sweep", "export", "--db", db, "--format", "jsonl", "--out", str(tmp_path / "r.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert main(["sweep", "export", "--db", db, "--format", "parquet", "--out", str(tmp_path / "r.parquet")]) == 0
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r.parquet").to_pylist() == lines
    assert main(["sweep", "analyze", "--db", db, "--out", str(tmp_path / "analysis")]) == 0
    summary = (tmp_path / "analysis" / "summary.md").read_text()
    assert f"{len(archs)} networks" in summary and (tmp_path / "analysis" / "scatter_flops.png").is_file()


def test_cli_refuses_another_plan_on_the_same_database(nb201_sweep, capsys):
    _, store, _ = nb201_sweep
    code = main(["sweep", "run", "--db", str(store.path), "--ids", "0", "--plan", "whitebox", "--quiet"])
    assert code == 2 and "holds another sweep" in capsys.readouterr().err


def test_cli_refuses_a_file_that_is_no_sweep_database_in_one_line(tmp_path, capsys):
    (tmp_path / "notes.sqlite").write_text("not a database\n" * 100)
    assert main(["sweep", "run", "--db", str(tmp_path / "notes.sqlite"), "--models", "digits_mlp", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "notes.sqlite is not a robustjax sweep database" in err and "Traceback" not in err


def test_cli_refuses_all_of_a_space_too_large_for_one_database_before_any_work(tmp_path, capsys):
    code = main(["sweep", "run", "--db", str(tmp_path / "s.sqlite"), "--space", "bignas_resnet_basic", "--all",
                 "--quiet"])
    assert code == 2 and "a sweep of 133,705,728,000 networks is more than one database holds" in \
        capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "s.sqlite").exists()


def test_cli_fails_fast_on_an_unreachable_ray_address(tmp_path, capsys):
    code = main(["sweep", "run", "--db", str(tmp_path / "s.sqlite"), "--ray", "127.0.0.1:9", "--quiet"])
    assert code == 2 and "no Ray cluster answers at 127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "s.sqlite").exists()


def test_store_file_is_plain_sqlite_in_wal_mode(nb201_sweep):
    _, store, _ = nb201_sweep
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        environment = json.loads(db.execute("SELECT value FROM meta WHERE key = 'environment'").fetchone()[0])
    assert environment["robustjax"] == rj.__version__
