"""ResNet-18 for 32x32 CIFAR images (He et al., "Deep Residual Learning for Image
Recognition", 2016), in the variant used by robustness leaderboards and torchattacks'
examples: a 3x3 stem without max pool, BasicBlocks [2, 2, 2, 2] of widths 64-512,
global average pooling and a linear head. Layer names follow the PyTorch original."""

from __future__ import annotations

import jax
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.zoo.registry import register_model

NAME = "resnet18_cifar"
INPUT_SHAPE = (32, 32, 3)
# Per-channel statistics of the CIFAR-10 training split.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2471, 0.2435, 0.2616)
WIDTHS = (64, 128, 256, 512)
DEPTHS = (2, 2, 2, 2)


def batch_norm(features: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
    """BatchNorm with PyTorch's defaults (eps 1e-5, running-average momentum 0.1)."""
    return nnx.BatchNorm(features, momentum=0.9, epsilon=1e-5, rngs=rngs)


def conv3x3(in_features: int, out_features: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    """3x3 convolution without bias, padded by 1 on every side as PyTorch's ``padding=1``
    (Flax's ``"SAME"`` pads stride-2 convolutions of even inputs on one side only)."""
    return nnx.Conv(in_features, out_features, (3, 3), strides=stride, padding=((1, 1), (1, 1)),
                    use_bias=False, rngs=rngs)


class Shortcut(nnx.Module):
    """1x1 strided convolution and BatchNorm, for blocks that change the shape."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(in_features, out_features, (1, 1), strides=stride, padding="VALID",
                             use_bias=False, rngs=rngs)
        self.bn = batch_norm(out_features, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(x))


class BasicBlock(nnx.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = conv3x3(in_features, out_features, stride, rngs)
        self.bn1 = batch_norm(out_features, rngs)
        self.conv2 = conv3x3(out_features, out_features, 1, rngs)
        self.bn2 = batch_norm(out_features, rngs)
        changes_shape = stride != 1 or in_features != out_features
        self.shortcut = Shortcut(in_features, out_features, stride, rngs=rngs) if changes_shape else None

    def __call__(self, x: jax.Array) -> jax.Array:
        out = nnx.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return nnx.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class ResNetCIFAR(nnx.Module):
    """conv3x3(64) - BN - ReLU - four stages of BasicBlocks - global average pool - linear."""

    def __init__(self, num_classes: int = 10, depths: tuple[int, ...] = DEPTHS, *, rngs: nnx.Rngs):
        self.conv1 = conv3x3(3, WIDTHS[0], 1, rngs)
        self.bn1 = batch_norm(WIDTHS[0], rngs)
        in_features = WIDTHS[0]
        for stage, (width, depth) in enumerate(zip(WIDTHS, depths), start=1):
            blocks = []
            for index in range(depth):
                stride = 2 if stage > 1 and index == 0 else 1
                blocks.append(BasicBlock(in_features, width, stride, rngs=rngs))
                in_features = width
            setattr(self, f"layer{stage}", nnx.List(blocks))
        self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn1(self.conv1(x)))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        return self.linear(x.mean(axis=(1, 2)))


@register_model(NAME, family="resnet_cifar", weights=None)
def resnet18_cifar(*, key: jax.Array, pretrained: bool = False, num_classes: int = 10) -> Classifier:
    """CIFAR ResNet-18 (11.2M parameters), random initialisation only."""
    if pretrained:
        raise ValueError(f"model {NAME!r} has no pretrained weights; pass pretrained=False")
    module = ResNetCIFAR(num_classes, rngs=nnx.Rngs(params=key))
    return Classifier.from_nnx(
        module, num_classes=num_classes, input_shape=INPUT_SHAPE, mean=MEAN, std=STD, name=NAME
    )
