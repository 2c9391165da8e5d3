"""ResNet-18 and PreAct-ResNet-18 for 32x32 CIFAR images, in the layouts of robustness
leaderboards (RobustBench's ``architectures/resnet.py``, after kuangliu/pytorch-cifar).

* ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", 2016): a 3x3 stem
  without max pool, BasicBlocks [2, 2, 2, 2] of widths 64-512 with projection shortcuts
  ``shortcut.0`` (1x1 conv) / ``shortcut.1`` (BatchNorm), global average pooling, ``linear``.
* PreAct-ResNet-18 (He et al., "Identity Mappings in Deep Residual Networks", 2016):
  ``bn1 - relu - conv1 - bn2 - relu - conv2`` blocks with a 1x1 conv shortcut
  ``shortcut.0``; RobustBench's ``PreActResNet(..., bn_before_fc=True)`` adds a final ``bn``.

Both networks take normalised images; RobustBench adds the normalisation in wrappers (as
``mu``/``sigma`` buffers or in ``forward``) or not at all. The registered models normalise with
the CIFAR-10 statistics (0.4914, 0.4822, 0.4465) / (0.2471, 0.2435, 0.2616) of the wrappers
Wong2020Fast, Rice2020OverfittingL2 and Kireev2021Effectiveness. RobustBench's bare
``ResNet18()`` / ``PreActResNet(PreActBlock, ...)`` entries (Sehwag2021Proxy_R18,
Addepalli2021Towards_RN18, Addepalli2022Efficient_RN18, Andriushchenko2020Understanding)
take [0, 1] images: set ``classifier.replace(mean=(0.0,), std=(1.0,))`` after converting
them. Converters compare stored ``mu``/``sigma`` buffers with the model's statistics.
"""

from __future__ import annotations

import jax
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import (
    ConvBN,
    batch_norm,
    conv,
    count_blocks,
    global_average_pool,
    has_module,
    take_normalization,
)

NAME = "resnet18_cifar"
PREACT_NAME = "preact_resnet18_cifar"
INPUT_SHAPE = (32, 32, 3)
# Per-channel statistics of the CIFAR-10 training split.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2471, 0.2435, 0.2616)
WIDTHS = (64, 128, 256, 512)
DEPTHS = (2, 2, 2, 2)


