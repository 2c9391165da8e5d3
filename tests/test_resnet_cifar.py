import jax
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.zoo.resnet18_cifar import INPUT_SHAPE, MEAN, NAME, STD, ResNetCIFAR
from tests.helpers import count_compiles, randomize_nnx_batch_norm

ACTIVATIONS = ("bn1", "layer1.0", "layer2.0.shortcut", "layer3.1", "layer4.1")


@pytest.fixture(scope="module")
def resnet() -> rj.Classifier:
    """Random weights with non-trivial BatchNorm statistics, scales and biases."""
    module = ResNetCIFAR(rngs=nnx.Rngs(params=jax.random.key(0)))
    randomize_nnx_batch_norm(module)
    return rj.Classifier.from_nnx(module, num_classes=10, input_shape=INPUT_SHAPE, mean=MEAN, std=STD, name=NAME)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(1).uniform(size=(2, *INPUT_SHAPE)).astype(np.float32)


def test_registered_without_pretrained_weights():
    assert rj.zoo.get(NAME).family == "resnet_cifar"
    clf = rj.zoo.create(NAME, pretrained=False, num_classes=7)
    assert (clf.num_classes, clf.input_shape, clf.mean, clf.std) == (7, INPUT_SHAPE, MEAN, STD)
    with pytest.raises(ValueError, match="no pretrained weights"):
        rj.zoo.create(NAME)


def test_jit_compiles_once(resnet, images):
    forward = jax.jit(lambda clf, x: clf(x))
    assert forward(resnet, images).shape == (2, 10)
    with count_compiles() as compiles:
        forward(resnet, images * 0.5).block_until_ready()
    assert compiles[0] == 0


def test_parity_with_the_torch_twin(resnet, images):
    torch = pytest.importorskip("torch")
    from benchmarks.torch_models import to_nchw
    from benchmarks.torch_resnet import resnet18_to_torch

    twin = resnet18_to_torch(resnet)
    n_torch = sum(p.numel() for p in twin.parameters()) + sum(
        b.numel() for name, b in twin.named_buffers() if name.endswith(("running_mean", "running_var")))
    assert rj.zoo.count_params(resnet) == n_torch == 11_183_562

    captured = {}
    hooks = [twin.get_submodule(name).register_forward_hook(
        lambda _, __, out, name=name: captured.__setitem__(name, out.permute(0, 2, 3, 1).numpy()))
        for name in ACTIVATIONS]
    with torch.no_grad():
        logits = twin(to_nchw(images)).numpy()
    for hook in hooks:
        hook.remove()

    ours = resnet(images)
    assert np.abs(logits).max() > 0.1  # a non-degenerate comparison
    np.testing.assert_allclose(ours, logits, atol=1e-4, rtol=0)
    features = resnet.features(images)
    for name in ACTIVATIONS:
        scale = np.abs(captured[name]).max()
        np.testing.assert_allclose(features[name], captured[name], atol=1e-5 * max(scale, 1.0), rtol=0,
                                   err_msg=name)
