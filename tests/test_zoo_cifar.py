"""CIFAR leaderboard families (ResNet-18, PreAct-ResNet-18, ResNet-20/56, WRN, DM-WRN):
parity with PyTorch twins of the RobustBench / chenyaofo layouts, parameter counts at full
size, normalisation handling and converter errors."""

import inspect

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import robustjax as rj  # noqa: E402
from robustjax.zoo import resnet18_cifar, resnet20_56_cifar, wide_resnet  # noqa: E402, F401  (register the models)
from robustjax.zoo.convert import from_torch  # noqa: E402
from tests import torch_cifar_twins as twins  # noqa: E402
from tests.zoo_parity import assert_parity, count_flax, count_torch, randomize, state_dict  # noqa: E402

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
# name: (torch twin at full size, parameter count without BatchNorm running statistics,
# as published: CIFAR ResNet-18 11.2M, ResNet-20 0.27M, ResNet-56 0.86M, WRN-28-10 36.5M,
# WRN-34-10 46.2M, WRN-70-16 266.8M)
FULL_SIZE = {
    "resnet18_cifar": (lambda: twins.CifarResNet18(), 11_173_962),
    "preact_resnet18_cifar": (lambda: twins.CifarResNet18(preact=True), 11_171_146),
    "resnet20_cifar": (lambda: twins.ChenyaofoCifarResNet(3), 272_474),
    "resnet56_cifar": (lambda: twins.ChenyaofoCifarResNet(9), 855_770),
    "wrn_28_10": (lambda: twins.WideResNet(28, 10), 36_479_194),
    "wrn_34_10": (lambda: twins.WideResNet(34, 10), 46_160_474),
    "wrn_70_16": (lambda: twins.DMWideResNet(70, 16), 266_796_506),
    "dm_wrn_28_10": (lambda: twins.DMWideResNet(28, 10), 36_479_194),
}


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(0).uniform(size=(2, 32, 32, 3)).astype(np.float32)


def test_registered_with_cards_and_without_pretrained_weights():
    for name in FULL_SIZE:
        entry = rj.zoo.get(name)
        assert entry.convert is not None and entry.torch_source
        with pytest.raises(ValueError, match=f"model '{name}' has no pretrained weights; pass pretrained=False"):
            entry.build(key=jax.random.key(0), pretrained=True)
    for name in ("wrn_70_16", "dm_wrn_28_10"):  # the leaderboard's DM checkpoints use Swish
        assert inspect.signature(rj.zoo.get(name).build).parameters["activation"].default == "swish"


@pytest.mark.parametrize("name", FULL_SIZE)
def test_parameter_counts_equal_the_twins_at_full_size(name):
    make_twin, published = FULL_SIZE[name]
    with torch.device("meta"):
        twin = make_twin()
    assert sum(p.numel() for p in twin.parameters()) == published
    assert count_flax(name) == count_torch(twin)


def test_resnet18_matches_robustbench_layout(images):
    model = randomize(twins.CifarResNet18(depths=(1, 1, 1, 1)))
    clf = from_torch("resnet18_cifar", state_dict(model), depths=(1, 1, 1, 1))
    assert (clf.mean, clf.std) == (resnet18_cifar.MEAN, resnet18_cifar.STD)
    assert_parity(clf, model, images, ("bn1", "layer1.0", "layer2.0.shortcut", "layer3.0.bn2", "layer4.0"))


@pytest.mark.parametrize("after_activation,bn_before_fc", [(False, False), (True, True)])
def test_preact_resnet18_matches_both_block_variants(images, after_activation, bn_before_fc):
    """RobustBench's PreActResNet18 (Wong2020Fast) and the PreActBlockV2 + final-BN variant
    (Rice2020OverfittingL2)."""
    model = randomize(twins.CifarResNet18(depths=(1, 1, 1, 1), preact=True, after_activation=after_activation,
                                          bn_before_fc=bn_before_fc))
    clf = from_torch("preact_resnet18_cifar", state_dict(model), depths=(1, 1, 1, 1),
                       shortcut_after_activation=after_activation, bn_before_fc=bn_before_fc)
    layers = ("conv1", "layer1.0", "layer2.0.shortcut", "layer3.0.bn2", "layer4.0") + (("bn",) if bn_before_fc else ())
    assert_parity(clf, model, images, layers)


def test_full_size_resnet20_from_torch_matches_chenyaofo_layout(images):
    model = randomize(twins.ChenyaofoCifarResNet(3))
    clf = from_torch("resnet20_cifar", state_dict(model))
    assert (clf.mean, clf.std) == (resnet20_56_cifar.MEAN, resnet20_56_cifar.STD)
    assert_parity(clf, model, images, ("bn1", "layer1.2", "layer2.0.downsample", "layer3.0.bn1", "layer3.2"))


