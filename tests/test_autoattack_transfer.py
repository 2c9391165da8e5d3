"""AutoAttack's ensemble logic and transfer attacks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.attacks.autoattack import _first_success
from robustjax.attacks.base import AttackResult

SMALL = dict(eps=0.1, steps=5, target_classes=2, square_queries=30)


def test_first_success_keeps_the_first_successful_run_and_charges_runs_up_to_it():
    success = jnp.array([[False, True, False], [True, True, False], [False, False, False]])  # (runs, batch)
    x_adv = jnp.arange(3)[:, None, None, None, None] * jnp.ones((3, 3, 1, 1, 1))  # run index as pixel
    runs = AttackResult(x_adv=x_adv, success=success, queries=jnp.full((3, 3), 10), margin=jnp.where(success, -1.0, 1.0))
    first = _first_success(runs)
    np.testing.assert_array_equal(first.x_adv[:, 0, 0, 0], [1, 0, 2])  # none succeeded: the last run
    np.testing.assert_array_equal(first.success, [True, True, False])
    np.testing.assert_array_equal(first.queries, [20, 10, 30])


def test_components_follow_the_published_versions():
    names = lambda attack: [(type(a).__name__, getattr(a, "loss", None), r, t)  # noqa: E731
                            for a, r, t in attack.components(10)]
    assert names(rj.attacks.AutoAttack()) == [
        ("APGD", "ce", 1, 0), ("APGD", "dlr", 1, 9), ("FAB", None, 1, 0), ("Square", None, 1, 0)]
    assert rj.attacks.AutoAttack().components(10)[2][0].num_target_classes == 9
    assert [a[0].loss for a in rj.attacks.AutoAttack(norm="l1", eps=5.0).components(10)] == ["ce", "dlr"]
    plus = names(rj.attacks.AutoAttack(version="plus"))
    assert [(n, r) for n, _, r, _ in plus] == [("APGD", 5), ("APGD", 5), ("FAB", 5), ("Square", 1), ("APGD", 1),
                                               ("FAB", 1)]
    # fra31/auto-attack's 'rand': APGD-CE and untargeted APGD-DLR, one restart, 20 EOT draws
    rand = rj.attacks.AutoAttack(version="rand").components(10)
    assert names(rj.attacks.AutoAttack(version="rand")) == [("APGD", "ce", 1, 0), ("APGD", "dlr", 1, 0)]
    assert [a.eot_samples for a, _, _ in rand] == [20, 20]
    with pytest.raises(ValueError, match="version must be one of"):
        rj.attacks.AutoAttack(version="rand_plus")


def test_ensemble_is_at_least_as_strong_as_its_first_attack(digits_clf, digits_batch, key):
    x, y = digits_batch
    ensemble = rj.attacks.AutoAttack(**SMALL)(digits_clf, x, y, key=key)
    # The first component runs on the correctly classified examples, gathered into a batch
    # of the full size (more than a quarter of the batch is left) by repeating them.
    chosen = np.flatnonzero(np.argmax(digits_clf(x), -1) == y)
    rows = np.resize(chosen, len(y))
    first = rj.attacks.APGD(eps=0.1, steps=5)(digits_clf, x[rows], y[rows], key=jax.random.fold_in(key, 0))
    first_success = np.asarray(first.success)[:chosen.size]
    assert bool(np.all(np.asarray(ensemble.success)[chosen] >= first_success))
    np.testing.assert_array_equal(ensemble.success, np.argmax(digits_clf(ensemble.x_adv), -1) != y)
    # An example the first attack fooled is charged the ensemble's clean check, that attack's
    # queries (its own final check included) and the ensemble's final check.
    assert first_success.any()
    np.testing.assert_array_equal(np.asarray(ensemble.queries)[chosen[first_success]],
                                  np.asarray(first.queries)[:chosen.size][first_success] + 2)
    assert float(jnp.abs(ensemble.x_adv - x).max()) <= 0.1 + 1e-6


def test_components_run_only_on_the_examples_still_robust(digits_clf, digits_batch, key):
    x, y = digits_batch
    sizes = []
    counting = digits_clf.replace(apply_fn=lambda params, images: (
        jax.debug.callback(lambda a: sizes.append(len(a)), images), digits_clf.apply_fn(params, images))[1])
    # Wrong labels for all but the first 4 examples (which the model gets right): those are
    # fooled already, so the components see at most 4 examples, in batches of 32 / 4 = 8 or,
    # once fewer remain, of 2 (or 1).
    labels = np.where(np.arange(len(y)) < 4, y, (np.argmax(digits_clf(x), -1) + 1) % 10).astype(np.int32)
    attack = rj.attacks.AutoAttack(**SMALL, checks="off")  # the checks' forward passes are not counted here
    result = attack(counting, x, labels, key=key)
    jax.effects_barrier()  # debug callbacks run asynchronously
    assert sizes.count(len(y)) == 2  # the clean and the final check see them all
    assert max(size for size in sizes if size != len(y)) <= 8
    assert bool((np.asarray(result.queries)[4:] == 2).all())
    # Inside jit the one-program form runs, every component on the whole batch.
    sizes.clear()
    traced = jax.jit(lambda clf, images, labels, k: attack(clf, images, labels, key=k))(counting, x, labels, key)
    jax.effects_barrier()
    assert min(sizes) >= len(y)
    np.testing.assert_array_equal(traced.success, np.argmax(digits_clf(traced.x_adv), -1) != labels)
    np.testing.assert_array_equal(np.asarray(traced.queries)[4:], 2)


def test_misclassified_examples_are_not_attacked(digits_clf, digits_batch, key):
    x, y = digits_batch
    wrong = (np.argmax(digits_clf(x), -1) + 1) % 10
    result = rj.attacks.AutoAttack(**SMALL)(digits_clf, x, wrong.astype(np.int32), key=key)
    assert bool(result.success.all()) and bool((result.queries == 2).all())
    np.testing.assert_array_equal(result.x_adv, x)


def test_transfer_crafts_on_the_surrogate_and_scores_on_the_target(digits_clf, digits_batch, key):
    x, y = digits_batch
    attack = rj.attacks.PGD(eps=0.2, steps=10)
    same = rj.attacks.transfer(attack, digits_clf, digits_clf, x, y, key=key)
    np.testing.assert_array_equal(same.success, np.argmax(digits_clf(same.x_adv), -1) != y)
    other = digits_clf.replace(params=jax.tree.map(lambda p: p * 1.01, digits_clf.params), name="perturbed")
    moved = rj.attacks.transfer(attack, digits_clf, other, x, y, key=key)
    np.testing.assert_array_equal(moved.x_adv, same.x_adv)
    np.testing.assert_array_equal(moved.success, np.argmax(other(moved.x_adv), -1) != y)
    with pytest.raises(ValueError, match="same inputs and classes"):
        rj.attacks.transfer(attack, digits_clf, rj.zoo.create("digits_cnn", pretrained=False, num_classes=5), x, y,
                            key=key)
