"""The reference / surrogate digits model: an MLP, trained by models/train_digits.py."""

import jax
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.zoo import digits_cnn
from robustjax.zoo.digits_mlp import card
from tests.helpers import count_compiles


@pytest.fixture(scope="module")
def mlp() -> rj.Classifier:
    return rj.zoo.create("digits_mlp")


@pytest.fixture(scope="module")
def digits_test() -> tuple[np.ndarray, np.ndarray]:
    return rj.data.digits("test").arrays()


def accuracy(clf: rj.Classifier, x, y) -> float:
    return float(np.mean(np.argmax(clf(x), -1) == y))


def test_builds_runs_and_jits_once():
    clf = rj.zoo.create("digits_mlp", pretrained=False, key=jax.random.key(1))
    x = np.zeros((2, 8, 8, 1), np.float32)
    forward = jax.jit(lambda c, images: c(images))
    assert forward(clf, x).shape == (2, 10)
    with count_compiles() as compiles:
        forward(clf, x + 0.5)
    assert compiles[0] == 0
    assert rj.zoo.create("digits_mlp", pretrained=False, num_classes=7)(x).shape == (2, 7)
    with pytest.raises(ValueError, match="10 classes"):
        rj.zoo.create("digits_mlp", num_classes=3)


@pytest.mark.parametrize("name", ["digits_mlp", "digits_cnn"])
def test_a_pretrained_model_is_built_without_compiling_an_initialisation(name):
    """The random initialisation the bundled weights replace is never computed: building a
    pretrained digits model compiles no program (it took 22 compiles, 6 s, for the CNN)."""
    jax.clear_caches()
    key = jax.random.key(0)  # making a key compiles two small programs of its own
    with count_compiles() as compiles:
        clf = rj.zoo.create(name, key=key)
    assert compiles[0] == 0
    assert all(isinstance(leaf, (np.ndarray, jax.Array)) for leaf in jax.tree.leaves(clf.params))


def test_forward_is_the_mlp_on_normalised_pixels(mlp, digits_batch):
    """A NumPy forward pass from the parameters: normalise with the digits CNN's statistics,
    flatten row-major, two ReLU layers of 256, linear head."""
    x, _ = digits_batch
    p = jax.tree.map(np.asarray, nnx.to_pure_dict(mlp.params))
    h = ((x - digits_cnn.MEAN[0]) / digits_cnn.STD[0]).reshape(len(x), -1)
    h = np.maximum(h @ p["fc1"]["linear"]["kernel"] + p["fc1"]["linear"]["bias"], 0)
    h = np.maximum(h @ p["fc2"]["linear"]["kernel"] + p["fc2"]["linear"]["bias"], 0)
    expected = h @ p["head"]["kernel"] + p["head"]["bias"]
    # float32 matmuls of width 256 in a different summation order: ~1e-5 relative.
    np.testing.assert_allclose(mlp(x), expected, rtol=1e-4, atol=1e-4)
    assert (mlp.mean, mlp.std) == (digits_cnn.MEAN, digits_cnn.STD)


def test_pretrained_is_accurate_and_matches_its_card(mlp, digits_test):
    x, y = digits_test
    measured = accuracy(mlp, x, y)
    assert measured >= 0.95
    assert measured == pytest.approx(card()["metrics"]["digits/test clean accuracy"], abs=1e-3)


def test_card_matches_the_model(mlp):
    info = card()
    assert info["name"] == "digits_mlp" and info["family"] == "digits_mlp"
    layer_sizes = [(64, 256), (256, 256), (256, 10)]
    assert info["num_params"] == rj.zoo.count_params(mlp) == sum((m + 1) * n for m, n in layer_sizes)
    assert info["flops"] == pytest.approx(rj.zoo.count_flops(mlp), rel=0.01)
    assert tuple(info["input_shape"]) == mlp.input_shape == (8, 8, 1)
    assert info["normalization"] == {"mean": list(digits_cnn.MEAN), "std": list(digits_cnn.STD)}
    assert info["weights"]["source"] == "trained from scratch by models/train_digits.py digits_mlp"
    assert rj.zoo.card("digits_mlp")["weights"] == "trained here: models/train_digits.py digits_mlp"


def test_features_expose_the_hidden_layers(mlp, digits_batch):
    x, _ = digits_batch
    features = mlp.features(x)
    assert set(features) == {"fc1", "fc1.linear", "fc2", "fc2.linear", "head", "logits"}
    for layer in ("fc1", "fc2"):
        assert features[layer].shape == (len(x), 256)
        np.testing.assert_array_equal(features[layer], np.maximum(features[f"{layer}.linear"], 0))
    np.testing.assert_allclose(features["logits"], mlp(x), rtol=1e-6)


def test_fgsm_transferred_from_the_mlp_fools_the_cnn(mlp, digits_clf, digits_test):
    """Black-box transfer across architectures: FGSM (eps 0.2) crafted on the MLP drops the
    CNN from 0.99 to about 0.31 on the 500 test digits (white-box FGSM on the CNN: 0.26),
    while random signs of the same size leave it at about 0.94, so the drop comes from the
    surrogate's gradient, not from the size of the perturbation. The bounds leave margins of
    0.2-0.3 around those figures."""
    x, y = digits_test
    eps = 0.2
    fgsm = rj.attacks.FGSM(eps=eps)
    result = rj.attacks.transfer(fgsm, mlp, digits_clf, x, y, key=jax.random.key(0))
    transferred = accuracy(digits_clf, result.x_adv, y)
    signs = np.sign(np.asarray(jax.random.normal(jax.random.key(1), x.shape)))
    random_signs = accuracy(digits_clf, np.clip(x + eps * signs, 0, 1), y)
    assert np.mean(result.surrogate_success) > 0.8
    assert np.mean(result.success) == pytest.approx(1 - transferred, abs=1e-6)
    assert transferred < 0.6 and random_signs > 0.85
    assert np.abs(result.x_adv - x).max() <= eps + 1e-6
