"""Attack schedules and target orders observed against the authors' algorithms (issue 36):
the iterate after APGD's step-size halvings, the square side each Square iteration uses,
and the target classes AutoAttack's APGD-T and FAB-T attack."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.attacks.apgd import APGD
from robustjax.attacks.autoattack import AutoAttack
from robustjax.attacks.base import Attack
from robustjax.attacks.fab import FAB
from robustjax.attacks.square import Square, square_sides
from robustjax.losses import cross_entropy
from tests.helpers import linear_classifier

# ---------------------------------------------------------------------------------------
# APGD: the step-size halving and the restart from the best point


def _mlp_apply(params, x):
    hidden = jnp.tanh(x.reshape(x.shape[0], -1) @ params["w1"] + params["b1"])
    return hidden @ params["w2"]


def _tanh_mlp(seed=0) -> rj.Classifier:
    """A small non-convex model (a linear one sends linf APGD straight to a corner, where a
    restart from the best point is the current point and changes nothing)."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.normal(0, 2.0, (16, 8)), "b1": rng.normal(0, 1.0, 8), "w2": rng.normal(0, 2.0, (8, 3))}
    return rj.Classifier(params=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params), apply_fn=_mlp_apply,
                         num_classes=3, input_shape=(4, 4, 1), name="tanh_mlp")


def _authors_apgd_linf_ce(loss_grad, x, eps, n_iter):
    """AutoAttack's ``APGDAttack.attack_single_run`` (autopgd_base.py) for linf and CE,
    started at ``x``, transcribed in numpy. ``loss_grad(images) -> (loss, grad, fooled)``.

    Returns the best point, whether each example was ever fooled, and how many halvings
    moved an unfooled example's iterate (a restart from ``x_best`` away from ``x_adv``).
    """
    n_iter_2, n_iter_min, size_decr = (max(int(f * n_iter), 1) for f in (0.22, 0.06, 0.03))
    x_adv = x.copy()
    loss, grad, fooled = loss_grad(x_adv)
    x_best, grad_best, loss_best = x_adv.copy(), grad.copy(), loss.copy()
    loss_steps = np.zeros((n_iter, len(x)), np.float32)
    step_size = 2.0 * eps * np.ones((len(x), 1, 1, 1), np.float32)
    x_adv_old, k, counter3 = x_adv.copy(), n_iter_2, 0
    loss_best_last_check, reduced_last_check = loss_best.copy(), np.ones(len(x), bool)
    moved = 0
    for i in range(n_iter):
        grad2, x_adv_old = x_adv - x_adv_old, x_adv.copy()
        a = 0.75 if i > 0 else 1.0
        x_adv_1 = np.clip(np.clip(x_adv + step_size * np.sign(grad), x - eps, x + eps), 0.0, 1.0)
        x_adv_1 = np.clip(np.clip(x_adv + (x_adv_1 - x_adv) * a + grad2 * (1 - a), x - eps, x + eps), 0.0, 1.0)
        x_adv = x_adv_1
        y1, grad, now_fooled = loss_grad(x_adv)
        fooled |= now_fooled
        loss_steps[i] = y1
        ind = y1 > loss_best
        x_best[ind], grad_best[ind], loss_best[ind] = x_adv[ind], grad[ind], y1[ind]
        counter3 += 1
        if counter3 == k:
            # check_oscillation: loss increases over the last k steps. Its first comparison
            # reads loss_steps[-1], still zero, below any CE: it counts as an increase.
            increases = sum((loss_steps[i - c] > loss_steps[i - c - 1]).astype(int) for c in range(k))
            fl_oscillation = increases <= k * 0.75
            fl_reduce_no_impr = ~reduced_last_check & (loss_best_last_check >= loss_best)
            fl_oscillation = fl_oscillation | fl_reduce_no_impr
            reduced_last_check, loss_best_last_check = fl_oscillation.copy(), loss_best.copy()
            moved += int(np.sum(fl_oscillation & ~fooled & np.any(x_adv != x_best, axis=(1, 2, 3))))
            step_size[fl_oscillation] /= 2.0
            x_adv[fl_oscillation] = x_best[fl_oscillation]
            grad[fl_oscillation] = grad_best[fl_oscillation]
            k, counter3 = max(k - size_decr, n_iter_min), 0
    return x_best, fooled, moved


