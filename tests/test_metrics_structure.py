"""Structure metrics: EBD, EBD-2, ENI, neuron sensitivity and uncertainty."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from robustjax.losses import cross_entropy
from robustjax.metrics import coverage as cov
from robustjax.metrics import structure as st
from tests.helpers import linear_classifier

SHAPE = (2, 2, 1)


def constant_classifier():
    """Always predicts class 0."""
    return linear_classifier(np.zeros((4, 2)), np.array([1.0, 0.0]), SHAPE)


def test_ebd_of_a_constant_classifier(key):
    x = jnp.full((3,) + SHAPE, 0.5, jnp.float32)
    y = jnp.array([0, 1, 0], jnp.int32)
    d = st.boundary_distances(constant_classifier(), x, y, key=key, num_directions=4)
    # Never flips for label 0 (126/255); already wrong for label 1 (magnitude 0).
    np.testing.assert_allclose(d, [126 / 255, 0.0, 126 / 255], rtol=1e-6)


@pytest.mark.parametrize("images", [4, 32])  # 32: the pending images move on in a batch of 16
def test_ebd_matches_brute_force(digits_clf, digits_batch, key, images):
    x, y = jnp.asarray(digits_batch[0][:images]), jnp.asarray(digits_batch[1][:images])
    grid = np.arange(0, 255, 12) / 255  # 32 images: half of them flip by the 11th magnitude
    d = st.boundary_distances(digits_clf, x, y, key=key, num_directions=6, magnitudes=grid, direction_batch=4)
    # Reference: every (image, direction, magnitude), first flip per direction, min over directions.
    directions = st.random_directions(key, 6, x.shape[1:])
    np.testing.assert_allclose(np.sum(np.asarray(directions).reshape(6, -1) ** 2, 1), x[0].size, rtol=1e-4)
    flips = np.stack([[np.asarray(jnp.argmax(digits_clf(jnp.clip(x + m * dj, 0, 1)), -1)) != np.asarray(y)
                       for m in grid] for dj in directions])  # (M, G, B)
    first = np.where(flips.any(1), grid[np.argmax(flips, 1)], grid[-1])  # (M, B)
    np.testing.assert_allclose(d, first.min(0), rtol=1e-6)
    again = st.boundary_distances(digits_clf, x, y, key=key, num_directions=6, magnitudes=grid, direction_batch=4)
    np.testing.assert_array_equal(d, again)  # keyed


def test_ebd2_matches_the_plain_loop(digits_clf, digits_batch):
    """32 digits (the pending ones move to a batch of 16): each image's steps are those of
    sign-gradient steps on its own, until its prediction changes."""
    x, y = jnp.asarray(digits_batch[0]), jnp.asarray(digits_batch[1])
    steps, capped = st.boundary_steps(digits_clf, x, y, step_size=0.01, max_steps=40)

    def loss(z, label):
        return jnp.sum(cross_entropy(digits_clf(z[None]), label[None]))

    sign_step = jax.jit(lambda z, label: jnp.clip(z + 0.01 * jnp.sign(jax.grad(loss)(z, label)), 0.0, 1.0))
    predict = jax.jit(lambda z: jnp.argmax(digits_clf(z[None])))
    expected, expected_capped = [], []
    for image, label in zip(x, y):
        clean, z = predict(image), image
        for step in range(41):
            if predict(z) != clean:
                expected.append(step), expected_capped.append(False)
                break
            z = sign_step(z, label)
        else:
            expected.append(40), expected_capped.append(True)
    np.testing.assert_array_equal(steps, expected)
    np.testing.assert_array_equal(capped, expected_capped)
    assert 0 < sum(expected_capped) < len(y) and len(set(expected)) > 3, expected


def test_ebd2_hand_computed():
    # logits = [0, sum(x) - 2.1]; x = 0.5 (sum 2) is class 0. The CE gradient for label 0 is
    # positive on every pixel, so each step adds 4 * 0.01 to the sum: it passes 2.1 after 3.
    clf = linear_classifier(np.stack([np.zeros(4), np.ones(4)], 1), np.array([0.0, -2.1]), SHAPE)
    x = jnp.full((2,) + SHAPE, 0.5, jnp.float32)
    steps, capped = st.boundary_steps(clf, x, jnp.array([0, 0], jnp.int32), step_size=0.01, max_steps=10)
    np.testing.assert_array_equal(steps, [3, 3])
    assert not capped.any()
    steps, capped = st.boundary_steps(constant_classifier(), x, jnp.array([0, 0], jnp.int32), max_steps=5)
    np.testing.assert_array_equal(steps, [5, 5])
    assert capped.all()
    stats = st.BoundaryStepStats.empty().update(jnp.array([3, 5, 7]), jnp.array([False, True, False]))
    assert float(stats.compute()["ebd2"]) == pytest.approx(5.0)
    with_capped = st.BoundaryStepStats.empty(include_capped=True).update(jnp.array([3, 9, 7]), jnp.array([False, True, False]))
    assert float(with_capped.compute()["ebd2"]) == pytest.approx(19 / 3)
    assert float(stats.compute()["capped_fraction"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="max_steps"):
        st.BoundaryStepStats.empty().update(jnp.array([5]), jnp.array([True])).compute()


def eni_inputs():
    x = jnp.zeros((3,) + SHAPE, jnp.float32)
    x_noisy = x.at[0, 0, 0, 0].set(0.1).at[2].set(0.5)
    logits = jnp.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    logits_noisy = jnp.array([[np.log(3.0), 0.0], [1.0, 0.0], [0.0, 0.0]])
    return x, x_noisy, logits, logits_noisy, jnp.array([0, 0, 1], jnp.int32)


def test_eni_hand_computed():
    x, x_noisy, logits, logits_noisy, y = eni_inputs()
    ce = lambda z, t: np.log(np.exp(z).sum()) - z[t]
    clean = [ce(np.asarray(logits[i]), int(y[i])) for i in range(3)]
    noisy = [ce(np.asarray(logits_noisy[i]), int(y[i])) for i in range(3)]
    linf = [0.1, 0.0, 0.5]
    expected = [abs(clean[0] - noisy[0]) / 0.1, 0.0, abs(clean[2] - noisy[2]) / 0.5]
    np.testing.assert_allclose(st.noise_insensitivity(x, x_noisy, logits, logits_noisy, y), expected, rtol=1e-5)
    assert float(st.empirical_noise_insensitivity(x, x_noisy, logits, logits_noisy, y)) == pytest.approx(np.mean(expected), rel=1e-5)
    toolkit = abs(sum(clean) - sum(noisy)) / (3 * max(linf))
    assert float(st.empirical_noise_insensitivity(x, x_noisy, logits, logits_noisy, y, toolkit_compat=True)) == pytest.approx(toolkit, rel=1e-5)
    # Merge of parts in any order equals the whole.
    for compat in (False, True):
        whole = st.NoiseInsensitivityStats.empty(toolkit_compat=compat).update(x, x_noisy, logits, logits_noisy, y)
        parts = [st.NoiseInsensitivityStats.empty(toolkit_compat=compat).update(
            *(a[i:i + 1] for a in (x, x_noisy, logits, logits_noisy, y))) for i in range(3)]
        for order in itertools.permutations(parts):
            merged = order[0].merge(order[1]).merge(order[2])
            assert float(merged.compute()["eni"]) == pytest.approx(float(whole.compute()["eni"]), rel=1e-6)


def test_neuron_sensitivity_hand_computed():
    clean = {"conv": jnp.array([[[[1.0, 0.0], [3.0, 0.0]]], [[[0.0, 0.0], [0.0, 2.0]]]]), "fc": jnp.array([[1.0], [2.0]])}
    noisy = {"conv": jnp.zeros((2, 1, 2, 2)), "fc": jnp.array([[0.0], [4.0]])}
    # conv channel 0: mean |diff| per map = (1 + 3) / 2 and 0, mean over samples = 1.
    # conv channel 1: 0 and 2 / 2 = 1 -> 0.5.  fc: (1 + 2) / 2 = 1.5.
    out = st.neuron_sensitivity(clean, noisy)
    np.testing.assert_allclose(out["conv"], [1.0, 0.5])
    np.testing.assert_allclose(out["fc"], [1.5])
    assert float(st.mean_over_neurons(out)) == pytest.approx(1.0)
    widths = {"conv": 2, "fc": 1}
    halves = [st.NeuronSensitivityStats.empty(widths).update({n: v[i:i + 1] for n, v in clean.items()},
                                                           {n: v[i:i + 1] for n, v in noisy.items()}) for i in range(2)]
    for a, b in (halves, halves[::-1]):
        jax.tree.map(np.testing.assert_allclose, a.merge(b).per_neuron(), out)
        assert float(a.merge(b).compute()["neuron_sensitivity"]) == pytest.approx(1.0)


def test_neuron_uncertainty_streams_the_variance(digits_clf, digits_batch):
    values = cov.classifier_neurons(digits_clf, jnp.asarray(digits_batch[0]), ("block2", "fc1"))
    expected = {n: np.var(np.asarray(v, np.float64), axis=0) for n, v in values.items()}
    # float32 streaming (Chan's update) against a float64 two-pass variance.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), st.neuron_uncertainty(values), expected)
    widths = {n: v.shape[1] for n, v in values.items()}
    update = jax.jit(lambda acc, v: acc.update(v))
    parts = [update(st.NeuronUncertaintyStats.empty(widths), {n: v[i:i + 8] for n, v in values.items()}) for i in range(0, 32, 8)]
    for order in (parts, parts[::-1], [parts[2], parts[0], parts[3], parts[1]]):
        merged = order[0]
        for part in order[1:]:
            merged = merged.merge(part)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), merged.per_neuron(), expected)
    hand = st.neuron_uncertainty({"a": jnp.array([[1.0, 0.0], [3.0, 0.0]])})
    np.testing.assert_allclose(hand["a"], [1.0, 0.0])


def test_jit_equals_eager():
    x, x_noisy, logits, logits_noisy, y = eni_inputs()
    acc = st.NoiseInsensitivityStats.empty()
    eager = acc.update(x, x_noisy, logits, logits_noisy, y).compute()["eni"]
    jitted = jax.jit(lambda a, *args: a.update(*args).compute()["eni"])(acc, x, x_noisy, logits, logits_noisy, y)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)  # one fused division may differ by an ulp
    values = {"a": jnp.array([[1.0, 0.0], [3.0, 2.0]])}
    np.testing.assert_allclose(jax.jit(st.neuron_uncertainty)(values)["a"], st.neuron_uncertainty(values)["a"], rtol=1e-6)


def test_bad_input(key):
    clf = constant_classifier()
    x = jnp.full((2,) + SHAPE, 0.5, jnp.float32)
    y = jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match="num_directions"):
        st.boundary_distances(clf, x, y, key=key, num_directions=0)
    with pytest.raises(ValueError, match="exceeds"):
        st.boundary_distances(clf, x, y, key=key, num_directions=5)
    with pytest.raises(ValueError, match="increasing"):
        st.boundary_distances(clf, x, y, key=key, num_directions=2, magnitudes=[0.1, 0.0])
    with pytest.raises(ValueError, match="empty"):
        st.boundary_distances(clf, x[:0], y[:0], key=key, num_directions=2)
    with pytest.raises(ValueError, match="NaN"):
        st.boundary_steps(clf, x.at[0].set(jnp.nan), y)
    xs, x_noisy, logits, logits_noisy, ys = eni_inputs()
    with pytest.raises(ValueError, match="same shape"):
        st.noise_insensitivity(xs, x_noisy[:2], logits, logits_noisy, ys)
    with pytest.raises(ValueError, match="NaN"):
        st.noise_insensitivity(xs, x_noisy, logits.at[0, 0].set(jnp.nan), logits_noisy, ys)
    with pytest.raises(ValueError, match="no examples"):
        st.BoundaryDistanceStats.empty().compute()
    with pytest.raises(ValueError, match="no examples"):
        st.NeuronUncertaintyStats.empty({"a": 2}).compute()
    with pytest.raises(ValueError, match="differ"):
        st.neuron_sensitivity({"a": jnp.zeros((2, 3))}, {"a": jnp.zeros((2, 4))})
