"""ImageNet ResNets as torchvision builds them: ResNet-18/34/50/101/152 (He et al., "Deep
Residual Learning for Image Recognition", 2016), ResNeXt-50 32x4d and 101 32x8d (Xie et al.,
"Aggregated Residual Transformations for Deep Neural Networks", 2017) and Wide-ResNet-50-2
and 101-2 (Zagoruyko and Komodakis, "Wide Residual Networks", 2016, in torchvision's
bottleneck form).

torchvision's "ResNet v1.5": the stride of a bottleneck sits on its 3x3 convolution. The
stem is a 7x7 stride-2 convolution, BatchNorm, ReLU and a 3x3 stride-2 max pool padded by
1; the head is global average pooling and a linear layer. A bottleneck's inner width is
``int(planes * width_per_group / 64) * groups``. Layer names follow torchvision, so
``Classifier.features`` keys ("layer2.0.downsample") match torch module names.
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
)

INPUT_SHAPE = (224, 224, 3)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PLANES = (64, 128, 256, 512)


class BasicBlock(nnx.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + downsample(x))`` with 3x3 convolutions."""

    expansion = 1

    def __init__(self, in_features: int, planes: int, stride: int, groups: int = 1,
                 width_per_group: int = 64, *, rngs: nnx.Rngs):
        if groups != 1 or width_per_group != 64:
            raise ValueError("BasicBlock supports only groups=1 and width_per_group=64 (as torchvision)")
        self.conv1 = conv(in_features, planes, 3, stride=stride, rngs=rngs)
        self.bn1 = batch_norm(planes, rngs)
        self.conv2 = conv(planes, planes, 3, rngs=rngs)
        self.bn2 = batch_norm(planes, rngs)
        changes_shape = stride != 1 or in_features != planes
        self.downsample = ConvBN(in_features, planes, stride=stride, rngs=rngs) if changes_shape else None

    def __call__(self, x: jax.Array) -> jax.Array:
        out = nnx.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return nnx.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nnx.Module):
    """1x1 reduce, 3x3 (strided, grouped), 1x1 expand by 4, each with BatchNorm; residual sum
    and ReLU."""

    expansion = 4

    def __init__(self, in_features: int, planes: int, stride: int, groups: int = 1,
                 width_per_group: int = 64, *, rngs: nnx.Rngs):
        width = int(planes * (width_per_group / 64.0)) * groups
        out_features = planes * self.expansion
        self.conv1 = conv(in_features, width, 1, rngs=rngs)
        self.bn1 = batch_norm(width, rngs)
        self.conv2 = conv(width, width, 3, stride=stride, groups=groups, rngs=rngs)
        self.bn2 = batch_norm(width, rngs)
        self.conv3 = conv(width, out_features, 1, rngs=rngs)
        self.bn3 = batch_norm(out_features, rngs)
        changes_shape = stride != 1 or in_features != out_features
        self.downsample = ConvBN(in_features, out_features, stride=stride, rngs=rngs) if changes_shape else None

    def __call__(self, x: jax.Array) -> jax.Array:
        out = nnx.relu(self.bn1(self.conv1(x)))
        out = nnx.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return nnx.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nnx.Module):
    """Stem (conv7x7/2, BN, ReLU, maxpool3x3/2), four stages of blocks (strides 1, 2, 2, 2),
    global average pooling, linear ``fc``."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: tuple[int, ...],
                 num_classes: int = 1000, groups: int = 1, width_per_group: int = 64, *, rngs: nnx.Rngs):
        if len(layers) != 4 or min(layers) < 1:
            raise ValueError(f"layers must be four positive block counts, got {layers!r}")
        self.conv1 = conv(3, PLANES[0], 7, stride=2, padding=3, rngs=rngs)
        self.bn1 = batch_norm(PLANES[0], rngs)
        in_features = PLANES[0]
        for stage, (planes, depth) in enumerate(zip(PLANES, layers), start=1):
            blocks = []
            for index in range(depth):
                stride = 2 if stage > 1 and index == 0 else 1
                blocks.append(block(in_features, planes, stride, groups, width_per_group, rngs=rngs))
                in_features = planes * block.expansion
            setattr(self, f"layer{stage}", nnx.List(blocks))
        self.fc = nnx.Linear(in_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        return self.fc(global_average_pool(x))


def convert_block(weights: TorchWeights, prefix: str, bottleneck: bool) -> dict:
    """One torchvision-layout block (``conv1``/``bn1``..., ``downsample.0/1``) in :class:`BasicBlock`'s
    or :class:`Bottleneck`'s layout."""
    names = ("conv1", "conv2", "conv3") if bottleneck else ("conv1", "conv2")
    out = {}
    for index, name in enumerate(names, start=1):
        out[name] = weights.conv(f"{prefix}.{name}")
        out[f"bn{index}"] = weights.batch_norm(f"{prefix}.bn{index}")
    if has_module(weights, f"{prefix}.downsample"):
        out["downsample"] = {"conv": weights.conv(f"{prefix}.downsample.0"),
                             "bn": weights.batch_norm(f"{prefix}.downsample.1")}
    return out


def convert_resnet(weights: TorchWeights) -> dict:
    """A torchvision ResNet / ResNeXt / Wide-ResNet state dict in this module's layout
    (the block type is read from the presence of ``layer1.0.conv3``)."""
    bottleneck = "layer1.0.conv3.weight" in weights
    out = {"conv1": weights.conv("conv1"), "bn1": weights.batch_norm("bn1"), "fc": weights.linear("fc")}
    for stage in range(1, 5):
        prefix = f"layer{stage}"
        out[prefix] = {index: convert_block(weights, f"{prefix}.{index}", bottleneck)
                       for index in range(count_blocks(weights, prefix, "conv1.weight"))}
    return out


# name: (block, blocks per stage, groups, width_per_group), as torchvision.models.<name>
VARIANTS = {
    "resnet18": (BasicBlock, (2, 2, 2, 2), 1, 64),
    "resnet34": (BasicBlock, (3, 4, 6, 3), 1, 64),
    "resnet50": (Bottleneck, (3, 4, 6, 3), 1, 64),
    "resnet101": (Bottleneck, (3, 4, 23, 3), 1, 64),
    "resnet152": (Bottleneck, (3, 8, 36, 3), 1, 64),
    "resnext50_32x4d": (Bottleneck, (3, 4, 6, 3), 32, 4),
    "resnext101_32x8d": (Bottleneck, (3, 4, 23, 3), 32, 8),
    "wide_resnet50_2": (Bottleneck, (3, 4, 6, 3), 1, 128),
    "wide_resnet101_2": (Bottleneck, (3, 4, 23, 3), 1, 128),
}


def _register(name: str, block, layers: tuple[int, ...], groups: int, width_per_group: int) -> None:
    def build(*, key: jax.Array, num_classes: int = 1000,
              layers: tuple[int, ...] = layers, image_size: int = INPUT_SHAPE[0]) -> Classifier:
        module = ResNet(block, tuple(layers), num_classes, groups, width_per_group, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=(image_size, image_size, 3),
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    build.__doc__ = (f"torchvision {name}: {block.__name__} blocks {layers}, groups {groups}, "
                     f"width per group {width_per_group}; ImageNet normalisation, 224x224 input. "
                     "``layers`` and ``image_size`` build reduced versions.")
    register_model(name, family="resnet", weights=None, convert=convert_resnet,
                   torch_source=f"torchvision.models.{name}")(build)


for _name, _config in VARIANTS.items():
    _register(_name, *_config)
