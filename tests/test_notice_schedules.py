"""Schedules, orders and tables observed against their references (issue 36, item 2): each
test records what the algorithm does at every iteration (the constant of each search step,
the iterates, the per-iteration parameters, the order of the blocks tried) and compares it
with a transcription of the authors' loop or with the reference package, not only the
final success rate."""

import ast
import collections
import dataclasses
import functools
import inspect
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax import training
from robustjax.attacks import PGD
from robustjax.attacks.cw import CWL2
from robustjax.attacks.hsja import HopSkipJump
from robustjax.training import step as train_step
from robustjax.training.model import TrainModel
from tests.helpers import linear_apply

# ---------------------------------------------------------------------------------------
# Recording classifiers: every image the model sees, its logits, and the gradient that
# reaches the logits in the backward pass.

_SEEN = collections.defaultdict(list)


def _record(kind, *arrays):
    arrays = tuple(np.array(a) for a in arrays)
    _SEEN[kind].append(arrays)
    _SEEN["all"].append((kind, *arrays))  # the order of all records (ordered callbacks)


@jax.custom_vjp
def _cotangent_spy(logits):
    return logits


def _spy_fwd(logits):
    return logits, None


def _spy_bwd(_, cotangent):
    jax.debug.callback(functools.partial(_record, "cotangent"), cotangent, ordered=True)
    return (cotangent,)


_cotangent_spy.defvjp(_spy_fwd, _spy_bwd)


def _recording_apply(params, x):
    logits = linear_apply(params, x)
    jax.debug.callback(functools.partial(_record, "forward"), x, logits, ordered=True)
    return _cotangent_spy(logits)


def _recording_linear(w, b, input_shape=(4, 4, 1)) -> rj.Classifier:
    return rj.Classifier(params={"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)},
                         apply_fn=_recording_apply, num_classes=np.shape(w)[1], input_shape=input_shape,
                         name="recording_linear")


def _clear():
    _SEEN.clear()


def _seen(kind):
    jax.effects_barrier()
    return _SEEN[kind]


# ---------------------------------------------------------------------------------------
# Carlini-Wagner L2: the constant c of every binary-search step, and the best point kept


def _authors_next_const(const, lower, upper, succeeded):
    """Carlini's ``l2_attack.py`` (nn_robust_attacks), after each binary-search step:
    ``upper_bound`` starts at 1e10 and ``lower_bound`` at 0."""
    if succeeded:
        upper = min(upper, const)
        if upper < 1e9:
            const = (lower + upper) / 2
    else:
        lower = max(lower, const)
        const = (lower + upper) / 2 if upper < 1e9 else const * 10
    return const, lower, upper


def test_cw_binary_search_moves_c_as_the_authors_and_keeps_the_closest_success():
    """The gradient reaching the logits at the first Adam step of a search step (at the
    clean image, where the margin is positive) is ``c`` at the label: it gives the ``c`` of
    every search step. Whether a step succeeded comes from the logits the attack saw; the
    next ``c`` must be the authors' (x10 while no success, then bisection between the
    bounds), and the result the successful iterate of smallest L2 distance over all steps."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=16)
    clf = _recording_linear(np.stack([np.zeros(16), v], 1), [0.0, -0.5 * v.sum()])
    unit = v / np.linalg.norm(v)
    x = (0.5 + np.outer([0.3, -0.2, 0.1, -0.05], unit)).reshape(4, 4, 4, 1).astype(np.float32)
    y = (x.reshape(4, -1) @ v - 0.5 * v.sum() > 0).astype(np.int32)
    search_steps, steps = 7, 25
    attack = CWL2(initial_const=0.01, binary_search_steps=search_steps, steps=steps, learning_rate=0.05,
                  abort_early=False)
    _clear()
    result = attack(clf, x, y, key=jax.random.key(0))
    cotangents = np.stack([c for (c,) in _seen("cotangent")])
    forward = _seen("forward")
    np.testing.assert_array_equal(forward[-1][0], result.x_adv)  # the final check
    images, logits = np.stack([f[0] for f in forward[:-1]]), np.stack([f[1] for f in forward[:-1]])
    assert len(cotangents) == len(images) == search_steps * steps
    logits = logits.reshape(search_steps, steps, len(x), 2)
    images = images.reshape(search_steps, steps, *x.shape)
    observed_const = cotangents.reshape(search_steps, steps, len(x), 2)[:, 0, np.arange(len(x)), y]
    margin = logits[..., 0] * np.where(y == 0, 1, -1) + logits[..., 1] * np.where(y == 0, -1, 1)
    hits = margin < 0  # (search step, step, example)

    const, lower, upper = np.full(len(x), 0.01), np.zeros(len(x)), np.full(len(x), 1e10)
    for k in range(search_steps):
        np.testing.assert_allclose(observed_const[k], const, rtol=1e-5)
        for i in range(len(x)):
            const[i], lower[i], upper[i] = _authors_next_const(const[i], lower[i], upper[i], hits[k, :, i].any())
    succeeded = hits.any(1)
    # Every branch of the rule is taken: x10 after failures without an upper bound, halving
    # down after successes, and failures between the bounds after a success.
    assert succeeded[0].any() and (~succeeded[:2]).all(0).any() and succeeded.any(0).all()
    assert (np.maximum.accumulate(succeeded, axis=0) & ~succeeded).sum() >= 3

    # Each search step restarts in tanh space at the image with a fresh Adam state: its first
    # iterate is x, its second one Adam's first step, lr * g / (|g| + 1e-8), in w.
    w0 = np.arctanh((2 * x.astype(np.float64) - 1) * (1 - 1e-6))
    shrunk, slope = (np.tanh(w0) + 1) / 2, (1 - np.tanh(w0) ** 2) / 2  # x' and dx'/dw at w0
    margin_grad = v.reshape(1, 4, 4, 1) * np.where(y == 1, 1.0, -1.0).reshape(-1, 1, 1, 1)
    for k in range(search_steps):
        np.testing.assert_allclose(images[k, 0], x, atol=1e-6)
        g = (2 * (shrunk - x) + observed_const[k].reshape(-1, 1, 1, 1) * margin_grad) * slope
        np.testing.assert_allclose(images[k, 1], (np.tanh(w0 - 0.05 * g / (np.abs(g) + 1e-8)) + 1) / 2, atol=2e-6)

    distance = ((images - x) ** 2).reshape(search_steps * steps, len(x), -1).sum(-1)
    distance = np.where(hits.reshape(search_steps * steps, len(x)), distance, np.inf)
    best = images.reshape(search_steps * steps, *x.shape)[distance.argmin(0), np.arange(len(x))]
    np.testing.assert_array_equal(result.x_adv, best)


# ---------------------------------------------------------------------------------------
# DeepFool: the overshoot scales the accumulated perturbation at every step


def _mlp_logits(params, x):
    return jnp.tanh(x.reshape(x.shape[0], -1) @ params["w1"] + params["b1"]) @ params["w2"]


def _recording_mlp_apply(params, x):
    logits = _mlp_logits(params, x)
    jax.debug.callback(functools.partial(_record, "forward"), x, logits, ordered=True)
    return logits


def _recording_mlp(seed=0, classes=3) -> rj.Classifier:
    """A small non-linear model (DeepFool's linearisation is exact on a linear one, which it
    crosses in one step)."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.normal(0, 2.0, (16, 8)), "b1": rng.normal(0, 1.0, 8), "w2": rng.normal(0, 2.0, (8, classes))}
    return rj.Classifier(params=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params),
                         apply_fn=_recording_mlp_apply, num_classes=classes, input_shape=(4, 4, 1), name="tanh_mlp")


