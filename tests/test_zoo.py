import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.zoo.digits_cnn import DigitsCNN, card
from robustjax.zoo.weights import load_weights, save_weights
from tests.helpers import count_compiles


def test_registry_lists_the_default_model():
    assert "digits_cnn" in rj.zoo.names()
    assert rj.zoo.names("digits*") == ["digits_cnn", "digits_mlp"]
    assert sorted(rj.zoo.names("resnet1*")) == ["resnet101", "resnet152", "resnet18", "resnet18_cifar"]
    assert rj.zoo.names("alexnet*") == []


def test_unknown_model_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean 'digits_cnn'"):
        rj.zoo.create("digit_cnn")


def test_pretrained_digits_cnn_is_accurate(digits_clf):
    x, y = rj.data.digits("test").arrays()
    accuracy = float(np.mean(np.argmax(digits_clf(x), -1) == y))
    assert accuracy >= 0.95
    assert accuracy == pytest.approx(card()["metrics"]["digits/test clean accuracy"], abs=1e-3)


def test_card_matches_the_model(digits_clf):
    info = card()
    assert info["num_params"] == rj.zoo.count_params(digits_clf)
    assert info["flops"] == pytest.approx(rj.zoo.count_flops(digits_clf), rel=0.01)
    assert tuple(info["input_shape"]) == digits_clf.input_shape
    assert tuple(info["normalization"]["mean"]) == digits_clf.mean


def test_small_models_build_run_and_jit_once():
    """Every model is built abstractly in test_zoo_registry.py and for real, at reduced size,
    in its family's tests; these two are small enough to build at full size here."""
    for name in ("digits_cnn", "resnet20_cifar"):
        clf = rj.zoo.create(name, pretrained=False, key=jax.random.key(1))
        x = np.zeros((2, *clf.input_shape), np.float32)
        forward = jax.jit(lambda c, images: c(images))
        assert forward(clf, x).shape == (2, clf.num_classes)
        with count_compiles() as compiles:
            forward(clf, x + 0.5)
        assert compiles[0] == 0


def test_weights_round_trip_and_mismatch_names_each_tensor(tmp_path):
    module = DigitsCNN(rngs=nnx.Rngs(3))
    save_weights(tmp_path / "w", nnx.state(module))
    other = nnx.state(DigitsCNN(rngs=nnx.Rngs(4)))
    before = [np.array(leaf) for leaf in jax.tree.leaves(other)]
    restored = load_weights(tmp_path / "w", other)
    for a, b in zip(jax.tree.leaves(nnx.state(module)), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before, jax.tree.leaves(other)):  # the state passed in is not modified
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError) as error:
        load_weights(tmp_path / "w", nnx.state(DigitsCNN(num_classes=7, rngs=nnx.Rngs(0))))
    assert "head.kernel has shape (128, 10), expected (128, 7)" in str(error.value)
    assert "head.bias" in str(error.value)
    with pytest.raises(ValueError, match="no weights"):
        load_weights(tmp_path / "missing", nnx.state(module))


def test_pretrained_needs_ten_classes():
    with pytest.raises(ValueError, match="10 classes"):
        rj.zoo.create("digits_cnn", num_classes=3)


@pytest.mark.parametrize(
    "kernel, stride, padding, dilation, groups",
    [((3, 3), (1, 1), "SAME", (1, 1), 1), ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1),
     ((1, 1), (2, 1), "VALID", (1, 1), 1), ((3, 3), (1, 1), "SAME", (2, 2), 1), ((3, 3), (2, 2), "SAME", (1, 1), 4)],
)
def test_conv_for_loops_has_the_values_and_gradients_of_lax_conv(kernel, stride, padding, dilation, groups):
    from robustjax.ops.conv import conv_general_dilated

    x = jax.random.normal(jax.random.key(0), (3, 9, 8, 4))
    w = jax.random.normal(jax.random.key(1), (*kernel, 4 // groups, 8))
    numbers = ("NHWC", "HWIO", "NHWC")

    def loss(conv):
        def value(x, w):
            out = conv(x, w, stride, padding, rhs_dilation=dilation, dimension_numbers=numbers, feature_group_count=groups)
            return jnp.sum(jnp.sin(out))
        return value

    np.testing.assert_array_equal(loss(conv_general_dilated)(x, w), loss(jax.lax.conv_general_dilated)(x, w))
    ours = jax.grad(loss(conv_general_dilated), (0, 1))(x, w)
    reference = jax.grad(loss(jax.lax.conv_general_dilated), (0, 1))(x, w)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # the same convolutions, possibly reassociated


def test_conv_for_loops_gives_the_same_gradients_in_a_rolled_loop(digits_clf, digits_batch):
    x, y = digits_batch
    unrolled = rj.attacks.PGD(eps=0.1, steps=4, unroll=True)(digits_clf, x, y, key=jax.random.key(0))
    rolled = rj.attacks.PGD(eps=0.1, steps=4, unroll=False)(digits_clf, x, y, key=jax.random.key(0))
    np.testing.assert_allclose(rolled.x_adv, unrolled.x_adv, atol=1e-6)


def test_max_pool_matches_flax_and_routes_gradients_to_the_first_maximum():
    from robustjax.zoo.layers import max_pool_2x2

    x = jax.random.normal(jax.random.key(0), (2, 6, 4, 3))
    np.testing.assert_array_equal(max_pool_2x2(x), nnx.max_pool(x, (2, 2), strides=(2, 2)))
    reference = jax.grad(lambda v: (nnx.max_pool(v, (2, 2), strides=(2, 2)) ** 2).sum())(x)
    np.testing.assert_allclose(jax.grad(lambda v: (max_pool_2x2(v) ** 2).sum())(x), reference, rtol=1e-6)
    tied = np.ones((1, 2, 2, 1), np.float32)  # all four equal: the first one gets it all
    np.testing.assert_array_equal(jax.grad(lambda v: max_pool_2x2(v).sum())(tied)[0, :, :, 0], [[1, 0], [0, 0]])
    with pytest.raises(ValueError, match="even height and width"):
        max_pool_2x2(np.zeros((1, 3, 4, 1), np.float32))
