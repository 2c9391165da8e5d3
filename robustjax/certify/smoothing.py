"""Randomized smoothing (Cohen, Rosenfeld & Kolter, "Certified Adversarial Robustness via
Randomized Smoothing", ICML 2019).

The smoothed classifier ``g(x) = argmax_c P(f(x + d) = c)``, ``d ~ N(0, sigma^2 I)``, is
constant on the L2 ball of radius ``sigma * Phi^-1(p_A)`` around x when class A has
probability at least ``p_A``. :func:`certify` is the paper's CERTIFY: ``n0`` draws select the
class, ``n`` fresh draws estimate its probability, whose one-sided Clopper-Pearson lower bound
at level ``alpha`` gives the radius, or an abstention when it is below 1/2. :func:`predict` is
its PREDICT: the top class of ``n`` draws, unless a two-sided binomial test cannot tell it
from the runner-up at level ``alpha``. Noise is added to the [0, 1] image, not clipped, as
in the paper; the classifier's own normalisation follows.

Noise draws are reproducible: :func:`class_counts` draws them in passes of
``draws_per_pass``, pass ``i`` from ``jax.random.fold_in(key, i)``, as
``sigma * normal(shape=(draws_per_pass, *x.shape))``, and counts the first ``num``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int
from scipy import stats

from robustjax.checks import (
    as_images,
    check_in_interval,
    check_key,
    check_positive_float,
    check_positive_int,
)
from robustjax.distributed import to_host

ABSTAIN = -1


class Certificate(NamedTuple):
    """Per image: the smoothed prediction (``ABSTAIN`` = -1 when abstaining), the certified L2
    radius (0 when abstaining) and the lower confidence bound on the top class's probability."""

    prediction: np.ndarray
    radius: np.ndarray
    p_lower: np.ndarray


def class_counts(
    classifier, x: Float[Array, "b h w c"], *, sigma: float, num: int, key: jax.Array, draws_per_pass: int = 64,
) -> Int[Array, "b k"]:
    """How often each class is the base classifier's prediction over ``num`` Gaussian draws
    around each image (drawn as the module docstring says)."""
    _check_noise(classifier, sigma, num, key, draws_per_pass)
    x = as_images(x, input_shape=classifier.input_shape)
    return _counts(classifier, x, sigma, key, num=num, draws_per_pass=draws_per_pass)


