"""The CIFAR ResNets of He et al., "Deep Residual Learning for Image Recognition" (2016),
section 4.2: a 3x3 convolution to 16 channels, three stages of ``n`` BasicBlocks of widths
16, 32, 64 (depth ``6n + 2``), global average pooling and a linear layer.

The layout is that of chenyaofo/pytorch-cifar-models (``cifar10_resnet20`` ...), which has
published checkpoints: projection shortcuts (the paper's option B, a 1x1 strided
convolution and BatchNorm named ``downsample.0`` / ``downsample.1``) where a block changes
shape, rather than the paper's zero-padding option A. Those checkpoints were trained on
inputs normalised with mean (0.4914, 0.4822, 0.4465) and std (0.2023, 0.1994, 0.2010)
(CIFAR-100: (0.5071, 0.4865, 0.4409), (0.2009, 0.1984, 0.2023)); the builders default to
the CIFAR-10 values and accept ``mean``/``std``.
"""

from __future__ import annotations

import jax
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet import BasicBlock, convert_block
from robustjax.zoo.resnet_layers import (
    batch_norm,
    conv,
    count_blocks,
    global_average_pool,
)

INPUT_SHAPE = (32, 32, 3)
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2023, 0.1994, 0.2010)
WIDTHS = (16, 32, 64)


class CifarResNet(nnx.Module):
    """conv3x3(16) - BN - ReLU - three stages of ``blocks`` BasicBlocks - average pool - ``fc``."""

    def __init__(self, blocks: int, num_classes: int = 10, *, rngs: nnx.Rngs):
        if blocks < 1:
            raise ValueError(f"blocks per stage must be positive, got {blocks}")
        self.conv1 = conv(3, WIDTHS[0], 3, rngs=rngs)
        self.bn1 = batch_norm(WIDTHS[0], rngs)
        in_features = WIDTHS[0]
        for stage, width in enumerate(WIDTHS, start=1):
            stage_blocks = []
            for index in range(blocks):
                stage_blocks.append(BasicBlock(in_features, width, 2 if stage > 1 and index == 0 else 1, rngs=rngs))
                in_features = width
            setattr(self, f"layer{stage}", nnx.List(stage_blocks))
        self.fc = nnx.Linear(in_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn1(self.conv1(x)))
        for stage in (self.layer1, self.layer2, self.layer3):
            for block in stage:
                x = block(x)
        return self.fc(global_average_pool(x))


def convert_cifar_resnet(weights: TorchWeights) -> dict:
    """A chenyaofo ``CifarResNet`` state dict in :class:`CifarResNet`'s layout."""
    out = {"conv1": weights.conv("conv1"), "bn1": weights.batch_norm("bn1"), "fc": weights.linear("fc")}
    for stage in range(1, 4):
        prefix = f"layer{stage}"
        out[prefix] = {index: convert_block(weights, f"{prefix}.{index}", bottleneck=False)
                       for index in range(count_blocks(weights, prefix, "conv1.weight"))}
    return out


def _register(depth: int) -> None:
    name = f"resnet{depth}_cifar"
    blocks = (depth - 2) // 6

    def build(*, key: jax.Array, num_classes: int = 10,
              mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> Classifier:
        module = CifarResNet(blocks, num_classes, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE, mean=mean, std=std,
                                   name=name)

    build.__doc__ = (f"CIFAR ResNet-{depth} ({blocks} blocks per stage, option-B shortcuts) in "
                     "chenyaofo/pytorch-cifar-models' layout; its CIFAR-10 normalisation by default.")
    register_model(name, family="cifar_resnet", weights=None, convert=convert_cifar_resnet,
                   torch_source=f"chenyaofo/pytorch-cifar-models:cifar10_resnet{depth}")(build)


for _depth in (20, 56):
    _register(_depth)
