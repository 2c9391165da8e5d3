"""Randomized classifiers and Expectation over Transformation (EOT): the contract of
``Classifier.randomized``, the draws an EOT gradient averages, the queries it charges, the
fresh draw that judges a result, and EOT's strength where randomness hides the gradient."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.attacks import eot, flags
from robustjax.attacks.base import CHECK_DRAW
from robustjax.attacks.flags import ModelCheckWarning, model_flags
from robustjax.classifier import NoisyParams
from tests.helpers import predicted_batch, random_linear_classifier

LINEAR = random_linear_classifier(seed=5, num_classes=4)


def noisy_linear(sigma: float = 0.5, seed: int = 1) -> rj.Classifier:
    """``LINEAR`` on images with Gaussian noise of scale ``sigma`` added."""
    def forward(weights, x, key):
        return LINEAR.apply_fn(weights, x + sigma * jax.random.normal(key, x.shape))

    return rj.Classifier.randomized(forward, LINEAR.params, key=jax.random.key(seed), num_classes=4,
                                    input_shape=(4, 4, 1))


def hidden_gradient(base: rj.Classifier, scale: float, frequency: float = 1000.0) -> rj.Classifier:
    """``base`` plus ``scale / frequency * sin(frequency * x . u)`` per class, ``u`` drawn
    per forward pass: the logits barely move, but each draw's input gradient carries a
    random term of size ``scale`` whose expectation vanishes (gradient obfuscation by
    randomness, Athalye et al. 2018 §4.2)."""
    def forward(weights, x, key):
        u = jax.random.normal(key, (x[0].size, base.num_classes))
        return base.apply_fn(weights, x) + scale / frequency * jnp.sin(frequency * x.reshape(x.shape[0], -1) @ u)

    return rj.Classifier.randomized(forward, base.params, key=jax.random.key(1), num_classes=base.num_classes,
                                    input_shape=base.input_shape, mean=base.mean, std=base.std, name="hidden")


@pytest.fixture(scope="module")
def batch():
    return predicted_batch(LINEAR, 16)


def test_a_randomized_classifier_repeats_its_draw_until_redrawn(batch):
    x, _ = batch
    model = noisy_linear()
    np.testing.assert_array_equal(model(x), model(x))
    assert np.abs(np.asarray(model.redraw(1)(x)) - np.asarray(model(x))).max() > 0.1
    np.testing.assert_allclose(model.redraw(1)(x), jax.jit(lambda m: m.redraw(1)(x))(model), rtol=1e-6, atol=1e-6)
    assert model.is_randomized and not LINEAR.is_randomized and LINEAR.redraw(3) is LINEAR
    stacked = rj.Classifier.stack([model, model.redraw(2)])
    np.testing.assert_array_equal(jax.vmap(lambda m: m(x))(stacked)[1], model.redraw(2)(x))


def test_a_randomized_classifier_needs_a_key():
    with pytest.raises(TypeError, match="key must be a JAX PRNG key"):
        rj.Classifier.randomized(lambda w, x, k: x, {}, key=0, num_classes=3, input_shape=(4, 4, 1))


def test_the_eot_gradient_is_the_mean_over_the_steps_draws(batch):
    """Transcribes the definition: at step t, the draws fold_in(fold_in(key, t), k), k < n."""
    x, y = batch
    model, step, samples = noisy_linear(), 3, 5

    def loss(images, m):
        return rj.losses.cross_entropy(m(images), y).sum(), m(images)

    grad, last_logits = eot.expected_gradient(loss, jnp.asarray(x), model, step, samples)
    draws = [jax.random.fold_in(jax.random.fold_in(model.params.key, step), k) for k in range(samples)]
    per_draw = [jax.grad(lambda images, d=d: loss(images, model.replace(params=NoisyParams(LINEAR.params, d)))[0])(x)
                for d in draws]
    np.testing.assert_allclose(grad, np.mean(per_draw, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last_logits, model.replace(params=NoisyParams(LINEAR.params, draws[-1]))(x),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attack", [rj.attacks.PGD(eps=0.1, steps=4, early_stop=False, eot_samples=3),
                                    rj.attacks.MIFGSM(eps=0.1, steps=4, early_stop=False, eot_samples=3),
                                    rj.attacks.APGD(eps=0.1, steps=4, eot_samples=3),
                                    rj.attacks.FGSM(eps=0.1, eot_samples=3)], ids=lambda a: a.name)
def test_each_draw_is_a_query_and_a_fresh_draw_judges_the_result(attack, batch):
    x, y = batch
    model = noisy_linear(sigma=2.0)
    result = attack(model, x, y, key=jax.random.key(0))
    gradients = 1 if attack.name == "fgsm" else attack.steps + (attack.name == "apgd")  # APGD: one at the start
    np.testing.assert_array_equal(result.queries, gradients * 3 + 1)
    judged = np.argmax(model.redraw(CHECK_DRAW)(result.x_adv), -1) != y
    np.testing.assert_array_equal(result.success, judged)
    assert (judged != (np.argmax(model(result.x_adv), -1) != y)).any(), "the base draw judges differently somewhere"


def test_eot_samples_must_be_positive_and_warn_on_a_deterministic_model(batch):
    with pytest.raises(ValueError, match="eot_samples"):
        rj.attacks.APGD(eot_samples=0)
    with pytest.raises(ValueError, match="eot_samples"):
        rj.attacks.PGD(eot_samples=-1)
    with pytest.warns(ModelCheckWarning, match="deterministic classifier"):
        rj.attacks.PGD(eps=0.1, steps=2, eot_samples=2)(LINEAR, *batch, key=jax.random.key(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rj.attacks.PGD(eps=0.1, steps=2, eot_samples=2)(noisy_linear(), *batch, key=jax.random.key(0))


def test_the_determinism_check_sees_a_randomized_model(batch):
    """The noise here is one image for the whole batch: only another draw reveals it."""
    x, y = (jnp.asarray(a) for a in batch)
    model = rj.Classifier.randomized(lambda w, x, k: LINEAR.apply_fn(w, x + jax.random.normal(k, x.shape[1:])),
                                     LINEAR.params, key=jax.random.key(0), num_classes=4, input_shape=(4, 4, 1))
    flagged = {flag.name: flag.raised for flag in model_flags(model, x, y)}
    assert flagged["deterministic_forward"]
    assert not {flag.name: flag.raised for flag in model_flags(LINEAR, x, y)}["deterministic_forward"]


def test_eot_finds_what_one_draw_per_step_misses(digits_clf, digits_batch):
    """On a model whose every draw hides the gradient under a random term, APGD with EOT
    over 20 draws fools clearly more examples than with one draw per step."""
    x, y = digits_batch
    model = hidden_gradient(digits_clf, scale=5.0)
    robust = {n: 1 - float(rj.attacks.APGD(eps=0.1, steps=10, eot_samples=n)(model, x, y, key=jax.random.key(0))
                           .success.mean()) for n in (1, 20)}
    assert robust[20] <= robust[1] - 0.08, robust


def test_rand_is_apgd_ce_and_dlr_with_20_draws_and_one_restart():
    rand = rj.attacks.AutoAttack(eps=0.1, version="rand")
    parts = rand.components(10)
    assert [(a.loss, a.eot_samples, a.eps, restarts, targets) for a, restarts, targets in parts] == [
        ("ce", 20, 0.1, 1, 0), ("dlr", 20, 0.1, 1, 0)]
    assert [a.loss for a, _, _ in rand.components(2)] == ["ce"]
    assert [f.message for f in flags.class_count(2, 9, "rand")] == [
        "the DLR loss needs 3 classes; the model has 2: APGD-DLR is left out"]
    assert not flags.class_count(3, 9, "rand")
    with pytest.raises(ValueError, match="eot_samples"):
        rj.attacks.AutoAttack(version="rand", eot_samples=0)


def test_rand_warns_on_a_deterministic_model_and_standard_on_a_random_one(batch):
    x, y = batch
    budget = dict(eps=0.1, steps=2, target_classes=2, square_queries=10, eot_samples=2)
    with pytest.warns(ModelCheckWarning, match="version='rand' on a deterministic classifier"):
        rj.attacks.AutoAttack(version="rand", **budget)(LINEAR, x, y, key=jax.random.key(0))
    with warnings.catch_warnings(record=True) as caught:  # Square may also beat the noisy white-box runs
        warnings.simplefilter("always")
        rj.attacks.AutoAttack(version="standard", **budget)(noisy_linear(), x, y, key=jax.random.key(0))
    assert any("the forward pass is random" in str(w.message) for w in caught if w.category is ModelCheckWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rj.attacks.AutoAttack(version="rand", **budget)(noisy_linear(), x, y, key=jax.random.key(0))


def test_rand_with_eot_fools_what_rand_without_eot_misses(digits_clf, digits_batch):
    x, y = digits_batch
    model = hidden_gradient(digits_clf, scale=5.0)
    robust = {n: 1 - float(rj.attacks.AutoAttack(eps=0.1, version="rand", steps=10, eot_samples=n)(
        model, x, y, key=jax.random.key(0)).success.mean()) for n in (1, 20)}
    assert robust[20] <= robust[1] - 0.08, robust