def test_apgd_iterates_follow_the_authors_halving_and_restart():
    """Deterministic APGD (no random start) on a non-convex model: every example that is
    never fooled returns the authors' best point exactly, which depends on each halving's
    step size and on the restart from the best point and its gradient."""
    clf = _tanh_mlp()
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 0.8, (32, 4, 4, 1)).astype(np.float32)
    y = np.asarray(jnp.argmax(clf(x), -1)).astype(np.int32)
    eps, steps = 0.1, 20

    @jax.jit
    def loss_grad_jax(images):
        loss, vjp = jax.vjp(lambda z: cross_entropy(clf(z), y), images)
        return loss, vjp(jnp.ones_like(loss))[0], jnp.argmax(clf(images), -1) != y

    def loss_grad(images):
        return tuple(np.array(a) for a in loss_grad_jax(images))

    x_best, fooled, moved = _authors_apgd_linf_ce(loss_grad, x, eps, steps)
    assert moved > 10  # the restarts do move iterates here: the comparison below sees them
    assert 0 < fooled.sum() < len(x) // 2
    first_loss = loss_grad(np.clip(x + 2 * eps * np.sign(loss_grad(x)[1]), x - eps, x + eps))[0]
    assert np.all(first_loss > loss_grad(x)[0])  # the zero of check_oscillation's first look agrees

    result = APGD(eps=eps, norm="linf", loss="ce", steps=steps, random_start=False)(clf, x, y, key=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(result.success), fooled)
    np.testing.assert_allclose(np.asarray(result.x_adv)[~fooled], x_best[~fooled], atol=1e-6)


# ---------------------------------------------------------------------------------------
# Square: the side of every iteration's window


def _p_selection(p_init, it, n_iters):
    """The authors' piecewise-constant schedule (square-attack, attack.py)."""
    it = int(it / n_iters * 10000)
    bounds = [10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000, 10000]
    for j in range(len(bounds) - 1):
        if bounds[j] < it <= bounds[j + 1]:
            return p_init / 2 ** (j + 1)
    return p_init


def test_square_linf_side_of_every_iteration_is_the_authors():
    """A model whose loss never decreases rejects every proposal, so every query after the
    start is ``x_best`` (the start's vertical stripes) with one window set to ``x +- eps``:
    the rows where it differs from the start are exactly the window's ``s`` rows. The
    authors' side: ``s = round(sqrt(p * n_features / c))`` in [1, h - 1], ``p`` from
    ``p_selection`` (the image is not square, to tell the axes apart)."""
    height, width, channels, budget, p_init = 9, 12, 2, 300, 0.5
    seen = []

    def constant_apply(params, images):
        jax.debug.callback(lambda batch: seen.append(np.array(batch)), images, ordered=True)
        return jnp.broadcast_to(params["z"], (images.shape[0], 2)) + 0.0 * jnp.sum(images)

    clf = rj.Classifier(params={"z": jnp.array([3.0, 0.0])}, apply_fn=constant_apply, num_classes=2,
                        input_shape=(height, width, channels), name="constant")
    x = np.full((1, height, width, channels), 0.5, np.float32)
    result = Square(eps=0.1, max_queries=budget, p_init=p_init)(clf, x, np.zeros(1, np.int32), key=jax.random.key(0))
    assert int(result.queries[0]) == budget
    queries = [image[0] for image in seen if not np.array_equal(image, x)]  # not the clean checks
    assert len(queries) == budget - 1  # the start, budget - 3 proposals, the final check
    start, proposals = queries[0], queries[1:-1]
    np.testing.assert_array_equal(queries[-1], start)  # nothing was accepted
    changed = [np.any(np.abs(p - start) > 1e-6, axis=2) for p in proposals]
    rows = [int(np.any(c, axis=1).sum()) for c in changed]
    expected = [min(max(round(math.sqrt(_p_selection(p_init, i, budget) * height * width * channels / channels)), 1),
                    height - 1) for i in range(len(proposals))]
    assert len(set(expected)) == 6  # the schedule runs from 7 down to 1 here
    assert rows == expected
    for c, side in zip(changed, expected, strict=True):  # the columns stay within the window too
        columns = np.flatnonzero(np.any(c, axis=0))
        assert columns.max() - columns.min() < side


