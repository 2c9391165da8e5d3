"""A user's own convolutions get the zoo's CPU-friendly input gradient inside attacks, with
values and gradients identical to XLA's own (robustjax/fast_conv.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx

import robustjax as rj
from robustjax.fast_conv import FastInputGradients, with_fast_convolutions

NHWC = ("NHWC", "HWIO", "NHWC")


def plain_cnn(params, x):
    """Strided, dilated and grouped ``lax`` convolutions, the middle one inside a ``jit``."""
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, params["k1"], (1, 1), "SAME", dimension_numbers=NHWC))
    h = jax.jit(lambda h: jax.lax.conv_general_dilated(h, params["k2"], (2, 2), ((1, 1), (1, 1)),
                                                       rhs_dilation=(1, 1), dimension_numbers=NHWC))(h)
    h = jax.lax.conv_general_dilated(jax.nn.relu(h), params["kg"], (1, 1), "SAME", rhs_dilation=(2, 2),
                                     dimension_numbers=NHWC, feature_group_count=4)
    return h.reshape(h.shape[0], -1) @ params["w"]


def plain_params():
    rng = np.random.default_rng(0)  # numpy: eager jax.random calls compile, seconds on 8 devices
    shapes = {"k1": (3, 3, 1, 8), "k2": (3, 3, 8, 16), "kg": (3, 3, 4, 16), "w": (4 * 4 * 16, 10)}
    return {name: jnp.asarray(rng.normal(size=shape) * 0.2, jnp.float32) for name, shape in shapes.items()}


class NNXNet(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(1, 8, (3, 3), strides=(2, 2), rngs=rngs)
        self.grouped = nnx.Conv(8, 8, (3, 3), feature_group_count=2, rngs=rngs)
        self.head = nnx.Linear(4 * 4 * 8, 10, rngs=rngs)

    def __call__(self, x):
        h = self.grouped(jax.nn.relu(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1))


class LinenNet(linen.Module):
    @linen.compact
    def __call__(self, x):
        h = jax.nn.relu(linen.Conv(8, (3, 3), strides=(2, 2))(x))
        return linen.Dense(10)(h.reshape(h.shape[0], -1))


@functools.cache
def classifier(kind: str) -> rj.Classifier:
    if kind == "lax":
        return rj.Classifier(params=plain_params(), apply_fn=plain_cnn, num_classes=10, input_shape=(8, 8, 1))
    if kind == "nnx":
        return rj.Classifier.from_nnx(NNXNet(nnx.Rngs(0)), num_classes=10, input_shape=(8, 8, 1))
    linen_net = LinenNet()
    return rj.Classifier(params=linen_net.init(jax.random.key(1), jnp.zeros((1, 8, 8, 1))),
                         apply_fn=linen_net.apply, num_classes=10, input_shape=(8, 8, 1))


@pytest.fixture(scope="module")
def images():
    return jax.random.uniform(jax.random.key(2), (4, 8, 8, 1))


@pytest.mark.parametrize("kind", ["lax", "nnx", "linen"])
def test_values_and_gradients_are_xlas_own(kind, images):
    clf = classifier(kind)
    fast = with_fast_convolutions(clf)
    assert isinstance(fast.apply_fn, FastInputGradients)

    def loss(c, x):
        return (c(x) * jnp.arange(10.0)).sum()

    everything = jax.jit(lambda c, x: (c(x), jax.grad(loss, argnums=(0, 1))(c, x)))
    (logits, grads), (expected_logits, expected_grads) = everything(fast, images), everything(clf, images)
    np.testing.assert_array_equal(logits, expected_logits)  # the same forward convolutions
    for mine, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):  # the same sums, reordered
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def test_ungrouped_convolutions_are_replaced_and_grouped_ones_kept(images):
    clf = classifier("lax")
    jaxpr = jax.make_jaxpr(with_fast_convolutions(clf))(images)
    names = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    assert names.count("custom_vjp_call") == 2  # the first convolution and the one inside the jit
    assert names.count("conv_general_dilated") == 1  # the grouped one (the zoo's backward is for ungrouped)


def test_attacks_give_the_same_result_with_the_rewrite(images):
    clf = classifier("lax")
    y = jnp.argmax(clf(images), -1)
    attack = rj.attacks.APGD(eps=0.1, steps=5, unroll=False)
    rewritten = attack(clf, images, y, key=jax.random.key(0))
    as_written = jax.jit(lambda c: attack.run(c, images, y, jax.random.key(0), None))(clf)  # bypasses the rewrite
    np.testing.assert_allclose(rewritten.x_adv, as_written.x_adv, atol=1e-6)
    np.testing.assert_array_equal(rewritten.queries, as_written.queries)



def test_autoattack_components_run_with_the_rewrite(images, monkeypatch):
    """AutoAttack calls its components' ``run`` directly, on concrete arrays as inside a trace:
    each component's program must still be traced through the rewrite."""
    from robustjax import fast_conv
    from robustjax.attacks.autoattack import _against

    rewritten, replace = [], fast_conv._convolution
    monkeypatch.setattr(fast_conv, "_convolution", lambda *args: rewritten.append(1) or replace(*args))
    clf = classifier("linen")
    y, key = jnp.zeros(len(images), jnp.int32), jax.random.key(0)
    ensemble = rj.attacks.AutoAttack(eps=0.1, steps=2, target_classes=2, square_queries=4)
    for attack, restarts, targets in ensemble.components(clf.num_classes):
        rewritten.clear()
        target = jnp.ones_like(y) if targets else None
        jax.make_jaxpr(_against, static_argnums=(0, 1))(attack, restarts, clf, images, y, target, key)
        assert rewritten, type(attack).__name__
