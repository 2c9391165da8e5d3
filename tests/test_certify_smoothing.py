"""Randomized smoothing (robustjax.certify.smoothing): the paper's CERTIFY and PREDICT, ported
here from its code, on the same noise draws; a linear model's closed form; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import robustjax as rj
from robustjax import certify
from robustjax.certify.smoothing import ABSTAIN


def reference_counts(clf, x, sigma, num, key, draws_per_pass):
    """Cohen et al.'s ``_sample_noise``, one draw at a time, on the documented draws."""
    counts = np.zeros((len(x), clf.num_classes), int)
    for index in range(-(-num // draws_per_pass)):
        noise = sigma * jax.random.normal(jax.random.fold_in(key, index), (draws_per_pass,) + x.shape)
        for draw in range(draws_per_pass):
            if index * draws_per_pass + draw < num:
                predictions = np.asarray(jnp.argmax(clf(x + noise[draw]), axis=1))
                np.add.at(counts, (np.arange(len(x)), predictions), 1)
    return counts


def reference_certify(counts_selection, counts_estimation, n, alpha, sigma):
    """``Smooth.certify`` of the paper's code (core.py), for one image."""
    c_hat = counts_selection.argmax()
    n_a = counts_estimation[c_hat]
    p_a_bar = stats.beta.ppf(alpha, n_a, n - n_a + 1) if n_a > 0 else 0.0  # proportion_confint(2 alpha, "beta")
    if p_a_bar < 0.5:
        return ABSTAIN, 0.0
    return c_hat, sigma * stats.norm.ppf(p_a_bar)


def reference_predict(counts, alpha):
    """``Smooth.predict`` of the paper's code."""
    top2 = counts.argsort()[::-1][:2]
    count1, count2 = counts[top2[0]], counts[top2[1]]
    if stats.binomtest(count1, count1 + count2, p=0.5).pvalue > alpha:
        return ABSTAIN
    return top2[0]


def test_certify_and_predict_equal_the_papers_code_on_the_same_draws(digits_clf, digits_batch):
    x = jnp.asarray(digits_batch[0][:12])
    sigma, n0, n, alpha, per_pass = 0.5, 20, 150, 0.001, 32
    result = certify.certify(digits_clf, x, sigma=sigma, n0=n0, n=n, alpha=alpha, key=jax.random.key(4),
                             draws_per_pass=per_pass)
    selection_key, estimation_key = jax.random.split(jax.random.key(4))
    selection = reference_counts(digits_clf, x, sigma, n0, selection_key, per_pass)
    estimation = reference_counts(digits_clf, x, sigma, n, estimation_key, per_pass)
    expected = [reference_certify(s, e, n, alpha, sigma) for s, e in zip(selection, estimation)]
    np.testing.assert_array_equal(result.prediction, [c for c, _ in expected])
    np.testing.assert_allclose(result.radius, [r for _, r in expected], rtol=1e-6)
    assert (result.prediction == ABSTAIN).any() and (result.prediction != ABSTAIN).any()

    counts = reference_counts(digits_clf, x, sigma, n, jax.random.key(5), per_pass)
    for level in (0.001, 0.01, 0.05, 0.2):
        predicted = certify.predict(digits_clf, x, sigma=sigma, n=n, alpha=level, key=jax.random.key(5),
                                    draws_per_pass=per_pass)
        np.testing.assert_array_equal(predicted, [reference_predict(c, level) for c in counts])
        assert (predicted == ABSTAIN).any() and (predicted != ABSTAIN).any()


def test_linear_model_radii_and_certified_accuracy_match_the_closed_form():
    """For f(x) = [w.x + b > 0], the smoothed classifier's top-class probability is
    Phi(d / sigma), d = |w.x + b| / |w|: its certified radius tends to the distance d to the
    hyperplane from below, and the certified accuracy at r is the share of correctly
    labelled images with d >= r."""
    w = np.array([1.0, -1.0, 0.5, 0.5])
    b = -0.5

    def apply(params, x):
        score = x.reshape(x.shape[0], -1) @ params["w"] + params["b"]
        return jnp.stack([jnp.zeros_like(score), score], axis=1)

    clf = rj.Classifier(params=dict(w=jnp.asarray(w, jnp.float32), b=jnp.float32(b)), apply_fn=apply,
                        num_classes=2, input_shape=(2, 2, 1), name="halfplane")
    distances = np.array([0.05, 0.2, 0.4, 0.6, -0.4, -0.6])  # signed: class 1 when positive
    base = np.full(4, 0.5)
    offset = (b + w @ base)  # score of the base image
    x = np.stack([base + (d * np.linalg.norm(w) - offset) * w / (w @ w) for d in distances])
    assert ((x >= 0) & (x <= 1)).all()
    x = x.reshape(-1, 2, 2, 1).astype(np.float32)
    labels = (distances > 0).astype(int)
    labels[3] = 0  # one wrong label: never counted as certified

    sigma = 0.25
    result = certify.certify(clf, x, sigma=sigma, n0=100, n=20_000, alpha=0.001, key=jax.random.key(0))
    np.testing.assert_array_equal(result.prediction, (distances > 0).astype(int))
    assert (result.radius <= np.abs(distances) + 1e-6).all()
    assert (result.radius >= np.abs(distances) - 0.05).all()
    radii = [0.0, 0.1, 0.3, 0.5]
    expected = [np.mean((labels == (distances > 0)) & (np.abs(distances) >= r)) for r in radii]
    np.testing.assert_allclose(certify.certified_accuracy(result, labels, radii), expected)


def test_bad_input_is_refused_with_one_clear_line(linear, batch):
    x = batch[0]
    key = jax.random.key(0)
    for sigma in (0.0, -0.5):
        with pytest.raises(ValueError, match="sigma"):
            certify.certify(linear, x, sigma=sigma, key=key)
    with pytest.raises(ValueError, match=r"n0=200 selection draws exceed n=100"):
        certify.certify(linear, x, sigma=0.25, n0=200, n=100, key=key)
    for alpha in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"alpha must be in \(0.0, 1.0\)"):
            certify.certify(linear, x, sigma=0.25, n0=10, n=20, alpha=alpha, key=key)
        with pytest.raises(ValueError, match="alpha"):
            certify.predict(linear, x, sigma=0.25, n=20, alpha=alpha, key=key)
    with pytest.raises(ValueError, match="draws_per_pass"):
        certify.class_counts(linear, x, sigma=0.25, num=10, key=key, draws_per_pass=0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        certify.class_counts(linear, x + 2, sigma=0.25, num=10, key=key)
    result = certify.certify(linear, x, sigma=0.25, n0=10, n=20, key=key)
    with pytest.raises(ValueError, match="radii"):
        certify.certified_accuracy(result, batch[1], [-0.1])
    with pytest.raises(ValueError, match="y has shape"):
        certify.certified_accuracy(result, batch[1][:3], [0.1])