def test_deepfool_overshoots_the_accumulated_perturbation_at_every_step():
    """Every DeepFool iterate from the one before, written out (the paper's multi-class
    step to the closest linearised boundary, l = argmin_k |f_k| / ||w_k||_2, r = |f_l| w_l /
    ||w_l||^2), with the overshoot applied as documented to the whole estimate
    ``x_i + r_i - x``: ``x_{i+1} = clip(x + (1 + overshoot)(x_i + r_i - x), 0, 1)``; an
    example freezes once misclassified. On this curved model most examples take several
    steps, so an overshoot of only the new step ``r_i`` is told apart from the second on."""
    clf = _recording_mlp()
    params = jax.tree.map(np.asarray, clf.params)
    x = np.random.default_rng(1).uniform(0.3, 0.7, (8, 4, 4, 1)).astype(np.float32)
    y = np.asarray(jnp.argmax(clf(x), -1)).astype(np.int32)
    overshoot, steps = 0.1, 6
    _clear()
    result = rj.attacks.DeepFool(norm="l2", steps=steps, overshoot=overshoot)(clf, x, y, key=jax.random.key(0))
    forward = _seen("forward")
    np.testing.assert_array_equal(forward[-1][0], result.x_adv)  # the final check
    iterates = [f[0] for f in forward[:-1]]
    np.testing.assert_array_equal(iterates[0], x)

    jacobian = jax.jit(jax.vmap(jax.jacrev(lambda z: _mlp_logits(params, z[None])[0])))
    moved_later = 0
    for before, after in zip(iterates, iterates[1:]):
        logits = np.asarray(_mlp_logits(params, before), np.float64)
        grads = np.asarray(jacobian(before), np.float64).reshape(len(x), 3, -1)
        for i in range(len(x)):
            if logits[i].argmax() != y[i]:  # done: frozen
                np.testing.assert_array_equal(after[i], before[i])
                continue
            others = [k for k in range(3) if k != y[i]]
            f = np.array([logits[i, k] - logits[i, y[i]] for k in others])
            w = np.stack([grads[i, k] - grads[i, y[i]] for k in others])
            l = np.argmin(np.abs(f) / np.linalg.norm(w, axis=1))
            r = (np.abs(f[l]) / np.sum(w[l] ** 2) * w[l]).reshape(x.shape[1:])
            expected = np.clip(x[i] + (1 + overshoot) * (before[i] + r - x[i]), 0, 1)
            np.testing.assert_allclose(after[i], expected, atol=2e-5)
            moved_later += not np.array_equal(before[i], x[i])
    assert moved_later >= 4  # second and later steps of unfooled examples were compared