class BasicBlock(nnx.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = conv(in_features, out_features, 3, stride=stride, rngs=rngs)
        self.bn1 = batch_norm(out_features, rngs)
        self.conv2 = conv(out_features, out_features, 3, rngs=rngs)
        self.bn2 = batch_norm(out_features, rngs)
        changes_shape = stride != 1 or in_features != out_features
        self.shortcut = ConvBN(in_features, out_features, stride=stride, rngs=rngs) if changes_shape else None

    def __call__(self, x: jax.Array) -> jax.Array:
        out = nnx.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return nnx.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class PreActBlock(nnx.Module):
    """``conv2(relu(bn2(conv1(relu(bn1(x)))))) + shortcut``.

    The shortcut is ``x`` or a 1x1 convolution of ``x`` (RobustBench's ``PreActBlock``, used
    by Wong2020Fast); with ``shortcut_after_activation`` it convolves ``relu(bn1(x))``
    instead (kuangliu/pytorch-cifar and RobustBench's ``PreActBlockV2``). The weights are
    the same in both; only the forward pass differs.
    """

    def __init__(self, in_features: int, out_features: int, stride: int, *,
                 shortcut_after_activation: bool = False, rngs: nnx.Rngs):
        self.bn1 = batch_norm(in_features, rngs)
        self.conv1 = conv(in_features, out_features, 3, stride=stride, rngs=rngs)
        self.bn2 = batch_norm(out_features, rngs)
        self.conv2 = conv(out_features, out_features, 3, rngs=rngs)
        changes_shape = stride != 1 or in_features != out_features
        self.shortcut = conv(in_features, out_features, 1, stride=stride, rngs=rngs) if changes_shape else None
        self.shortcut_after_activation = shortcut_after_activation

    def __call__(self, x: jax.Array) -> jax.Array:
        out = nnx.relu(self.bn1(x))
        if self.shortcut is None:
            shortcut = x
        else:
            shortcut = self.shortcut(out if self.shortcut_after_activation else x)
        out = self.conv1(out)
        return self.conv2(nnx.relu(self.bn2(out))) + shortcut


def _stages(module: nnx.Module, make_block, depths: tuple[int, ...]) -> int:
    """Adds ``layer1..layer4`` (first blocks of stages 2-4 stride 2); returns the output width."""
    if len(depths) != 4 or min(depths) < 1:
        raise ValueError(f"depths must be four positive block counts, got {depths!r}")
    in_features = WIDTHS[0]
    for stage, (width, depth) in enumerate(zip(WIDTHS, depths), start=1):
        blocks = []
        for index in range(depth):
            blocks.append(make_block(in_features, width, 2 if stage > 1 and index == 0 else 1))
            in_features = width
        setattr(module, f"layer{stage}", nnx.List(blocks))
    return in_features


class ResNetCIFAR(nnx.Module):
    """conv3x3(64) - BN - ReLU - four stages of BasicBlocks - global average pool - linear."""

    def __init__(self, num_classes: int = 10, depths: tuple[int, ...] = DEPTHS, *, rngs: nnx.Rngs):
        self.conv1 = conv(3, WIDTHS[0], 3, rngs=rngs)
        self.bn1 = batch_norm(WIDTHS[0], rngs)
        width = _stages(self, lambda i, o, s: BasicBlock(i, o, s, rngs=rngs), depths)
        self.linear = nnx.Linear(width, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn1(self.conv1(x)))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        return self.linear(global_average_pool(x))


class PreActResNetCIFAR(nnx.Module):
    """conv3x3(64) - four stages of PreActBlocks - (BN-ReLU with ``bn_before_fc``) - global
    average pool - linear."""

    def __init__(self, num_classes: int = 10, depths: tuple[int, ...] = DEPTHS, *,
                 shortcut_after_activation: bool = False, bn_before_fc: bool = False, rngs: nnx.Rngs):
        self.conv1 = conv(3, WIDTHS[0], 3, rngs=rngs)
        width = _stages(self, lambda i, o, s: PreActBlock(
            i, o, s, shortcut_after_activation=shortcut_after_activation, rngs=rngs), depths)
        self.bn = batch_norm(width, rngs) if bn_before_fc else None
        self.linear = nnx.Linear(width, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv1(x)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        if self.bn is not None:
            x = nnx.relu(self.bn(x))
        return self.linear(global_average_pool(x))


def _convert_stages(weights: TorchWeights, convert_block) -> dict:
    return {f"layer{stage}": {index: convert_block(f"layer{stage}.{index}")
                              for index in range(count_blocks(weights, f"layer{stage}", "conv1.weight"))}
            for stage in range(1, 5)}


def convert_resnet_cifar(weights: TorchWeights, *, mean=MEAN, std=STD) -> dict:
    """A RobustBench / kuangliu ``ResNet18`` state dict (``shortcut.0`` conv, ``shortcut.1``
    BatchNorm) in :class:`ResNetCIFAR`'s layout."""
    take_normalization(weights, mean, std)

    def block(prefix: str) -> dict:
        out = {name: weights.conv(f"{prefix}.{name}") for name in ("conv1", "conv2")}
        out |= {name: weights.batch_norm(f"{prefix}.{name}") for name in ("bn1", "bn2")}
        if has_module(weights, f"{prefix}.shortcut"):
            out["shortcut"] = {"conv": weights.conv(f"{prefix}.shortcut.0"),
                               "bn": weights.batch_norm(f"{prefix}.shortcut.1")}
        return out

    return {"conv1": weights.conv("conv1"), "bn1": weights.batch_norm("bn1"),
            "linear": weights.linear("linear"), **_convert_stages(weights, block)}


def convert_preact_resnet_cifar(weights: TorchWeights, *, mean=MEAN, std=STD) -> dict:
    """A RobustBench ``PreActResNet`` state dict (1x1 conv shortcut ``shortcut.0``, a final
    ``bn`` with ``bn_before_fc``) in :class:`PreActResNetCIFAR`'s layout."""
    take_normalization(weights, mean, std)

    def block(prefix: str) -> dict:
        out = {name: weights.conv(f"{prefix}.{name}") for name in ("conv1", "conv2")}
        out |= {name: weights.batch_norm(f"{prefix}.{name}") for name in ("bn1", "bn2")}
        if has_module(weights, f"{prefix}.shortcut"):
            out["shortcut"] = weights.conv(f"{prefix}.shortcut.0")
        return out

    out = {"conv1": weights.conv("conv1"), "linear": weights.linear("linear"), **_convert_stages(weights, block)}
    if has_module(weights, "bn"):
        out["bn"] = weights.batch_norm("bn")
    return out


@register_model(NAME, family="resnet_cifar", weights=None, convert=convert_resnet_cifar,
                torch_source="robustbench.model_zoo.architectures.resnet.ResNet18")
def resnet18_cifar(*, key: jax.Array, num_classes: int = 10,
                   mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD,
                   depths: tuple[int, ...] = DEPTHS) -> Classifier:
    """CIFAR ResNet-18 (11.2M parameters), CIFAR-10 normalisation by default; ``depths``
    (blocks per stage) builds reduced versions."""
    module = ResNetCIFAR(num_classes, tuple(depths), rngs=nnx.Rngs(params=key))
    return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE, mean=mean, std=std,
                               name=NAME)


@register_model(PREACT_NAME, family="resnet_cifar", weights=None, convert=convert_preact_resnet_cifar,
                torch_source="robustbench.model_zoo.architectures.resnet.PreActResNet18")
def preact_resnet18_cifar(*, key: jax.Array, num_classes: int = 10,
                          mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD,
                          shortcut_after_activation: bool = False, bn_before_fc: bool = False,
                          depths: tuple[int, ...] = DEPTHS) -> Classifier:
    """CIFAR PreAct-ResNet-18 (11.2M parameters) as RobustBench's ``PreActResNet18``,
    CIFAR-10 normalisation by default; ``shortcut_after_activation=True`` gives the
    kuangliu / ``PreActBlockV2`` forward pass, ``bn_before_fc=True`` the final BN-ReLU of
    Rice2020OverfittingL2 and Kireev2021Effectiveness; ``depths`` builds reduced versions."""
    module = PreActResNetCIFAR(num_classes, tuple(depths), shortcut_after_activation=shortcut_after_activation,
                               bn_before_fc=bn_before_fc, rngs=nnx.Rngs(params=key))
    return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE, mean=mean, std=std,
                               name=PREACT_NAME)
