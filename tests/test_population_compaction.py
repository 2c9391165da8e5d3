"""A population's attack run compacted (``evaluation.compacted``): each network's examples
still active move into smaller batches between segments, and each network gets the records
of the one-program run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.evaluation import compacted, items
from robustjax.evaluation.items import ItemRunner
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import plan_from_dict
from robustjax.nas.population import Population, from_supernet

PLAN = plan_from_dict({"batch_size": 32, "num_examples": 32, "sanity": {"enabled": False},
                       "attacks": [{"name": "pgd", "eps": 0.1, "steps": 10}]})


def noisy_copy(classifier, seed: int, scale: float = 0.3):
    """``classifier`` with Gaussian noise of ``scale`` times each weight array's spread added."""
    leaves, tree = jax.tree.flatten(classifier.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return classifier.replace(params=jax.tree.unflatten(tree, [
        leaf + scale * jnp.std(leaf) * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys)]))


def head_negated(classifier):
    """``classifier`` with its output layer negated: it ranks the classes backwards, so PGD
    fools every example at its first step."""
    return classifier.replace(params=jax.tree_util.tree_map_with_path(
        lambda path, leaf: -leaf if "head" in jax.tree_util.keystr(path) else leaf, classifier.params))


@pytest.mark.parametrize("sequential", [True, False])
def test_compacted_population_attack_gives_each_network_the_one_program_records(sequential, monkeypatch):
    """Same success, queries and perturbation norms per example as the population's one
    program, side by side and in turn; the segments ran on fewer examples than the batch,
    and a network with none left was marked done while another went on."""
    base = rj.zoo.create("digits_mlp")
    # PGD fools 34-59% of the examples of each noisy copy, all of the negated one's at once.
    population = Population.stack([noisy_copy(base, 0), head_negated(base), noisy_copy(base, 1), noisy_copy(base, 2)])
    # One device, as on a user's CPU (the tests have 8; a batch sharded over several keeps one program).
    runner = ItemRunner(rj.data.digits("test"), PLAN, DataParallel(PLAN.batch_size, jax.devices()[:1]))
    item = items.expand(PLAN)[1]
    assert item.kind == "attack"
    segments = []
    advance = compacted._advance

    def spied(attack, axes, sequential, fields, classifier, x, y, state, running):
        segments.append((x.shape[1], np.asarray(running).copy()))
        return advance(attack, axes, sequential, fields, classifier, x, y, state, running)

    monkeypatch.setattr(compacted, "_advance", spied)
    records = runner.records(item, population.classifier, population.axes, sequential)
    monkeypatch.setattr(items, "compactable", lambda *_: False)
    one_program = runner.records(item, population.classifier, population.axes, sequential)

    assert set(records) == set(one_program)
    for name in records:
        np.testing.assert_allclose(records[name], one_program[name], atol=1e-5, err_msg=name)
    assert records["success"].any(axis=2).all() and not records["success"].all()
    assert segments[0][0] == 32 and min(size for size, _ in segments) < 32
    assert any(running.any() and not running.all() for _, running in segments)


def test_packed_populations_and_attacks_that_never_finish_early_keep_one_program():
    """A packed population (its networks share each op's examples) and an attack whose
    examples all run every step keep the one program."""
    supernet = rj.nas.bundled_supernet("nb201_digits")
    archs = supernet.space.sample(jax.random.key(2), 3)
    x = rj.data.digits("test").arrays(limit=8)[0]
    masks = from_supernet(supernet, archs)
    packed = from_supernet(supernet, archs, packed=True)
    assert compacted.compactable(rj.attacks.PGD(eps=0.1), masks.classifier, x)
    assert not compacted.compactable(rj.attacks.PGD(eps=0.1), packed.classifier, x)
    assert not compacted.compactable(rj.attacks.PGD(eps=0.1, early_stop=False), masks.classifier, x)
    assert not compacted.compactable(rj.attacks.FGSM(eps=0.1), masks.classifier, x)
    with pytest.raises(ValueError, match=r"FGSM on this population cannot run compacted: it needs a Segmented"):
        compacted.population_attack(rj.attacks.FGSM(eps=0.1), masks.axes, False, masks.classifier, x,
                                    np.zeros(len(x), np.int32), jax.random.key(0))