# ---------------------------------------------------------------------------------------
# FAB: the biased, extrapolated step and the pull-back of every iteration


def test_fab_iterates_follow_the_authors_step_and_pull_back():
    """FAB (l2) on a binary linear model, where the linearisation is exact and, inside the
    box, both projections onto the boundary are ``d = -gap(p) g / ||g||^2``. Every iterate
    from the one before, as in the authors' ``attack_single_run`` (fab_base.py)::

        alpha = min(max(a1 / (a1 + a2), 0), alpha_max)        # a = ||d||, at least 1e-8
        x1 = clamp((x1 + eta d1) (1 - alpha) + (x + eta d2) alpha, 0, 1)
        if adversarial: x1 = x + (x1 - x) beta

    and the result is the closest adversarial point over the steps (``eps`` large)."""
    rng = np.random.default_rng(2)
    v = rng.normal(size=16)
    clf = _recording_linear(np.stack([np.zeros(16), v], 1), [0.0, -0.5 * v.sum()])
    unit = v / np.linalg.norm(v)
    x = (0.5 + np.outer([0.2, -0.15, 0.1, -0.25], unit) + rng.uniform(-0.1, 0.1, (4, 16))).astype(np.float32)
    x = x.reshape(4, 4, 4, 1)
    gap_of = lambda p: p.reshape(len(p), -1).astype(np.float64) @ v - 0.5 * v.sum()  # noqa: E731
    y = (gap_of(x) > 0).astype(np.int32)
    g = np.where(y == 0, 1.0, -1.0)[:, None] * v  # gradient of f_t - f_y, t the other class
    alpha_max, eta, beta, steps = 0.05, 1.3, 0.6, 6  # alpha_max binds after the first pull-back
    _clear()
    result = rj.attacks.FAB(eps=1.0, norm="l2", steps=steps, alpha_max=alpha_max, eta=eta, beta=beta)(
        clf, x, y, key=jax.random.key(0))
    forward = _seen("forward")
    # the clean call that ranks the targets, then per step the linearisation and the check
    assert len(forward) == 2 + 2 * steps
    np.testing.assert_array_equal(forward[-1][0], result.x_adv)
    linearised = [f[0].reshape(4, -1).astype(np.float64) for f in forward[1:-1:2]]
    checked = [f for f in forward[2:-1:2]]
    flat = x.reshape(4, -1).astype(np.float64)

    def projection(p):
        value = gap_of(p) * np.where(y == 0, 1.0, -1.0)  # f_t - f_y at p
        return -value[:, None] * g / np.sum(g * g, axis=1, keepdims=True)

    np.testing.assert_array_equal(linearised[0], flat)
    best, best_distance, pulled = flat.copy(), np.full(4, np.inf), 0
    for k in range(steps):
        x1 = linearised[k]
        d1, d2 = projection(x1), projection(flat)
        a1 = np.maximum(np.linalg.norm(d1, axis=1), 1e-8)[:, None]
        a2 = np.maximum(np.linalg.norm(d2, axis=1), 1e-8)[:, None]
        alpha = np.minimum(np.maximum(a1 / (a1 + a2), 0.0), alpha_max)
        x1 = np.clip((x1 + eta * d1) * (1 - alpha) + (flat + d2 * eta) * alpha, 0.0, 1.0)
        point, logits = checked[k]
        np.testing.assert_allclose(point.reshape(4, -1), x1, atol=1e-5)
        adversarial = logits.argmax(1) != y
        distance = np.linalg.norm(point.reshape(4, -1).astype(np.float64) - flat, axis=1)
        closer = adversarial & (distance < best_distance)
        best[closer], best_distance[closer] = point.reshape(4, -1)[closer], distance[closer]
        x1[adversarial] = flat[adversarial] + (x1[adversarial] - flat[adversarial]) * beta
        pulled += adversarial.sum()
        if k + 1 < steps:
            np.testing.assert_allclose(linearised[k + 1], x1, atol=1e-5)
    assert pulled >= 8 and np.isfinite(best_distance).all()
    np.testing.assert_array_equal(np.asarray(result.x_adv).reshape(4, -1), best.astype(np.float32))


# ---------------------------------------------------------------------------------------
# HopSkipJump: per iteration, the gradient samples, delta, and the geometric step search


def _recording_slab_apply(params, x):
    gap = x.reshape(x.shape[0], -1) @ params["v"] - params["c"]
    logits = jnp.stack([jnp.zeros_like(gap), params["a"] ** 2 - gap**2], axis=1)
    jax.debug.callback(functools.partial(_record, "forward"), x, logits, ordered=True)
    return logits


class _RecordedHSJA(HopSkipJump):
    """HopSkipJump recording the arguments of every gradient estimate and step search."""

    def estimate_direction(self, classifier, x_b, y, target, key, delta, num_eval, active, queries, limit):
        jax.debug.callback(functools.partial(_record, "estimate"), x_b, delta, num_eval, active, ordered=True)
        return super().estimate_direction(classifier, x_b, y, target, key, delta, num_eval, active, queries, limit)

    def geometric_step(self, classifier, x_b, direction, step, y, target, active, queries, limit):
        stepped, moved, queries = super().geometric_step(classifier, x_b, direction, step, y, target, active,
                                                         queries, limit)
        jax.debug.callback(functools.partial(_record, "step"), x_b, direction, step, stepped, moved, ordered=True)
        return stepped, moved, queries


