import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.zoo.digits_cnn import DigitsCNN
from tests.helpers import count_compiles, linear_classifier


def make(seed: int) -> rj.Classifier:
    return rj.Classifier.from_nnx(DigitsCNN(rngs=nnx.Rngs(seed)), num_classes=10, input_shape=(8, 8, 1),
                                  mean=(0.5,), std=(0.25,))


def test_classifier_is_a_pytree_of_parameters_only():
    clf = make(0)
    leaves = jax.tree.leaves(clf)
    assert leaves and all(isinstance(leaf, jax.Array) for leaf in leaves)
    assert sum(leaf.size for leaf in leaves) == rj.zoo.count_params(clf)


def test_same_architecture_shares_one_compiled_program():
    a, b = make(0), make(1)
    assert a.apply_fn == b.apply_fn and hash(a.apply_fn) == hash(b.apply_fn)
    forward = jax.jit(lambda clf, x: clf(x))
    x = jnp.zeros((2, 8, 8, 1))
    forward(a, x)
    with count_compiles() as compiles:
        out = forward(b, x)
    assert compiles[0] == 0
    np.testing.assert_allclose(out, b(x), rtol=1e-6)


def test_vmap_over_a_stack_of_classifiers():
    classifiers = [make(seed) for seed in range(3)]
    stack = jax.tree.map(lambda *leaves: jnp.stack(leaves), *classifiers)
    x = jax.random.uniform(jax.random.key(1), (5, 8, 8, 1))
    logits = jax.jit(jax.vmap(lambda clf: clf(x)))(stack)
    assert logits.shape == (3, 5, 10)
    for i, clf in enumerate(classifiers):
        np.testing.assert_allclose(logits[i], clf(x), rtol=1e-5, atol=1e-5)


def test_normalisation_is_applied_before_the_network():
    w = np.eye(16, 2, dtype=np.float32)
    raw = linear_classifier(w, np.zeros(2))
    normalised = raw.replace(mean=(0.5,), std=(0.25,))
    x = np.full((1, 4, 4, 1), 0.75, np.float32)
    np.testing.assert_allclose(raw(x), [[0.75, 0.75]])
    np.testing.assert_allclose(normalised(x), [[1.0, 1.0]])


def test_features_report_every_layer_and_the_logits():
    clf = make(0)
    x = jnp.zeros((2, 8, 8, 1))
    features = clf.features(x)
    assert {"block1", "block1.conv", "block2", "block3", "fc1", "head", "logits"} <= set(features)
    assert features["block1"].shape == (2, 8, 8, 32)
    assert features["block3"].shape == (2, 4, 4, 64)
    assert float(features["block1"].min()) >= 0.0  # post-ReLU
    np.testing.assert_allclose(features["logits"], clf(x), rtol=1e-6)
    features_jit = jax.jit(lambda c, images: c.features(images))(clf, x)
    np.testing.assert_allclose(features_jit["fc1"], features["fc1"], rtol=1e-6)


def test_features_of_a_plain_function_classifier_are_refused():
    clf = linear_classifier(np.eye(16, 2), np.zeros(2))
    with pytest.raises(ValueError, match="intermediate activations"):
        clf.features(np.zeros((1, 4, 4, 1), np.float32))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_classes=1), "num_classes"),
        (dict(input_shape=(8, 8)), "input_shape"),
        (dict(mean=(0.1, 0.2)), "mean"),
        (dict(std=(0.0,)), "std must be positive"),
    ],
)
def test_bad_construction_is_refused(kwargs, message):
    base = dict(params={}, apply_fn=lambda p, x: x, num_classes=10, input_shape=(8, 8, 1))
    with pytest.raises(ValueError, match=message):
        rj.Classifier(**{**base, **kwargs})
