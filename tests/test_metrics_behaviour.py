"""Model-behaviour metrics (CA, AAW/AAB, ASR, ACAC, ACTC, NTE, RGB, RIC, CAV, CRR, CSR, CCV, COS)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage
import scipy.spatial.distance

from robustjax.metrics import behaviour as bh
from robustjax.noise import jpeg_round_trip

# Hand-made softmax outputs; logits = log p, so softmax(logits) = p up to float32 rounding.
PROBS = np.array([
    [0.7, 0.2, 0.1],    # label 0: right
    [0.1, 0.6, 0.3],    # label 0: wrong (1)
    [0.25, 0.25, 0.5],  # label 1: wrong (2)
    [0.1, 0.8, 0.1],    # label 1: right
    [0.5, 0.3, 0.2],    # label 2: wrong (0)
])
DEFENDED = np.array([
    [0.5, 0.3, 0.2],    # right
    [0.6, 0.2, 0.2],    # right (rectified)
    [0.2, 0.7, 0.1],    # right (rectified)
    [0.6, 0.3, 0.1],    # wrong (sacrificed)
    [0.1, 0.6, 0.3],    # wrong, as the original
])
LABELS = jnp.array([0, 0, 1, 1, 2])
LOGITS, LOGITS_DEFENDED = jnp.log(jnp.asarray(PROBS, jnp.float32)), jnp.log(jnp.asarray(DEFENDED, jnp.float32))
# float32 softmax of log-probabilities reproduces them to a few ulp.
TOL = {"rtol": 1e-6, "atol": 1e-6}


def test_hand_computed_single_model():
    # success set S = {1, 2, 4}
    np.testing.assert_allclose(bh.accuracy(LOGITS, LABELS), 2 / 5, **TOL)
    np.testing.assert_allclose(bh.attack_success_rate(LOGITS, LABELS), 3 / 5, **TOL)
    np.testing.assert_allclose(bh.average_confidence_adversarial_class(LOGITS, LABELS), (0.6 + 0.5 + 0.5) / 3, **TOL)
    np.testing.assert_allclose(bh.average_confidence_true_class(LOGITS, LABELS), (0.1 + 0.25 + 0.2) / 3, **TOL)
    np.testing.assert_allclose(bh.noise_tolerance_estimation(LOGITS, LABELS), (0.3 + 0.25 + 0.2) / 3, **TOL)


def test_targeted_uses_target_for_success_and_true_label_for_actc():
    target = jnp.array([1, 2, 2, 0, 0])  # predictions 0, 1, 2, 1, 0: S = {2, 4}
    np.testing.assert_allclose(bh.attack_success_rate(LOGITS, LABELS, target), 2 / 5, **TOL)
    np.testing.assert_allclose(bh.average_confidence_adversarial_class(LOGITS, LABELS, target), 0.5, **TOL)
    # true classes 1 and 2 (not the targets, whose confidences are 0.5 and 0.5)
    np.testing.assert_allclose(bh.average_confidence_true_class(LOGITS, LABELS, target), (0.25 + 0.2) / 2, **TOL)


def test_hand_computed_blur_and_compression_survival():
    blurred = jax.nn.one_hot(jnp.array([1, 1, 1, 0, 2]), 3) * 5.0  # successful after: 0, 1, 3
    # S = {1, 2, 4}; of those only 1 survives. AISafety: 3 of all 5.
    for metric in (bh.robustness_to_gaussian_blur, bh.robustness_to_image_compression):
        np.testing.assert_allclose(metric(LOGITS, blurred, LABELS), 1 / 3, **TOL)
        np.testing.assert_allclose(metric(LOGITS, blurred, LABELS, toolkit_compat=True), 3 / 5, **TOL)


def test_hand_computed_defence_comparison():
    args = (LOGITS_DEFENDED, LOGITS, LABELS)
    np.testing.assert_allclose(bh.classification_accuracy_variance(*args), 3 / 5 - 2 / 5, **TOL)
    np.testing.assert_allclose(bh.classification_rectify_ratio(*args), 2 / 5, **TOL)
    np.testing.assert_allclose(bh.classification_sacrifice_ratio(*args), 1 / 5, **TOL)
    # both right: example 0 only; both wrong: example 4 only
    np.testing.assert_allclose(bh.classification_confidence_variance(*args), abs(0.5 - 0.7), **TOL)
    np.testing.assert_allclose(bh.classification_confidence_variance(*args, toolkit_compat=True), abs(0.3 - 0.2), **TOL)
    # scipy's jensenshannon is the square root of the divergence (natural log by default)
    jsd = lambda i: scipy.spatial.distance.jensenshannon(DEFENDED[i], PROBS[i]) ** 2
    np.testing.assert_allclose(bh.classification_output_stability(*args), jsd(0), rtol=1e-5)
    np.testing.assert_allclose(bh.classification_output_stability(*args, toolkit_compat=True), jsd(4), rtol=1e-5)


def _random_case(seed=0, n=40, k=10):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(size=(n, k)) * 3, jnp.float32)
    other = jnp.asarray(rng.normal(size=(n, k)) * 3, jnp.float32)
    labels = jnp.asarray(rng.integers(0, k, n), jnp.int32)
    # mostly right on `other`, so every comparison set is non-empty
    other = other.at[jnp.arange(n), labels].add(jnp.where(jnp.arange(n) % 3 == 0, 0.0, 8.0))
    return logits, other, labels


def test_jensen_shannon_matches_scipy():
    logits, other, _ = _random_case()
    p, q = jax.nn.softmax(logits), jax.nn.softmax(other)
    expected = [scipy.spatial.distance.jensenshannon(a, b) ** 2 for a, b in zip(np.float64(p), np.float64(q))]
    np.testing.assert_allclose(bh.jensen_shannon_divergence(p, q), expected, rtol=1e-4, atol=1e-7)


def _cases(logits, other, labels):
    """(accumulator, one-shot function, per-batch arguments, settings) for every metric."""
    single = (logits, labels)
    pair = (other, logits, labels)
    return [
        (bh.Accuracy, bh.accuracy, single, {}),
        (bh.AttackSuccessRate, bh.attack_success_rate, single, {}),
        (bh.AdversarialClassConfidence, bh.average_confidence_adversarial_class, single, {}),
        (bh.TrueClassConfidence, bh.average_confidence_true_class, single, {}),
        (bh.NoiseToleranceEstimation, bh.noise_tolerance_estimation, single, {}),
        (bh.TransformSurvival, bh.robustness_to_gaussian_blur, (logits, other, labels), {}),
        (bh.TransformSurvival, bh.robustness_to_image_compression, (logits, other, labels), {"toolkit_compat": True}),
        (bh.AccuracyVariation, bh.classification_accuracy_variance, pair, {}),
        (bh.RectifyRatio, bh.classification_rectify_ratio, pair, {}),
        (bh.SacrificeRatio, bh.classification_sacrifice_ratio, pair, {}),
        (bh.ConfidenceVariance, bh.classification_confidence_variance, pair, {}),
        (bh.ConfidenceVariance, bh.classification_confidence_variance, pair, {"toolkit_compat": True}),
        (bh.OutputStability, bh.classification_output_stability, pair, {}),
        (bh.OutputStability, bh.classification_output_stability, pair, {"toolkit_compat": True}),
    ]


def test_streaming_equals_one_shot_and_merge_order_is_free():
    logits, other, labels = _random_case()
    cuts = [slice(0, 13), slice(13, 30), slice(30, 40)]
    for accumulator, one_shot, args, kwargs in _cases(logits, other, labels):
        whole = one_shot(*args, **kwargs)
        a, b, c = (accumulator.empty(**kwargs).update(*(v[s] for v in args)) for s in cuts)
        # Sums of at most 40 float32 terms in different orders: agree to 1e-6 relative.
        for merged in (a.merge(b).merge(c), c.merge(a).merge(b), a.merge(b.merge(c)), b.merge(c).merge(a)):
            (value,) = merged.compute().values()
            np.testing.assert_allclose(value, whole, rtol=1e-6, atol=1e-7, err_msg=one_shot.__name__)
        streamed = a.update(*(v[cuts[1]] for v in args)).update(*(v[cuts[2]] for v in args))
        np.testing.assert_allclose(streamed.ratio(), whole, rtol=1e-6, atol=1e-7, err_msg=one_shot.__name__)


def test_jit_equals_eager():
    logits, other, labels = _random_case(1)
    for _, one_shot, args, kwargs in _cases(logits, other, labels):
        jitted = jax.jit(lambda *a, f=one_shot, kw=kwargs: f(*a, **kw))(*args)
        with jax.disable_jit():
            eager = one_shot(*args, **kwargs)
        # XLA may fuse the reductions differently from op-by-op execution: 1 ulp-level slack.
        np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-7, err_msg=one_shot.__name__)


def test_accumulator_is_a_pytree_that_jits_and_vmaps():
    logits, other, labels = _random_case(2)
    acc = jax.jit(lambda a, z, y: a.update(z, y))(bh.Accuracy.empty(), logits, labels)
    assert isinstance(acc, bh.Accuracy)
    np.testing.assert_allclose(acc.compute()["accuracy"], bh.accuracy(logits, labels))
    stacked = jax.vmap(bh.accuracy, in_axes=(0, None))(jnp.stack([logits, other]), labels)
    np.testing.assert_allclose(stacked, [bh.accuracy(logits, labels), bh.accuracy(other, labels)])


def test_rectify_minus_sacrifice_is_accuracy_variation():
    logits, other, labels = _random_case(3)
    crr = bh.classification_rectify_ratio(other, logits, labels)
    csr = bh.classification_sacrifice_ratio(other, logits, labels)
    np.testing.assert_allclose(crr - csr, bh.classification_accuracy_variance(other, logits, labels), atol=1e-6)
    np.testing.assert_allclose(crr - csr, bh.accuracy(other, labels) - bh.accuracy(logits, labels), atol=1e-6)


def test_confidence_gradients_are_finite():
    logits, _, labels = _random_case(4)
    grad = jax.grad(bh.average_confidence_true_class)(logits, labels)
    assert np.isfinite(grad).all() and np.abs(grad).sum() > 0


def test_transforms_for_rgb_and_ric():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.uniform(size=(2, 12, 12, 3)), jnp.float32)
    blurred = bh.blur_for_rgb(x, sigma=1.0)
    pixels = np.round(np.asarray(x, np.float64) * 255)
    expected = scipy.ndimage.gaussian_filter(pixels, sigma=(0, 1, 1, 0), mode="nearest", truncate=4.0)
    # 8-bit output: float32 vs float64 filtering may round a .5 value the other way (1 level).
    assert np.abs(np.asarray(blurred) * 255 - np.round(expected)).max() <= 1 + 1e-3
    np.testing.assert_array_equal(bh.compress_for_ric(x, 55), jpeg_round_trip(x, 55))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bh.accuracy(LOGITS[:4], LABELS), "labels must have shape"),
        (lambda: bh.accuracy(LOGITS[:0], LABELS[:0]), "B >= 1"),
        (lambda: bh.accuracy(LOGITS[0], LABELS[:1]), "shape \\(B, K\\)"),
        (lambda: bh.accuracy(LOGITS.at[1, 1].set(jnp.nan), LABELS), "NaN"),
        (lambda: bh.accuracy(LOGITS, LABELS + 1), "class indices"),
        (lambda: bh.accuracy(LOGITS, LABELS.astype(jnp.float32)), "integer"),
        (lambda: bh.accuracy(jnp.ones((5, 3), jnp.int32), LABELS), "floating point"),
        (lambda: bh.attack_success_rate(LOGITS, LABELS, LABELS), "target equals the true label"),
        (lambda: bh.classification_rectify_ratio(LOGITS_DEFENDED[:, :2], LOGITS, LABELS), "classes"),
        (lambda: bh.robustness_to_gaussian_blur(LOGITS, LOGITS[:4], LABELS), "examples"),
        (lambda: bh.average_confidence_adversarial_class(LOGITS[np.array([0, 3])], LABELS[np.array([0, 3])]), "success set S is empty"),
        (lambda: bh.noise_tolerance_estimation(LOGITS, LABELS, jnp.array([2, 2, 0, 0, 1])), "success set S is empty"),
        (lambda: bh.classification_confidence_variance(LOGITS_DEFENDED[:4], LOGITS[:4], LABELS[:4], toolkit_compat=True), "both"),
        (lambda: bh.Accuracy.empty().compute(), "no examples"),
        (lambda: bh.Accuracy.empty().merge(bh.RectifyRatio.empty()), "cannot merge"),
        (lambda: bh.ConfidenceVariance.empty().merge(bh.ConfidenceVariance.empty(toolkit_compat=True)), "settings"),
        (lambda: bh.OutputStability.empty(toolkit_compat=1), "toolkit_compat must be True or False"),
        (lambda: bh.blur_for_rgb(jnp.ones((1, 4, 4, 3)), sigma=0.0), "sigma"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
