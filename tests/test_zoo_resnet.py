"""torchvision ResNet / ResNeXt / Wide-ResNet ports: parity with torchvision, parameter
counts at full size, converter errors."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import robustjax as rj  # noqa: E402
from robustjax.zoo import resnet  # noqa: E402  (registers the models)
from robustjax.zoo.convert import from_torch  # noqa: E402
from tests.zoo_parity import assert_parity, count_flax, count_torch, randomize, state_dict  # noqa: E402

NAMES = tuple(resnet.VARIANTS)
# Block outputs, projection shortcuts and BatchNorms (pre-ReLU) at every stage.
LAYERS = ("bn1", "layer1.0", "layer1.0.bn2", "layer2.0.downsample", "layer3.0", "layer4.0.conv1", "layer4.0")


def reduced_torchvision(name: str, layers: tuple[int, ...]) -> torch.nn.Module:
    block, _, groups, width_per_group = resnet.VARIANTS[name]
    torch_block = torchvision.models.resnet.BasicBlock if block is resnet.BasicBlock else \
        torchvision.models.resnet.Bottleneck
    torch.manual_seed(0)
    model = torchvision.models.resnet.ResNet(torch_block, list(layers), num_classes=10, groups=groups,
                                             width_per_group=width_per_group)
    return randomize(model)


def test_every_variant_is_registered_with_its_card():
    for name in NAMES:
        entry = rj.zoo.get(name)
        assert (entry.family, entry.torch_source, entry.convert) == (
            "resnet", f"torchvision.models.{name}", resnet.convert_resnet)
        with pytest.raises(ValueError, match=f"model '{name}' has no pretrained weights; pass pretrained=False"):
            entry.build(key=jax.random.key(0), pretrained=True)


@pytest.mark.parametrize("name,layers", [("resnet18", (1, 1, 1, 1)), ("resnext50_32x4d", (2, 1, 1, 1)),
                                         ("wide_resnet50_2", (1, 1, 1, 1))])
def test_reduced_models_match_torchvision(name, layers):
    """Basic blocks; grouped bottlenecks with an identity block (layer1.1); wide bottlenecks.
    Reduced depth and a 64x64 input: parity does not depend on either."""
    model = reduced_torchvision(name, layers)
    clf = from_torch(name, state_dict(model), num_classes=10, layers=layers, image_size=64)
    images = np.random.default_rng(0).uniform(size=(2, 64, 64, 3)).astype(np.float32)
    assert_parity(clf, model, images, LAYERS + (("layer1.1",) if layers[0] > 1 else ()))


def test_full_size_resnet18_matches_torchvision():
    torch.manual_seed(1)
    model = randomize(torchvision.models.resnet18(), seed=1)
    clf = from_torch("resnet18", state_dict(model))
    assert (clf.input_shape, clf.mean, clf.std) == ((224, 224, 3), resnet.IMAGENET_MEAN, resnet.IMAGENET_STD)
    images = np.random.default_rng(1).uniform(size=(1, 224, 224, 3)).astype(np.float32)
    assert_parity(clf, model, images, ("layer4.1",))


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_equal_torchvision_at_full_size(name):
    with torch.device("meta"):
        model = getattr(torchvision.models, name)()
    assert count_flax(name) == count_torch(model)


def test_wrong_state_dicts_name_each_problem():
    model = reduced_torchvision("resnet18", (1, 1, 1, 1))
    tensors = state_dict(model)
    broken = dict(tensors)
    del broken["layer2.0.downsample.1.running_var"]
    broken["layer5.0.conv1.weight"] = np.zeros((3, 3, 3, 3), np.float32)
    with pytest.raises(ValueError) as error:
        from_torch("resnet18", broken, num_classes=10, layers=(1, 1, 1, 1), image_size=64)
    assert "missing layer2.0.downsample.1.running_var" in str(error.value)
    assert "unexpected layer5.0.conv1.weight (3, 3, 3, 3)" in str(error.value)
    reshaped = dict(tensors, **{"fc.weight": np.zeros((10, 256), np.float32)})
    with pytest.raises(ValueError, match=r"fc.kernel has shape \(256, 10\), expected \(512, 10\)"):
        from_torch("resnet18", reshaped, num_classes=10, layers=(1, 1, 1, 1), image_size=64)
