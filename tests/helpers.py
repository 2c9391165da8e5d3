"""Small models with known answers, and a compile counter."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np

import robustjax as rj


def linear_apply(params, x):
    """Logits of a linear classifier on flattened images."""
    return x.reshape(x.shape[0], -1) @ params["w"] + params["b"]


def linear_classifier(w: np.ndarray, b: np.ndarray, input_shape=(4, 4, 1)) -> rj.Classifier:
    """A linear classifier ``logits = flatten(x) @ w + b`` with no normalisation."""
    return rj.Classifier(
        params={"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)},
        apply_fn=linear_apply,
        num_classes=w.shape[1],
        input_shape=input_shape,
        name="linear",
    )


def random_linear_classifier(seed: int = 0, num_classes: int = 3, input_shape=(4, 4, 1)) -> rj.Classifier:
    rng = np.random.default_rng(seed)
    dim = int(np.prod(input_shape))
    return linear_classifier(rng.normal(size=(dim, num_classes)), rng.normal(size=num_classes), input_shape)


def predicted_batch(classifier: rj.Classifier, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``size`` uniform images in [0.2, 0.8] (room for a step either way) labelled with
    ``classifier``'s predictions: every example starts correctly classified."""
    x = np.random.default_rng(seed).uniform(0.2, 0.8, (size, *classifier.input_shape)).astype(np.float32)
    return x, np.asarray(jnp.argmax(classifier(jnp.asarray(x)), axis=-1))


def tiny_model() -> rj.Classifier:
    """Used by the CLI tests as ``--model tests.helpers:tiny_model``."""
    return rj.zoo.create("digits_cnn", pretrained=False)


def unnamed_model() -> rj.Classifier:
    """A user's model that keeps the Classifier's default name."""
    return tiny_model().replace(name=rj.Classifier.name)


def not_a_model():
    return "not a classifier"


@contextlib.contextmanager
def count_compiles():
    """Counts XLA backend compilations inside the block: ``with count_compiles() as n: ...; n[0]``."""
    count = [0]

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def randomize_nnx_batch_norm(module, seed: int = 0) -> None:
    """Non-trivial BatchNorm statistics, scales and biases in a Flax NNX module, in place."""
    from flax import nnx

    rng = np.random.default_rng(seed)
    for _, layer in nnx.iter_modules(module):
        if isinstance(layer, nnx.BatchNorm):
            shape = layer.mean.shape
            layer.mean[...] = rng.normal(0.0, 0.2, shape).astype(np.float32)
            layer.var[...] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
            layer.scale[...] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
            layer.bias[...] = rng.normal(0.0, 0.1, shape).astype(np.float32)


@contextlib.contextmanager
def unchecked_annotations():
    """Switches off jaxtyping's run-time checks of the annotations (pytest's
    ``--jaxtyping-packages``) inside the block, for tests of the library's own errors on input
    outside its annotated types."""
    disabled = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", disabled)


def gradient_flops_by_layout(supernet, archs, images, labels) -> dict[str, float]:
    """XLA's cost analysis of a PGD step's input gradient (cross-entropy) for ``archs``:
    ``own``, summed over each subnet alone at its own shapes, and a population of them,
    ``packed`` and ``masks``."""
    from robustjax.losses import cross_entropy
    from robustjax.nas.population import from_supernet, over_networks

    def flops(classifier, axes=None):
        def gradients(params, x, y):
            def one(p):
                return jax.grad(lambda v: cross_entropy(classifier.replace(params=p)(v), y).sum())(x)
            return over_networks(one, params, axes)
        return jax.jit(gradients).lower(classifier.params, images, labels).compile().cost_analysis()["flops"]

    populations = {layout: from_supernet(supernet, archs, packed=layout == "packed") for layout in ("packed", "masks")}
    return {"own": sum(flops(supernet.subnet(arch)) for arch in archs),
            **{layout: flops(p.classifier, p.axes) for layout, p in populations.items()}}


def assert_same_pgd_outcomes(reference, other, images, labels) -> None:
    """Two populations of the same networks give identical PGD successes and adversarial
    examples, and the attack neither always nor never succeeds."""
    pgd = rj.attacks.PGD(eps=0.1, steps=3)
    one, two = (p.map(lambda classifier, x, y: pgd(classifier, x, y, key=jax.random.key(0)), images, labels)
                for p in (reference, other))
    np.testing.assert_array_equal(np.asarray(two.success), np.asarray(one.success))
    np.testing.assert_allclose(np.asarray(two.x_adv), np.asarray(one.x_adv), atol=1e-6)
    assert 0 < np.asarray(one.success).mean() < 1