def test_hsja_sample_count_delta_and_step_search_follow_the_reference_schedule():
    """ART's ``HopSkipJump._attack`` (the authors' order of the steps): at iteration t
    (from 0) ``num_eval = min(int(init_eval sqrt(t + 1)), max_eval)``, ``delta = 0.1`` at
    t = 0 then ``sqrt(d) theta dist`` with ``theta = 0.01 / sqrt(d)``, and the step search
    starts at ``epsilon = dist / sqrt(t + 1)``, halving until ``x_b + epsilon v`` is
    adversarial (the first adversarial one is taken)."""
    # Class 1 on a slab |v.x - c| < a, narrower than the first steps: they overshoot it.
    rng = np.random.default_rng(3)
    v, a = rng.normal(size=16), 0.3
    c = 0.5 * v.sum()
    clf = rj.Classifier(params={"v": jnp.asarray(v, jnp.float32), "c": jnp.float32(c), "a": jnp.float32(a)},
                        apply_fn=_recording_slab_apply, num_classes=2, input_shape=(4, 4, 1), name="slab")
    unit = v / np.linalg.norm(v)
    x = (0.5 + np.outer([0.3, -0.25], unit) + rng.uniform(-0.1, 0.1, (2, 16))).astype(np.float32).reshape(2, 4, 4, 1)
    y = np.zeros(2, np.int32)
    assert (np.abs(x.reshape(2, -1) @ v - c) > 3 * a).all()
    init_eval, max_eval, iterations, dim = 4, 11, 10, 16
    attack = _RecordedHSJA(norm="l2", max_queries=100_000, max_iter=iterations, init_eval=init_eval, max_eval=max_eval)
    _clear()
    attack(clf, x, y, key=jax.random.key(0))
    estimates, searches = _seen("estimate"), _seen("step")
    assert len(estimates) == len(searches) == iterations
    flat = x.reshape(2, -1).astype(np.float64)
    halvings = []
    for t, ((x_b, delta, num_eval, active), (x_b2, direction, step, stepped, moved)) in enumerate(
            zip(estimates, searches, strict=True)):
        assert active.all() and moved.all()
        np.testing.assert_array_equal(x_b, x_b2)
        assert int(num_eval) == min(int(init_eval * math.sqrt(t + 1)), max_eval)
        dist = np.linalg.norm(x_b.reshape(2, -1) - flat, axis=1)
        np.testing.assert_allclose(delta, 0.1 if t == 0 else math.sqrt(dim) * (0.01 / math.sqrt(dim)) * dist,
                                   rtol=1e-5)
        np.testing.assert_allclose(step, dist / math.sqrt(t + 1), rtol=1e-5)
        for i in range(2):  # the accepted epsilon is step / 2^k, the first adversarial of the halvings
            epsilons = step[i] / 2.0 ** np.arange(40)
            points = x_b[i].reshape(-1) + epsilons[:, None] * direction[i].reshape(-1)
            adversarial = np.abs(points @ v - c) < a
            k = int(np.argmax(adversarial))
            np.testing.assert_allclose(stepped[i].reshape(-1), np.clip(points[k], 0, 1), atol=1e-6)
            halvings.append(k)
    assert 0 in halvings and max(halvings) >= 1  # both a first try accepted and halvings
    # The images the model saw for each estimate (calls of init_eval images per example,
    # placeholders aside): num_eval per example.
    sampled, counts = None, []
    for kind, *arrays in _seen("all"):
        if kind == "estimate":
            sampled = np.zeros(2, int)
            counts.append(sampled)
        elif kind == "forward" and sampled is not None and len(arrays[0]) == 2 * init_eval:
            sampled += (arrays[0].reshape(2, init_eval, -1) != -1).any(-1).sum(1)
    np.testing.assert_array_equal(counts, [[int(e[2])] * 2 for e in estimates])


# ---------------------------------------------------------------------------------------
# RayS: the hierarchical order of the blocks flipped, and which flips are kept


