"""Populations: many networks in one compiled program give each network the results it gets
evaluated alone, compile once per population size, and shard like one network."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.evaluation import evaluate, items
from robustjax.evaluation.items import ItemRunner
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.population import evaluate_population, evaluate_population_batch
from robustjax.nas import nb201_net
from robustjax.nas.population import Population, from_supernet, network_count
from robustjax.sweep.engine import Sweep
from tests.helpers import count_compiles

PLAN = plan_from_dict({"batch_size": 16, "num_examples": 24, "sanity": {"enabled": False}, "attacks": [
    {"name": "fgsm", "eps": 0.1}, {"name": "pgd", "eps": [0.05, 0.1], "steps": 4}]})
SMALL_PLAN = plan_from_dict({"batch_size": 16, "num_examples": 16, "attacks": [
    {"name": "fgsm", "eps": 0.1}, {"name": "pgd", "eps": 0.1, "steps": 3}]})


@pytest.fixture(scope="module")
def calibration():
    return rj.nas.calibration_subset(rj.data.digits("train"), 512)


@pytest.mark.parametrize("space_name, layout", [("nb201_digits", "sequential"), ("nb201_digits", "masks"),
                                                ("bignas_resnet_basic_digits", "auto")])
def test_each_network_gets_the_results_it_gets_alone(space_name, layout, calibration):
    """Side by side (masks) and one after another (sequential: each NB201 edge runs only its
    network's op)."""
    supernet = rj.nas.bundled_supernet(space_name)
    archs = supernet.space.sample(jax.random.key(0), 5)
    dataset = rj.data.digits("test")
    # Populations of 3: the second holds 2 networks and a copy of the first of them as padding.
    results = evaluate_population(supernet, archs, dataset, PLAN, calibration=calibration, population_size=3,
                                  layout=layout)
    assert [r["arch_id"] for r in results] == [a.arch_id for a in archs]
    images = dataset.arrays(limit=16)[0]
    population = from_supernet(supernet, archs, calibration=calibration, sequential=layout == "sequential")
    logits = np.asarray(population.map(lambda clf, x: clf(x), images))
    for index in (0, 3):
        alone = supernet.subnet(archs[index], calibration=calibration)
        np.testing.assert_allclose(logits[index], np.asarray(alone(images)), atol=1e-5, rtol=1e-5)
    for index in (3,):  # in the padded population
        report = evaluate(supernet.subnet(archs[index], calibration=calibration), dataset, PLAN)
        assert results[index]["clean_accuracy"] == report["clean"]["accuracy"]
        assert [a["robust_accuracy"] for a in results[index]["attacks"]] == [
            a["robust_accuracy"] for a in report["attacks"]]


def test_a_sequential_population_runs_only_each_networks_own_ops(monkeypatch):
    """Counted at run time: one after another, a cell's average pooling runs on the edges
    whose network chose it (ResNet cell 11472: none; cell 22: 3 of 6), 3 cells each; side
    by side, every edge of every network computes it."""
    runs = []
    pool = nb201_net.avg_pool_3x3

    def counted(x):
        jax.debug.callback(lambda: runs.append(1))
        return pool(x)

    monkeypatch.setattr(nb201_net, "avg_pool_3x3", counted)
    supernet = rj.nas.bundled_supernet("nb201_digits")
    images = rj.data.digits("test").arrays(limit=4)[0]
    for sequential in (True, False):
        runs.clear()
        population = from_supernet(supernet, [11472, 22], sequential=sequential)
        jax.block_until_ready(population.map(lambda clf, x: clf(x), images))
        assert len(runs) == 3 * 3 if sequential else len(runs) >= 3 * 6


def test_sequences_give_each_network_the_flip_rates_it_gets_alone(calibration):
    """ImageNet-P items through a population equal `robustjax evaluate` of each subnet alone,
    per example (the frames are made once per batch and shared by the networks)."""
    supernet = rj.nas.bundled_supernet("nb201_digits")
    archs = supernet.space.sample(jax.random.key(2), 3)
    dataset = rj.data.digits("test")
    plan = plan_from_dict({"batch_size": 16, "num_examples": 12, "sanity": {"enabled": False}, "attacks": [],
                           "sequences": {"names": ["translate", "gaussian_noise"], "batch_size": 8}})
    results = evaluate_population(supernet, archs, dataset, plan, calibration=calibration, population_size=3)
    for arch, result in zip(archs, results):
        report = evaluate(supernet.subnet(arch, calibration=calibration), dataset, plan)
        assert result["sequences"] == [{key: r[key] for key in ("name", "flip_probability", "top5_distance")}
                                       for r in report["sequences"]["results"]]
        assert result["per_example"]["translate flip_probability"].shape == (12,)
    assert any(r["flip_probability"] > 0 for result in results for r in result["sequences"])


def test_one_compile_per_population_size(calibration):
    supernet = rj.nas.bundled_supernet("nb201_digits")
    archs = [supernet.space.config(i) for i in range(128)]
    plan = plan_from_dict({"batch_size": 16, "num_examples": 16, "attacks": [{"name": "fgsm", "eps": 0.1}]})
    dataset = rj.data.digits("test")
    evaluate_population(supernet, archs[:64], dataset, plan, calibration=calibration, population_size=64)
    with count_compiles() as compiles:
        results = evaluate_population(supernet, archs[64:], dataset, plan, calibration=calibration,
                                      population_size=64)
    assert compiles[0] == 0 and len(results) == 64


@pytest.mark.parametrize("network_shards", [1, 4])
def test_sharded_over_eight_devices_equals_one_device(calibration, network_shards):
    """Examples over 8 devices, and a 4 (networks) x 2 (examples) mesh, against 1 device."""
    assert jax.local_device_count() == 8
    supernet = rj.nas.bundled_supernet("bignas_resnet_basic_digits")
    population = from_supernet(supernet, supernet.space.sample(jax.random.key(1), 4), calibration=calibration)
    dataset = rj.data.digits("test")
    eight = evaluate_population_batch(population, dataset, SMALL_PLAN, ItemRunner(
        dataset, SMALL_PLAN, DataParallel(SMALL_PLAN.batch_size, network_shards=network_shards)))
    one = evaluate_population_batch(population, dataset, SMALL_PLAN, ItemRunner(
        dataset, SMALL_PLAN, DataParallel(SMALL_PLAN.batch_size, jax.local_devices()[:1])))
    for a, b in zip(eight, one):
        assert a["clean_accuracy"] == b["clean_accuracy"] and a["attacks"] == b["attacks"]
        for label in a["per_example"]:
            np.testing.assert_array_equal(a["per_example"][label], b["per_example"][label])


def test_network_shards_must_divide_the_devices_and_the_population():
    with pytest.raises(ValueError, match="network_shards must be an integer >= 1 that divides the 8 devices"):
        DataParallel(16, network_shards=3)
    parallel = DataParallel(16, network_shards=4)
    with pytest.raises(ValueError, match="a population of 6 networks does not split over 4 network shards"):
        parallel.place_population(np.zeros((6, 2)), 0)


def test_stacked_independent_networks():
    members = [rj.zoo.create("digits_cnn"), rj.zoo.create("digits_cnn", pretrained=False)]
    population = Population.stack(members)
    images = rj.data.digits("test").arrays(limit=8)[0]
    logits = np.asarray(population.map(lambda clf, x: clf(x), images))
    for index, member in enumerate(members):
        np.testing.assert_allclose(logits[index], np.asarray(member(images)), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(population.member(index)(images)), logits[index], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="needs one architecture"):
        Population.stack([members[0], rj.zoo.create("digits_mlp")])


def test_bad_populations_are_refused(calibration):
    supernet = rj.nas.bundled_supernet("nb201_digits")
    dataset = rj.data.digits("test")
    with pytest.raises(TypeError, match="config of another space"):
        from_supernet(supernet, [rj.nas.space("bignas_resnet_basic_digits").config(0)])
    with pytest.raises(ValueError, match="out of range"):
        from_supernet(supernet, [15625])
    with pytest.raises(ValueError, match=r"plan sections \['metrics'\] run per network, not in a population's "
                       r"one program: `robustjax sweep run --space SPACE` runs them"):
        evaluate_population(supernet, [0], dataset, dataclasses.replace(
            PLAN, metrics=plan_from_dict({"attacks": [], "metrics": {}}).metrics))
    space = dataclasses.replace(rj.nas.space("bignas_resnet_basic_digits"), resolutions=(6, 8), input_size=8)
    two = rj.nas.Supernet.create(space, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"2 resolutions \[6, 8\]"):
        from_supernet(two, [space.smallest(), space.largest()])


def test_a_population_too_large_for_memory_runs_in_parts_that_fit(calibration, monkeypatch):
    """With half the memory the population of 4 needs, each item runs it in parts of the
    largest size that fits, the last from the ladder, and every network gets the outcome of
    the unconstrained run; when not even one network fits, the error says what to change."""
    supernet = rj.nas.bundled_supernet("nb201_digits")
    archs = [supernet.space.config(i) for i in (11472, 0, 9, 1200)]
    plan = plan_from_dict({"batch_size": 16, "num_examples": 16, "attacks": [{"name": "fgsm", "eps": 0.1}]})
    dataset = rj.data.digits("test")
    runner, fgsm = ItemRunner(dataset, plan), items.expand(plan)[1]

    def needed(networks: int) -> int:
        population = from_supernet(supernet, archs[:networks])
        return runner.memory_needed(fgsm, population.classifier, population.axes)

    # Side by side, memory grows with the networks (one after another, it hardly does).
    unconstrained = evaluate_population(supernet, archs, dataset, plan, calibration=calibration, population_size=4,
                                        layout="masks")
    free = needed(4) // 2
    monkeypatch.setattr(items, "free_memory_bytes", lambda: free)
    sizes = []
    original = ItemRunner._run
    monkeypatch.setattr(ItemRunner, "_run", lambda self, item, clf, axes, *rest: sizes.append(
        (item.kind, network_count(clf.params, axes))) or original(self, item, clf, axes, *rest))
    constrained = evaluate_population(supernet, archs, dataset, plan, calibration=calibration, population_size=4,
                                      layout="masks")
    parts = [size for kind, size in sizes if kind == "attack"]
    assert 1 <= max(parts) < 4 and needed(max(parts)) <= free and sum(parts) >= 4
    for alone, together in zip(unconstrained, constrained):
        assert alone["arch_id"] == together["arch_id"]
        for label, outcome in alone["per_example"].items():
            np.testing.assert_array_equal(together["per_example"][label], outcome)
    monkeypatch.setattr(items, "free_memory_bytes", lambda: needed(1) - 1)
    free_gib = f"{(needed(1) - 1) / 2**30:.2f}".replace(".", r"\.")
    with pytest.raises(items.PopulationTooLarge, match=r"one network needs about .* GiB for fgsm eps=0.1 at batch size 16, "
                       rf"and {free_gib} GiB are free: pass a smaller batch_size \(--batch-size\)"):
        evaluate_population(supernet, archs[:2], dataset, plan, population_size=2, layout="masks")


def test_score_based_attacks_and_streaming_metrics_give_each_network_its_own_result(calibration):
    """Square (queries only) and streaming accumulators (behaviour ratios, calibration
    statistics) through ``population.map``: each network's result is the one it gets alone."""
    supernet = rj.nas.bundled_supernet("nb201_digits")
    archs = supernet.space.sample(jax.random.key(3), 3)
    population = from_supernet(supernet, archs, calibration=calibration)
    x, y = rj.data.digits("test").arrays(limit=32)
    square, key = rj.attacks.create("square", eps=0.1, max_queries=40), jax.random.key(5)

    def measured(clf, x, y):
        result = square(clf, x, y, key=key)
        logits, logits_adv = clf(x), clf(result.x_adv)
        success = rj.metrics.behaviour.AttackSuccessRate.empty().update(logits_adv, y)
        confidence = rj.metrics.behaviour.TrueClassConfidence.empty().update(logits_adv, y)
        stats = rj.metrics.calibration.CalibrationStats.empty(64).update(
            rj.metrics.calibration.max_softmax(logits), jnp.argmax(logits, -1) == y)
        return result.success, result.queries, success, confidence, stats

    together = jax.jit(lambda x, y: population.map(measured, x, y))(x, y)
    for index, arch in enumerate(archs):
        alone = jax.jit(measured)(supernet.classifier(arch, calibration=calibration), x, y)
        np.testing.assert_array_equal(together[0][index], alone[0])
        np.testing.assert_array_equal(together[1][index], alone[1])
        for accumulator in (2, 3):
            mine = jax.tree.map(lambda leaf: leaf[index], together[accumulator])
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), mine.compute(), alone[accumulator].compute())
        stats = jax.tree.map(lambda leaf: leaf[index], together[4])
        for name, value in stats.compute().items():
            np.testing.assert_allclose(value, alone[4].compute()[name], atol=1e-6, err_msg=name)