def test_square_l2_sides_are_the_authors():
    """l2: ``s = max(round(sqrt(p * n_features / c)), 3)``, made odd, p halved per stage."""
    for height, width, p_init in [(32, 32, 0.8), (28, 20, 0.3), (9, 12, 0.5)]:
        expected = []
        for j in range(10):
            side = max(round(math.sqrt(p_init / 2**j * height * width)), 3)
            expected.append(side + 1 if side % 2 == 0 else side)
        assert max(expected) < min(height, width)  # the library's cap does not bind here
        np.testing.assert_array_equal(square_sides(p_init, height, width, "l2"), expected)


# ---------------------------------------------------------------------------------------
# AutoAttack: APGD-T's and FAB-T's target classes

_SEEN = {"apgd-t": [], "fab-t": []}


def _record(kind, *arrays):
    _SEEN[kind].append(tuple(np.array(a) for a in arrays))


@jax.custom_vjp
def _cotangent_spy(logits):
    return logits


def _spy_fwd(logits):
    return logits, None


def _spy_bwd(_, cotangent):
    jax.debug.callback(functools.partial(_record, "fab-t"), cotangent)
    return (cotangent,)


_cotangent_spy.defvjp(_spy_fwd, _spy_bwd)


@dataclasses.dataclass(frozen=True)
class _Spy(Attack):
    """Runs ``inner``; records APGD-T's target, and FAB-T's gradient on the logits (FAB-T
    picks its targets inside its run: its gap ``z_t - z_y`` has cotangent +1 at ``t``, -1
    at ``y``)."""

    inner: Attack = None

    def run(self, classifier, x, y, key, target):
        if isinstance(self.inner, FAB):
            apply = classifier.apply_fn
            classifier = dataclasses.replace(classifier, apply_fn=lambda p, z: _cotangent_spy(apply(p, z)))
        else:
            jax.debug.callback(functools.partial(_record, "apgd-t"), target, ordered=True)
        return self.inner.run(classifier, x, y, key, target)


class _SpiedAutoAttack(AutoAttack):
    def components(self, num_classes):
        return tuple((_Spy(inner=attack) if targets or isinstance(attack, FAB) else attack, restarts, targets)
                     for attack, restarts, targets in super().components(num_classes))


@pytest.mark.parametrize("traced", [False, True], ids=["robust-subsets", "traced"])
def test_autoattack_targets_are_the_top_ranked_wrong_classes_in_order(traced):
    """The authors' APGD-T and FAB-T: ``y_target = output.sort(dim=1)[1][:, -target_class]``
    for ``target_class = 2 .. n_target_classes + 1`` (the clean logits of correctly
    classified points). eps = 0 keeps every example robust through every stage."""
    num_classes, targets = 6, 3
    rng = np.random.default_rng(4)
    w = rng.normal(size=(16, num_classes))
    b = -0.5 * w.sum(0)  # balanced classes over the box
    pool = rng.uniform(0, 1, (200, 4, 4, 1)).astype(np.float32)
    pool_y = (pool.reshape(200, -1) @ w + b).argmax(1)
    x = np.concatenate([pool[pool_y == c][:2] for c in range(num_classes)])  # 2 of each class
    clf = linear_classifier(w, b)
    logits = np.asarray(clf(x))
    y = logits.argmax(1).astype(np.int32)
    assert len(set(y.tolist())) == num_classes
    authors = [np.argsort(logits, axis=1)[:, -target_class] for target_class in range(2, targets + 2)]

    for records in _SEEN.values():
        records.clear()
    attack = _SpiedAutoAttack(eps=0.0, steps=1, target_classes=targets, square_queries=4)
    key = jax.random.key(0)
    result = jax.jit(lambda: attack(clf, x, y, key=key))() if traced else attack(clf, x, y, key=key)
    assert not np.asarray(result.success).any()

    apgd_targets = np.concatenate([t.reshape(-1, len(x)) for (t,) in _SEEN["apgd-t"]])
    np.testing.assert_array_equal(apgd_targets, np.stack(authors))
    # FAB-T: one run per target, all as one batch (target-major); every step the same gap.
    assert _SEEN["fab-t"]
    for (cotangent,) in _SEEN["fab-t"]:
        cotangent = cotangent.reshape(targets, len(x), num_classes)
        for k in range(targets):
            expected = np.zeros((len(x), num_classes))
            expected[np.arange(len(x)), authors[k]] += 1.0
            expected[np.arange(len(x)), y] -= 1.0
            np.testing.assert_array_equal(cotangent[k], expected)