def _authors_rays(x, adversarial, queries):
    """The authors' ``RayS_Single.attack_hard_label`` (uclaml/RayS) on one flattened image,
    transcribed: the ray (signs) and linf radius of each of the first ``queries`` queries."""
    dim = len(x)
    sgn_t, d_t, asked = np.ones(dim), np.inf, []

    def search_succ(sgn, radius):  # the query at clip(x + radius * sgn)
        asked.append((sgn.copy(), radius))
        return adversarial(np.clip(x + radius * sgn, 0.0, 1.0))

    def binary_search(sgn, tol=1e-3):
        nonlocal sgn_t, d_t
        norm = np.sqrt(dim)  # ||sgn||_2: a radius d along sgn / ||sgn|| is d / norm in linf
        d_start = 0.0
        if d_t < np.inf:
            if not search_succ(sgn, d_t / norm):
                return
            d_end = d_t
        else:
            d = next((d for d in range(1, 11) if search_succ(sgn, d)), np.inf)  # lin_search
            if d == np.inf:
                return
            d_end = d * norm
        while d_end - d_start > tol:
            d_mid = (d_start + d_end) / 2.0
            if search_succ(sgn, d_mid / norm):
                d_end = d_mid
            else:
                d_start = d_mid
        if d_end < d_t:
            d_t, sgn_t = d_end, sgn

    block_level = block_ind = 0
    while len(asked) < queries:
        block_size = int(np.ceil(dim / 2**block_level))
        start, end = block_ind * block_size, min(dim, (block_ind + 1) * block_size)
        attempt = sgn_t.copy()
        attempt[start:end] *= -1.0
        binary_search(attempt)
        block_ind += 1
        if block_ind == 2**block_level or end == dim:
            block_level, block_ind = block_level + 1, 0
    return asked[:queries]


def test_rays_flips_blocks_in_the_authors_hierarchical_order():
    """Every query's ray (the sign of its offset from x) and radius equal the authors'
    loop: at level s the image is cut into 2^s blocks of ceil(D / 2^s) coordinates (D = 20,
    not a power of two, so the last block of a level is short or the level ends early), a
    flip is checked at the best radius and bisected only when that point is adversarial,
    and kept when it shortens the ray."""
    rng = np.random.default_rng(5)
    v = rng.normal(size=20)
    v *= np.sign(v.sum())  # the black image is class 0
    clf = _recording_linear(np.stack([np.zeros(20), v], 1), [0.0, -0.5 * v.sum()], input_shape=(4, 5, 1))
    x = (0.5 + 0.1 * np.sign(v) * (rng.uniform(size=20) < 0.8) + rng.uniform(-0.05, 0.05, 20)).astype(np.float32)

    def label(image):
        return int(image.reshape(-1).astype(np.float64) @ v - 0.5 * v.sum() > 0)

    y = label(x)
    assert y == 1 and label(np.zeros(20)) != y  # the first ray, all -1, is adversarial at radius 1
    budget = 150
    _clear()
    result = rj.attacks.RayS(max_queries=budget)(clf, x.reshape(1, 4, 5, 1), np.array([y], np.int32),
                                                 key=jax.random.key(0))
    forward = [f[0].reshape(-1) for f in _seen("forward")]
    np.testing.assert_array_equal(forward[:2], [x, x])  # the probability probe, the clean check
    np.testing.assert_array_equal(forward[-1], np.asarray(result.x_adv).reshape(-1))  # the final check
    queried = forward[2:-1]
    assert len(queried) == budget - 2
    expected = _authors_rays(x.astype(np.float64), lambda image: label(image) != y, len(queried))
    for image, (signs, radius) in zip(queried, expected, strict=True):
        np.testing.assert_array_equal(np.sign(image - x), signs)
        np.testing.assert_allclose(image, np.clip(x + radius * signs, 0.0, 1.0), atol=1e-6)
    flips = [np.flatnonzero(s != e) for (s, _), (e, _) in zip(expected, expected[1:]) if not np.array_equal(s, e)]
    assert len(flips) > 20 and len({tuple(f) for f in flips}) > 10  # many blocks of several levels


# ---------------------------------------------------------------------------------------
# NES: antithetic probes and the momentum of the step direction, iteration by iteration


def test_nes_steps_follow_the_authors_momentum_on_antithetic_estimates():
    """Ilyas et al.'s NES loop (``attacks.py`` of their code): the probes of an iteration are
    antithetic pairs ``x' +- sigma u_k`` around the current point; the estimate is
    ``g = sum_k (f(x' + sigma u_k) - f(x' - sigma u_k)) u_k / (2 n sigma)``, the direction
    ``m <- beta m + (1 - beta) g``, and the next point the projected step along ``m``. The
    ``u_k`` and the ``f`` values are read from what the model saw; each next point must be
    the transcription's (l2 steps, whose direction is continuous in ``m``)."""
    rng = np.random.default_rng(6)
    v = rng.normal(size=16)
    clf = _recording_linear(np.stack([np.zeros(16), v], 1), [0.0, -0.5 * v.sum()])
    unit = v / np.linalg.norm(v)
    x = (0.5 + np.outer([0.3, -0.3], unit) + rng.uniform(-0.1, 0.1, (2, 16))).astype(np.float32).reshape(2, 4, 4, 1)
    y = (x.reshape(2, -1) @ v - 0.5 * v.sum() > 0).astype(np.int32)
    samples, sigma, beta, alpha, eps, iterations = 4, 0.01, 0.6, 0.05, 1.0, 5
    attack = rj.attacks.NES(eps=eps, norm="l2", samples=samples, sigma=sigma, step_size=alpha, momentum=beta,
                            max_queries=2 + (2 * samples + 1) * iterations)
    _clear()
    result = attack(clf, x, y, key=jax.random.key(0))
    calls = _seen("forward")[2:-1]  # after the probability probe and the clean check, before the final check
    assert len(calls) == 2 * iterations
    flat = x.reshape(2, -1).astype(np.float64)
    current, momentum = flat.copy(), np.zeros_like(flat)
    for t in range(iterations):
        (probes, probe_logits), (point, point_logits) = calls[2 * t], calls[2 * t + 1]
        probes = probes.reshape(2, 2 * samples, -1).astype(np.float64)
        u = (probes[:, :samples] - current[:, None]) / sigma
        np.testing.assert_allclose(probes[:, samples:], current[:, None] - sigma * u, atol=1e-6)  # antithetic
        logits = probe_logits.reshape(2, 2 * samples, 2).astype(np.float64)
        f = -(logits[..., 0] - logits[..., 1]) * np.where(y == 0, 1.0, -1.0)[:, None]  # minus the margin
        g = np.einsum("bk,bkd->bd", f[:, :samples] - f[:, samples:], u) / (2 * samples * sigma)
        momentum = beta * momentum + (1 - beta) * g
        step = current + alpha * momentum / np.linalg.norm(momentum, axis=1, keepdims=True)
        delta = step - flat
        delta *= np.minimum(1.0, eps / np.linalg.norm(delta, axis=1, keepdims=True))
        current = np.clip(flat + delta, 0.0, 1.0)
        np.testing.assert_allclose(point.reshape(2, -1), current, atol=2e-5)
        assert (point_logits.argmax(1) == y).all()  # still searching: every iteration moves both
    np.testing.assert_allclose(np.asarray(result.x_adv).reshape(2, -1), current, atol=2e-5)


