"""RobustART's AR, WCAR, mFR and mT5D: hand-computed values, streaming, merge, jit, bad input."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from robustjax.metrics import robustart as ra
from robustjax.noise import flip

# Ratios of small integer counts in float32: 1e-6 relative.
TOL = {"rtol": 1e-6}

CLEAN = jnp.array([True, True, True, False, True, False])
# attack 0 keeps samples 0, 2 (and the clean-wrong 3); attack 1 keeps 0, 1, 4
ADV = jnp.array([[True, False, True, True, False, False],
                 [True, True, False, False, True, False]])


def test_ar_hand_computed():
    # 4 clean-correct samples; attack 0 keeps 2 of them, attack 1 keeps 3
    np.testing.assert_allclose(ra.adversarial_robustness(CLEAN, ADV[0]), 2 / 4, **TOL)
    np.testing.assert_allclose(ra.adversarial_robustness(CLEAN, ADV), [2 / 4, 3 / 4], **TOL)
    # conditioned on clean-correct: not plain robust accuracy (3/6 for attack 1)
    np.testing.assert_allclose(ra.adversarial_robustness(CLEAN, ADV[1]), 3 / 4, **TOL)
    assert float(jnp.mean(ADV[1])) == 0.5


def test_wcar_hand_computed():
    # only sample 0 survives both attacks among the 4 clean-correct ones
    np.testing.assert_allclose(ra.worst_case_adversarial_robustness(CLEAN, ADV), 1 / 4, **TOL)
    # one attack: WCAR = AR
    np.testing.assert_allclose(ra.worst_case_adversarial_robustness(CLEAN, ADV[:1]), 2 / 4, **TOL)
    # integer 0/1 masks are accepted too
    np.testing.assert_allclose(ra.worst_case_adversarial_robustness(CLEAN.astype(int), ADV.astype(int)), 1 / 4, **TOL)


def test_streaming_equals_one_shot_and_merge_any_order():
    expected = {
        "clean_accuracy": 4 / 6,
        "adversarial_robustness": [2 / 4, 3 / 4],
        "worst_case_adversarial_robustness": 1 / 4,
    }
    parts = [ra.AdversarialRobustnessStats.empty(2).update(CLEAN[i : i + 2], ADV[:, i : i + 2]) for i in (0, 2, 4)]
    for order in itertools.permutations(parts):
        merged = order[0].merge(order[1]).merge(order[2])
        for name, value in merged.compute().items():
            np.testing.assert_allclose(value, expected[name], **TOL, err_msg=name)
    # psum-able: summing the stacked leaves of per-device stats is the same as merging
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *parts)
    summed = jax.tree.map(lambda x: x.sum(0), stacked)
    np.testing.assert_allclose(summed.compute()["worst_case_adversarial_robustness"], 1 / 4, **TOL)


def test_jit_equals_eager():
    for fn in (ra.adversarial_robustness, ra.worst_case_adversarial_robustness):
        np.testing.assert_allclose(jax.jit(fn)(CLEAN, ADV), fn(CLEAN, ADV), **TOL)
    stats = jax.jit(lambda s, c, a: s.update(c, a))(ra.AdversarialRobustnessStats.empty(2), CLEAN, ADV)
    traced, eager = jax.jit(lambda s: s.compute())(stats), stats.compute()
    for name in eager:
        np.testing.assert_allclose(traced[name], eager[name], **TOL)


def test_mean_flip_rate_and_top5_distance_hand_computed():
    fp = {"brightness": 0.2, "gaussian_noise": jnp.float32(0.1)}
    np.testing.assert_allclose(ra.mean_flip_rate(fp), 0.15, **TOL)
    alexnet = {"brightness": 0.4, "gaussian_noise": 0.5, "rotate": 0.3}  # extra entries are ignored
    np.testing.assert_allclose(ra.mean_flip_rate(fp, alexnet), (0.2 / 0.4 + 0.1 / 0.5) / 2, **TOL)
    np.testing.assert_allclose(ra.mean_top5_distance({"a": 1.0, "b": 3.0}, {"a": 2.0, "b": 2.0}), 1.0, **TOL)
    np.testing.assert_allclose(ra.normalized_mean(jnp.array([1.0, 3.0])), 2.0, **TOL)


def test_mean_flip_rate_from_flip_probabilities():
    # two perturbations measured with noise.flip: 1 flip in 3 comparisons, and none
    shifting = flip.flip_probability(jnp.array([[0, 0, 1, 1]]), noise_sequence=False)
    steady = flip.flip_probability(jnp.array([[2, 2, 2, 2]]), noise_sequence=True)
    np.testing.assert_allclose(ra.mean_flip_rate({"translate": shifting, "shot_noise": steady}), 1 / 6, **TOL)


@pytest.mark.parametrize(
    "clean, adv, match",
    [
        (CLEAN, ADV[:, :5], "adversarial_correct must have shape"),
        (CLEAN[None], ADV, r"clean_correct must have shape \(B,\)"),
        (jnp.zeros((0,), bool), jnp.zeros((0,), bool), "empty"),
        (jnp.zeros(6, bool), ADV, "undefined"),
        (CLEAN, ADV.astype(jnp.float32), "boolean"),
        (CLEAN, ADV.astype(int) * 2, "0 and 1"),
    ],
)
def test_bad_ar_input(clean, adv, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ra.adversarial_robustness(clean, adv)
    with pytest.raises((ValueError, TypeError), match=match):
        ra.worst_case_adversarial_robustness(clean, adv)


def test_bad_stats_use():
    with pytest.raises(ValueError, match="num_attacks"):
        ra.AdversarialRobustnessStats.empty(0)
    with pytest.raises(ValueError, match="attack"):
        ra.AdversarialRobustnessStats.empty(3).update(CLEAN, ADV)
    with pytest.raises(ValueError, match="merge"):
        ra.AdversarialRobustnessStats.empty(1).merge(ra.AdversarialRobustnessStats.empty(2))
    with pytest.raises(ValueError, match="no examples"):
        ra.AdversarialRobustnessStats.empty(1).compute()
    with pytest.raises(ValueError, match="undefined"):
        ra.AdversarialRobustnessStats.empty(2).update(jnp.zeros(6, bool), ADV).compute()


@pytest.mark.parametrize(
    "values, baseline, match",
    [
        ({}, None, "non-empty"),
        ({"a": 0.1}, {"b": 0.2}, "no value"),
        ({"a": 0.1}, {"a": 0.0}, "> 0"),
        ({"a": -0.1}, None, ">= 0"),
        ({"a": float("nan")}, None, "finite"),
    ],
)
def test_bad_perturbation_summaries(values, baseline, match):
    for fn in (ra.mean_flip_rate, ra.mean_top5_distance):
        with pytest.raises(ValueError, match=match):
            fn(values, baseline)