def test_wide_resnet_matches_robustbench_layout_and_drops_sub_block1(images):
    """WRN-16-2: two blocks per group, so identity and 1x1-projection blocks both occur."""
    model = randomize(twins.WideResNet(16, 2, sub_block1=True))
    clf = from_torch("wrn_28_10", state_dict(model), depth=16, widen_factor=2)
    assert (clf.mean, clf.std) == ((0.0,), (1.0,))
    assert_parity(clf, model, images, ("conv1", "block1.layer.0.convShortcut", "block1.layer.1",
                                       "block2.layer.0.bn1", "block3", "bn1"))


@pytest.mark.parametrize("activation,torch_activation", [("swish", torch.nn.SiLU), ("relu", torch.nn.ReLU)])
def test_dm_wide_resnet_matches_with_its_stored_normalisation(images, activation, torch_activation):
    """DM WRN-16-2 with CIFAR-100 statistics in the state dict: the converted model must use them."""
    model = randomize(twins.DMWideResNet(16, 2, activation=torch_activation, mean=CIFAR100_MEAN, std=CIFAR100_STD))
    clf = from_torch("wrn_70_16", state_dict(model), depth=16, width=2, activation=activation)
    assert (clf.mean, clf.std) == ((0.0,), (1.0,))  # the network normalises itself
    assert_parity(clf, model, images, ("init_conv", "layer.0.block.0.shortcut", "layer.0.block.1",
                                       "layer.1.block.0.conv_0", "layer.2", "batchnorm"))


def test_stored_input_statistics_must_match_the_model():
    tensors = state_dict(randomize(twins.CifarResNet18(depths=(1, 1, 1, 1))))
    mu = np.asarray(resnet18_cifar.MEAN, np.float32).reshape(1, 3, 1, 1)
    sigma = np.asarray(resnet18_cifar.STD, np.float32).reshape(1, 3, 1, 1)
    from_torch("resnet18_cifar", dict(tensors, mu=mu, sigma=sigma), depths=(1, 1, 1, 1))  # as the model
    halves = np.full((1, 3, 1, 1), 0.5, np.float32)
    with pytest.raises(ValueError, match=r"sigma=\[0.5, 0.5, 0.5\].*classifier.replace"):
        from_torch("resnet18_cifar", dict(tensors, mu=mu, sigma=halves), depths=(1, 1, 1, 1))


def test_wrong_state_dicts_name_each_problem():
    tensors = state_dict(twins.ChenyaofoCifarResNet(3))
    broken = {k: v for k, v in tensors.items() if k != "layer2.0.downsample.0.weight"}
    broken["layer4.0.conv1.weight"] = np.zeros((8, 8, 3, 3), np.float32)
    with pytest.raises(ValueError) as error:
        from_torch("resnet20_cifar", broken)
    assert "missing layer2.0.downsample.0.weight" in str(error.value)
    assert "unexpected layer4.0.conv1.weight (8, 8, 3, 3)" in str(error.value)
    with pytest.raises(ValueError, match=r"fc.kernel has shape \(64, 100\), expected \(64, 10\)"):
        from_torch("resnet20_cifar", state_dict(twins.ChenyaofoCifarResNet(3, num_classes=100)))
    assert from_torch("resnet20_cifar", state_dict(twins.ChenyaofoCifarResNet(3, num_classes=100)),
                      num_classes=100).num_classes == 100

    dm = state_dict(twins.DMWideResNet(16, 1))
    with pytest.raises(ValueError, match="missing std"):
        from_torch("wrn_70_16", {k: v for k, v in dm.items() if k != "std"}, depth=16, width=1)
    wrn = state_dict(twins.WideResNet(16, 2))
    wrong = dict(wrn, **{"block2.layer.0.convShortcut.weight": np.zeros((32, 32, 1, 1), np.float32)})
    with pytest.raises(ValueError, match=r"block2.layer.0.convShortcut.kernel has shape \(1, 1, 32, 32\)"):
        from_torch("wrn_28_10", wrong, depth=16, widen_factor=2)


def test_invalid_sizes_are_rejected():
    with pytest.raises(ValueError, match="depth must be 6n \\+ 4"):
        rj.zoo.create("wrn_28_10", pretrained=False, depth=27)
    with pytest.raises(ValueError, match="activation must be one of"):
        rj.zoo.create("wrn_70_16", pretrained=False, depth=10, width=1, activation="gelu")
    with pytest.raises(ValueError, match="four positive block counts"):
        rj.zoo.create("resnet18_cifar", pretrained=False, depths=(1, 1, 1))