# ---------------------------------------------------------------------------------------
# SimBA: each coordinate once, in a random order, -epsilon tried before +epsilon


def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_simba_pixel_tries_each_coordinate_once_in_random_order_minus_then_plus():
    """The authors' ``simba_single`` (cg563/simple-blackbox-attack) in the pixel basis::

        diff[perm[i]] = epsilon
        left_prob = get_probs((x - diff).clamp(0, 1), y)
        if left_prob < last_prob: x, last_prob = (x - diff).clamp(0, 1), left_prob
        else: right_prob = get_probs((x + diff).clamp(0, 1), y); keep it if lower

    replayed on what the model saw: every query moves one coordinate of the current point,
    the coordinates of an example form a random permutation (each example its own), the
    plus side is asked only after the minus side failed, and the kept point is the rule's.
    The model's confidence stays moderate, so that float32 and float64 agree on each
    comparison."""
    rng = np.random.default_rng(7)
    v = 0.4 * rng.normal(size=16)
    clf = _recording_linear(np.stack([np.zeros(16), v], 1), [0.0, -0.5 * v.sum()])
    unit = v / np.linalg.norm(v)
    x = (0.5 + np.outer([0.35, -0.3], unit) + rng.uniform(-0.1, 0.1, (2, 16))).astype(np.float32)
    y = (x @ v - 0.5 * v.sum() > 0).astype(np.int32)
    step = 0.1
    attack = rj.attacks.SimBA(basis="pixel", step_size=step, max_queries=2 + 2 * 16)
    _clear()
    result = attack(clf, x.reshape(2, 4, 4, 1), y, key=jax.random.key(0))
    calls = [(images.reshape(2, -1), logits) for images, logits in _seen("forward")]
    np.testing.assert_array_equal(calls[1][0], x)  # the clean check, after the probability probe
    last = _softmax(calls[1][1].astype(np.float64))[np.arange(2), y]
    final = calls[-1][0]
    calls = collections.deque(calls[2:-1])
    current = x.astype(np.float64)
    order, done, kept_plus = [[], []], np.zeros(2, bool), 0
    while calls:
        images, logits = calls.popleft()
        searching = ~done
        probability = _softmax(logits.astype(np.float64))[np.arange(2), y]
        margin_negative = logits.argmax(1) != y
        changed = [np.flatnonzero(np.abs(images[i] - current[i]) > 1e-7) for i in range(2)]
        up_needed = np.zeros(2, bool)
        assert (images[done] == -1).all()  # a finished example sends placeholders, not queries
        for i in np.flatnonzero(searching):
            assert len(changed[i]) == 1
            k = changed[i][0]
            order[i].append(k)
            np.testing.assert_allclose(images[i][k], np.clip(current[i][k] - step, 0, 1), atol=1e-6)  # minus first
            if probability[i] < last[i] or margin_negative[i]:
                current[i], last[i], done[i] = images[i], probability[i], margin_negative[i]
            else:
                up_needed[i] = True
        if up_needed.any():
            images, logits = calls.popleft()
            probability = _softmax(logits.astype(np.float64))[np.arange(2), y]
            assert (images[~up_needed] == -1).all()
            for i in np.flatnonzero(up_needed):
                k = order[i][-1]
                expected = current[i].copy()
                expected[k] = np.clip(current[i][k] + step, 0, 1)
                np.testing.assert_allclose(images[i], expected, atol=1e-6)  # then plus, on the same coordinate
                if probability[i] < last[i] or logits[i].argmax() != y[i]:
                    current[i], last[i], done[i] = images[i], probability[i], logits[i].argmax() != y[i]
                    kept_plus += 1
    np.testing.assert_allclose(final, current, atol=1e-6)
    np.testing.assert_allclose(np.asarray(result.x_adv).reshape(2, -1), current, atol=1e-6)
    for i in range(2):
        assert len(set(order[i])) == len(order[i]) >= 8  # never a coordinate twice
        assert order[i] != sorted(order[i])  # shuffled
    assert order[0][:8] != order[1][:8] and kept_plus > 0