def test_exact_shapes_and_masks_give_the_same_results(calibration):
    supernet = rj.nas.bundled_supernet("bignas_resnet_basic_digits")
    archs = supernet.space.sample(jax.random.key(4), 2)
    dataset = rj.data.digits("test")
    masks = evaluate_population(supernet, archs, dataset, SMALL_PLAN, calibration=calibration, layout="masks")
    exact = evaluate_population(supernet, archs, dataset, SMALL_PLAN, calibration=calibration, layout="exact")
    for a, b in zip(masks, exact):
        assert a["arch_id"] == b["arch_id"] and a["clean_accuracy"] == b["clean_accuracy"]
        assert a["attacks"] == b["attacks"]
    choose, nb201 = rj.nas.population.choose_layout, rj.nas.space("nb201_digits")
    assert choose("auto", 1) == "exact" and choose("auto", 2, supernet.space) == "masks"
    assert choose("auto", 2, nb201) == "sequential" and choose("auto", 2, nb201, network_shards=2) == "masks"  # CPU
    with pytest.raises(ValueError, match=r"layout must be one of \('auto', 'masks', 'sequential', 'packed', 'exact'\), got 'mask'"):
        rj.nas.population.choose_layout("mask", 2)


def test_a_layout_that_runs_networks_in_turn_is_refused_with_network_shards_everywhere():
    """evaluate_population, a sweep and choose_layout give the same refusal, before any work."""
    supernet = rj.nas.bundled_supernet("nb201_digits")
    plan = plan_from_dict({"batch_size": 8, "num_examples": 8})
    for layout in ("sequential", "exact"):
        with pytest.raises(ValueError, match=rf"layout='{layout}' runs one network at a time: it cannot split"):
            evaluate_population(supernet, [0, 1], rj.data.digits("test"), plan, network_shards=2, layout=layout)
    with pytest.raises(ValueError, match=r"layout='sequential' runs one network at a time"):
        Sweep(plan=plan, dataset="digits", space="nb201_digits", network_shards=2, layout="sequential")
    with pytest.raises(ValueError, match=r"layout must be one of \('auto', 'masks', 'sequential', 'packed'\), got 'exact'"):
        Sweep(plan=plan, dataset="digits", space="nb201_digits", layout="exact")
