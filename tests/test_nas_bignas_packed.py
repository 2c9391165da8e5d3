"""Packed BigNAS populations (``nas.bignas_packed``): each block of the supernet runs once per
shape its networks take there, at that shape, giving every subnet the logits and attack
outcomes of masks (and of the subnet alone) at about its own arithmetic."""

import jax
import numpy as np
import pytest

import robustjax as rj
from robustjax.evaluation import items
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.population import evaluate_population
from robustjax.nas.bignas import BigNASConfig
from robustjax.nas.bignas_packed import SKIPPED, PackedSubnets, block_keys, packing_order
from robustjax.nas.population import from_supernet, over_networks
from tests.helpers import assert_same_pgd_outcomes, count_compiles, gradient_flops_by_layout

SPACE = "bignas_resnet_basic_digits"


@pytest.fixture(scope="module")
def supernet():
    return rj.nas.bundled_supernet(SPACE)


@pytest.fixture(scope="module")
def calibration():
    return rj.nas.calibration_subset(rj.data.digits("train"), 256)


def sharing_nothing(space) -> list[BigNASConfig]:
    """Three subnets with no block shape in common: subnet k takes the k-th width of every
    stage; the first two are full depth, the third one block per stage."""
    return [BigNASConfig("basic", 8, tuple(widths[k] for widths in space.widths), (1,) + (2 - k // 2,) * 4,
                         (3 + 2 * (k % 2), 3, 3, 3, 3), (0,) + (1.0,) * 4) for k in range(3)]


def logits(population, images):
    return np.asarray(population.map(lambda classifier, x: classifier(x), images))


def test_block_keys_by_hand():
    space = rj.nas.space(SPACE)
    config = BigNASConfig("basic", 8, (8, 4, 16, 32, 64), (1, 2, 1, 2, 1), (5, 3, 3, 3, 3), (0, 0.5, 1.0, 0.5, 1.0))
    assert block_keys(space, config).tolist() == [  # (active, in, middle, out, kernel); middles of at least 8
        [1, 1, 0, 8, 5], [1, 8, 8, 4, 3], [1, 4, 8, 4, 3], [1, 4, 16, 16, 3], list(SKIPPED),
        [1, 16, 16, 32, 3], [1, 32, 16, 32, 3], [1, 32, 64, 64, 3], list(SKIPPED)]


@pytest.mark.parametrize("archs", ["sampled", "sharing_nothing"])
def test_packed_subnets_get_the_logits_and_attack_outcomes_of_masks(supernet, calibration, archs):
    archs = supernet.space.sample(jax.random.key(3), 6) if archs == "sampled" else sharing_nothing(supernet.space)
    masks, packed = (from_supernet(supernet, archs, calibration=calibration, packed=p) for p in (False, True))
    signature = packed.classifier.params[2].signature
    assert 1 in {n for position in signature for _, n in position}  # some network is alone in its group
    images, labels = rj.data.digits("test").arrays(limit=16)
    packed_logits = logits(packed, images)
    np.testing.assert_allclose(packed_logits, logits(masks, images), atol=1e-5, rtol=1e-5)
    alone = supernet.subnet(archs[-1], calibration=calibration)  # sliced to its own shapes
    np.testing.assert_allclose(packed_logits[-1], np.asarray(alone(images)), atol=1e-5, rtol=1e-5)
    assert_same_pgd_outcomes(masks, packed, images, labels)


def test_sharing_nothing_means_a_group_per_network_everywhere(supernet):
    choice = from_supernet(supernet, sharing_nothing(supernet.space), packed=True).classifier.params[2]
    assert [len(position) for position in choice.signature] == [3] * len(choice.signature)


def test_packed_subnets_execute_about_their_own_flops(supernet):
    """XLA's cost analysis of a PGD step's gradient: packed within 1.2x the subnets' own,
    where masks run every subnet at the supernet's largest shapes."""
    archs = supernet.space.sample(jax.random.key(4), 5)
    images, labels = rj.data.digits("test").arrays(limit=16)

    flops = gradient_flops_by_layout(supernet, archs, images, labels)
    assert flops["packed"] <= 1.2 * flops["own"]
    assert flops["masks"] >= 2.5 * flops["own"]


def test_the_same_subnets_in_another_order_compile_nothing(supernet):
    """The groups are data: a population of the same shapes in another order (so the same
    signature) reuses the program."""
    archs = supernet.space.sample(jax.random.key(5), 4)
    images = rj.data.digits("test").arrays(limit=8)[0]
    first = from_supernet(supernet, archs, packed=True)
    template = first.classifier
    run = jax.jit(lambda params, x: over_networks(lambda p: template.replace(params=p)(x), params, first.axes))
    order = [2, 0, 3, 1]
    second = from_supernet(supernet, [archs[i] for i in order], packed=True).classifier.params
    first = run(template.params, images)
    with count_compiles() as compiles:
        second = run(second, images)
    assert compiles[0] == 0
    np.testing.assert_allclose(np.asarray(second), np.asarray(first)[order], atol=1e-6)


def test_the_engine_runs_packed_subnets_with_the_figures_of_masks(supernet, calibration):
    archs = supernet.space.sample(jax.random.key(6), 4)
    dataset = rj.data.digits("test")
    plan = plan_from_dict({"batch_size": 8, "num_examples": 8, "sanity": {"enabled": False},
                           "attacks": [{"name": "fgsm", "eps": 0.1}]})
    packed, masks = (evaluate_population(supernet, archs, dataset, plan, calibration=calibration, population_size=2,
                                         layout=layout) for layout in ("packed", "masks"))
    assert [r["arch_id"] for r in packed] == [a.arch_id for a in archs]  # in the given order, not shape order
    for one, other in zip(packed, masks):
        assert one["clean_accuracy"] == other["clean_accuracy"]
        assert one["attacks"][0]["robust_accuracy"] == other["attacks"][0]["robust_accuracy"]


def test_packing_order_puts_subnets_of_the_same_shapes_together():
    space = rj.nas.space(SPACE)
    configs = space.sample(jax.random.key(7), 64)
    ordered = packing_order(space, configs)
    assert sorted(c.arch_id for c in ordered) == sorted(c.arch_id for c in configs)

    def groups(population):
        return sum(len(position) for position in PackedSubnets.of([block_keys(space, c) for c in population]).signature)

    def total(order):
        return sum(groups(order[start:start + 8]) for start in range(0, len(order), 8))

    assert total(ordered) < 0.9 * total(configs)  # 311 against 375 groups
    stems = [tuple(block_keys(space, c)[0]) for c in ordered]
    assert stems == sorted(stems)  # subnets of one stem shape are neighbours


def test_a_part_of_a_packed_population_takes_its_own_signature(supernet):
    archs = sharing_nothing(supernet.space)
    population = from_supernet(supernet, archs, packed=True)
    part = items._select(population.classifier.params, population.axes, [0, 2, 2])[2]
    assert isinstance(part, PackedSubnets)
    np.testing.assert_array_equal(part.keys, np.stack([block_keys(supernet.space, archs[i]) for i in (0, 2, 2)]))
    assert [n for _, n in part.signature[0]] == [1, 2]  # subnets 0 and 2 (twice): two stem shapes
    with pytest.raises(ValueError, match=r"packed block keys must be \(networks, positions, 5\)"):
        PackedSubnets.of(np.zeros((3, 9)))