# ---------------------------------------------------------------------------------------
# ImageNet-C: every corruption's constants at every severity 1-5


def _reference_table(function, variable: str):
    """The per-severity list ``variable = [...][severity - 1]`` of an ``imagecorruptions``
    function, read from its source."""
    for node in ast.walk(ast.parse(inspect.getsource(function))):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [variable]:
            table = node.value.value if isinstance(node.value, ast.Subscript) else node.value
            return eval(compile(ast.Expression(table), "<imagecorruptions>", "eval"), {"np": np})  # noqa: S307
    raise AssertionError(f"no table {variable} in {function.__name__}")


def test_every_imagenet_c_severity_table_is_imagecorruptions():
    """The five ImageNet constants of each of the 19 corruptions against the tables inside
    ``imagecorruptions`` 1.1.2 (the output tests compare severities 1 and 5, or 1, 3 and 5,
    so a slip at severity 2 or 4 would pass them). Frost's third value (the texture's
    scale) and elastic's layout are the library's: elastic stores ``alpha`` times the
    reference's field amplitude ``0.005 H``, and its ``sigma`` of 1 % of the side."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pkg_resources deprecation, inside imagecorruptions
        reference = pytest.importorskip("imagecorruptions.corruptions")
    names = rj.noise.names()
    assert len(names) == 19
    for name in names:
        ours = rj.noise.get(name).constants["imagenet"]
        if name == "elastic_transform":
            alphas = _reference_table(reference.elastic_transform, "alpha")
            np.testing.assert_allclose(ours, [(alpha * 0.005, 0.01, 0.0) for alpha in alphas], rtol=1e-12)
            continue
        theirs = _reference_table(getattr(reference, name), "c")
        assert len(theirs) == len(ours) == 5, name
        for severity, (mine, its) in enumerate(zip(ours, theirs, strict=True), 1):
            mine = np.atleast_1d(np.asarray(mine, np.float64))
            its = np.atleast_1d(np.asarray(its, np.float64))
            if name == "frost":
                mine = mine[:2]
            assert mine.shape == its.shape, (name, severity)
            np.testing.assert_allclose(mine, its, rtol=1e-12, err_msg=f"{name} severity {severity}")


# ---------------------------------------------------------------------------------------
# Adversarial training: the inner attack each technique runs inside the training step


class _TinyNet(nnx.Module):
    def __init__(self, *, rngs):
        self.linear = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.linear(x.reshape(x.shape[0], -1))


@dataclasses.dataclass(frozen=True)
class _RecordedPGD(PGD):
    """PGD recording every step it takes: the step index, the image, and the iterate
    before and after the step."""

    def update(self, x, step, x_adv, grad, carry):
        moved, carry = super().update(x, step, x_adv, grad, carry)
        jax.debug.callback(functools.partial(_record, "pgd"), step, x, x_adv, moved)
        return moved, carry


# The papers' inner attacks (linf): eps, steps, step size, as the techniques describe them.
PUBLISHED_ATTACKS = {
    "pgd_at": (16 / 255, 20, 16 / 255 / 15),  # RobustART
    "madry": (8 / 255, 7, 2 / 255),  # Madry et al. 2018, CIFAR-10
    "trades": (8 / 255, 10, 2 / 255),  # Zhang et al. 2019: 0.031, 10 steps of 0.007
    "fast_at": (8 / 255, 1, 10 / 255),  # Wong et al. 2020: alpha = 1.25 eps from a uniform start
}


@pytest.mark.parametrize("technique", sorted(PUBLISHED_ATTACKS))
def test_adversarial_training_runs_the_published_inner_attack(technique, monkeypatch):
    """One training step of each adversarial technique, with the PGD it builds recording its
    iterates: as many steps as published, each moving a coordinate by at most the published
    step size and some coordinate by exactly that (the image lies far inside the box), from
    a start inside the eps-ball, and never leaving it."""
    eps, steps, step_size = PUBLISHED_ATTACKS[technique]
    monkeypatch.setattr(train_step, "PGD", _RecordedPGD)
    clf = rj.Classifier.from_nnx(_TinyNet(rngs=nnx.Rngs(0)), num_classes=3, input_shape=(4, 4, 1))
    recipe = training.Recipe(steps=2, batch_size=4, warmup_epochs=0, ema_decay=None)
    model = TrainModel.from_classifier(clf)
    optimizer, step = train_step.make_step.__wrapped__(model, recipe, training.techniques.create(technique), 4)
    state = train_step.init_state(model, optimizer, recipe)
    x = jax.random.uniform(jax.random.key(1), (4, 4, 4, 1), minval=0.3, maxval=0.7)
    _clear()
    jax.block_until_ready(step(state, x, jnp.array([0, 1, 2, 1]), jax.random.key(0)))
    records = sorted(_seen("pgd"), key=lambda r: int(r[0]))
    assert [int(r[0]) for r in records] == list(range(steps))
    for index, image, before, after in records:
        np.testing.assert_allclose(image, x, atol=1e-7)
        if index == 0:
            start = np.abs(before - image)
            assert start.max() <= eps + 1e-6 and start.max() > 0.9 * eps  # random start in the ball
        moved = np.abs(after - before)
        assert moved.max() <= step_size + 1e-6 and moved.max() >= step_size - 1e-6, (technique, moved.max())
        assert np.abs(after - image).max() <= eps + 1e-6


# ---------------------------------------------------------------------------------------
# The learning rate the optimizer applies at every step


def test_sgd_applies_the_warmup_then_cosine_learning_rate_at_every_step():
    """RobustART's schedule, as the recipe documents it: linear warm-up from ``warmup_from``
    to ``learning_rate`` over ``warmup_epochs``, then cosine decay to
    ``final_learning_rate`` at the last step. With no momentum and no weight decay, SGD's
    update on a unit gradient is minus the learning rate of that step."""
    recipe = training.Recipe(learning_rate=0.4, warmup_from=0.1, final_learning_rate=0.01, warmup_epochs=2, epochs=10,
                             batch_size=8, momentum=0.0, nesterov=False, weight_decay=0.0)
    examples = 36  # 4 steps per epoch (the last partial batch dropped): 40 steps, 8 of warm-up
    total, warmup = 40, 8
    optimizer = recipe.make_optimizer(examples)
    params = jnp.zeros(1)
    opt_state = optimizer.init(params)
    applied = []
    for _ in range(total):
        updates, opt_state = optimizer.update(jnp.ones(1), opt_state, params)
        applied.append(-float(updates[0]))
    expected = [0.1 + (0.4 - 0.1) * t / warmup if t < warmup else
                0.01 + (0.4 - 0.01) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2
                for t in range(total)]
    np.testing.assert_allclose(applied, expected, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Mixup's lambda and CutMix's box


def test_mixup_lambda_is_beta_02_and_cutmix_box_is_the_authors():
    """The training step's mixing (``mixup_or_cutmix`` with its defaults): Mixup's lambda,
    read per draw from the label of an example paired with another, is Beta(0.2, 0.2)
    (Zhang et al.). CutMix's box for a given lambda is the authors' ``rand_bbox``
    (clovaai/CutMix-PyTorch): sides ``int(H sqrt(1 - lam))`` and ``int(W sqrt(1 - lam))``
    about a uniform integer centre, ``[c - cut // 2, c + cut // 2)`` clipped to the image."""
    from scipy import stats

    from robustjax.training import mixing

    x = jnp.broadcast_to(jnp.arange(3.0)[:, None, None, None] / 2, (3, 2, 2, 1))
    labels = jax.nn.one_hot(jnp.arange(3), 3)

    @jax.jit
    def lambdas(keys):
        mixed = jax.vmap(lambda k: mixing.mixup_or_cutmix(k, x, labels, use_mixup=True, use_cutmix=False)[1])(keys)
        return jnp.min(jnp.diagonal(mixed, axis1=1, axis2=2), axis=1)  # lam unless the permutation is the identity

    lam = np.asarray(lambdas(jax.random.split(jax.random.key(0), 3000)))
    lam = lam[lam < 1.0]
    assert len(lam) > 2000
    assert stats.kstest(lam, stats.beta(0.2, 0.2).cdf).pvalue > 1e-3
    assert stats.kstest(lam, stats.beta(1.0, 1.0).cdf).pvalue < 1e-6  # the test tells the two apart

    height, width = 12, 9
    draw_boxes = jax.jit(jax.vmap(lambda k, lam: mixing.cutmix_box(k, height, width, lam), in_axes=(0, None)))
    for value in (0.1, 0.3, 0.64, 0.9):
        boxes = np.asarray(draw_boxes(jax.random.split(jax.random.key(1), 400), jnp.float32(value)))
        cut_h, cut_w = int(height * math.sqrt(1 - value)), int(width * math.sqrt(1 - value))
        authors = collections.defaultdict(set)  # every box the authors' code can draw -> its centres
        for cy in range(height):
            for cx in range(width):
                authors[_authors_box(cy, cx, cut_h, cut_w, height, width).tobytes()].add((cy, cx))
        drawn = [authors.get(box.astype(np.float32).tobytes()) for box in boxes]
        assert all(drawn), value
        # the centre is uniform: the boxes drawn cover most of the possible ones
        assert len(set().union(*drawn)) > 0.8 * height * width, value


def _authors_box(cy, cx, cut_h, cut_w, height, width):
    box = np.zeros((height, width), np.float32)
    box[np.clip(cy - cut_h // 2, 0, height):np.clip(cy + cut_h // 2, 0, height),
        np.clip(cx - cut_w // 2, 0, width):np.clip(cx + cut_w // 2, 0, width)] = 1.0
    return box