@functools.partial(jax.jit, static_argnames=("num", "draws_per_pass"))
def _counts(classifier, x, sigma, key, *, num, draws_per_pass):
    def one_pass(counts, index):
        noise = sigma * jax.random.normal(jax.random.fold_in(key, index), (draws_per_pass,) + x.shape)
        noisy = (x[None] + noise).reshape((-1,) + x.shape[1:])
        predictions = jnp.argmax(classifier(noisy), axis=-1).reshape(draws_per_pass, x.shape[0])
        counted = (index * draws_per_pass + jnp.arange(draws_per_pass)) < num
        votes = jax.nn.one_hot(predictions, classifier.num_classes, dtype=jnp.int32) * counted[:, None, None]
        return counts + votes.sum(axis=0), None

    passes = -(-num // draws_per_pass)
    counts = jnp.zeros((x.shape[0], classifier.num_classes), jnp.int32)
    return jax.lax.scan(one_pass, counts, jnp.arange(passes))[0]


def certify(
    classifier, x: Float[Array, "b h w c"], *, sigma: float, key: jax.Array, n0: int = 100, n: int = 100_000,
    alpha: float = 0.001, draws_per_pass: int = 64,
) -> Certificate:
    """CERTIFY (the paper's Algorithm 1 and its code) for each image of ``x``: with
    probability at least ``1 - alpha``, a returned class is the smoothed classifier's
    prediction everywhere within the returned L2 radius. The selection draws come from
    ``jax.random.split(key)[0]``, the estimation draws from ``[1]``."""
    check_positive_int(n0, "n0")
    if n0 > n:
        raise ValueError(f"n0={n0} selection draws exceed n={n} estimation draws; CERTIFY selects the class "
                         "with a few draws and estimates its probability with many (the paper: n0=100, "
                         "n=100,000)")
    _check_alpha(alpha)
    select_key, estimate_key = jax.random.split(key)
    selection = class_counts(classifier, x, sigma=sigma, num=n0, key=select_key, draws_per_pass=draws_per_pass)
    estimation = class_counts(classifier, x, sigma=sigma, num=n, key=estimate_key, draws_per_pass=draws_per_pass)
    return certificate(to_host(selection), to_host(estimation), sigma=sigma, alpha=alpha)


def certificate(selection: np.ndarray, estimation: np.ndarray, *, sigma: float, alpha: float) -> Certificate:
    """CERTIFY's decision from its class counts, (..., K) each: the class most often drawn in
    ``selection``, its probability bounded from below on ``estimation`` (of ``n`` draws, the
    counts' sum), the radius ``sigma * Phi^-1(p_lower)``, or an abstention below 1/2."""
    chosen = np.argmax(selection, axis=-1)
    n = estimation.sum(axis=-1)
    hits = np.take_along_axis(estimation, chosen[..., None], axis=-1)[..., 0]
    p_lower = clopper_pearson_lower(hits, n, alpha)
    certified = p_lower >= 0.5
    radius = np.where(certified, sigma * stats.norm.ppf(np.where(certified, p_lower, 0.5)), 0.0)
    return Certificate(np.where(certified, chosen, ABSTAIN), radius, p_lower)


def predict(
    classifier, x: Float[Array, "b h w c"], *, sigma: float, key: jax.Array, n: int = 100_000,
    alpha: float = 0.001, draws_per_pass: int = 64,
) -> np.ndarray:
    """PREDICT: the smoothed classifier's class for each image, or ``ABSTAIN`` when the two
    most frequent classes of ``n`` draws are not told apart by a two-sided binomial test
    at level ``alpha`` (so a returned class is wrong with probability at most ``alpha``)."""
    _check_alpha(alpha)
    counts = to_host(class_counts(classifier, x, sigma=sigma, num=n, key=key, draws_per_pass=draws_per_pass))
    order = np.argsort(-counts, axis=1, kind="stable")
    top, runner_up = counts[np.arange(len(counts)), order[:, 0]], counts[np.arange(len(counts)), order[:, 1]]
    p_values = np.array([stats.binomtest(int(a), int(a + b), 0.5).pvalue for a, b in zip(top, runner_up)])
    return np.where(p_values <= alpha, order[:, 0], ABSTAIN)


def clopper_pearson_lower(hits, trials, alpha: float) -> np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson lower confidence bound on a binomial proportion."""
    hits = np.asarray(hits)
    return np.where(hits > 0, stats.beta.ppf(alpha, np.maximum(hits, 1), trials - hits + 1), 0.0)


def certified_accuracy(certificate: Certificate, y, radii) -> np.ndarray:
    """For each radius r: the fraction of images the smoothed classifier classifies
    correctly with a certified radius of at least r (the paper's certified test accuracy)."""
    y = np.asarray(y)
    if y.shape != certificate.prediction.shape:
        raise ValueError(f"y has shape {y.shape}, the certificate covers {certificate.prediction.shape} images")
    radii = np.atleast_1d(np.asarray(radii, float))
    if (radii < 0).any() or not np.isfinite(radii).all():
        raise ValueError(f"radii must be finite and >= 0, got {radii.tolist()}")
    correct = certificate.prediction == y
    return (correct[None, :] & (certificate.radius[None, :] >= radii[:, None])).mean(axis=1)


def _check_noise(classifier, sigma, num, key, draws_per_pass) -> None:
    check_positive_float(sigma, "sigma", traceable=True)
    check_positive_int(num, "num")
    check_positive_int(draws_per_pass, "draws_per_pass")
    check_key(key)
    if classifier.is_randomized:
        raise ValueError(f"{classifier.name} is already randomized; smoothing needs a deterministic base "
                         "classifier")


def _check_alpha(alpha) -> None:
    check_in_interval(alpha, "alpha", 0.0, 1.0)
