"""MobileNetV2 (Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks",
CVPR 2018) as torchvision builds it, at width multipliers 0.5, 0.75, 1.0 and 1.4.

A 3x3 stride-2 stem, 17 inverted residual blocks (1x1 expansion, 3x3 depthwise, linear 1x1
projection, identity shortcut when the shape is kept), a 1x1 convolution to
``1280 * max(1, width)`` channels, global average pooling, dropout and a linear layer; ReLU6
activations and BatchNorm with PyTorch's defaults. Channel counts are rounded to multiples
of 8 (:func:`make_divisible`). RobustART's ``prototype.model.mobilenet_v2`` is the same
network with the same parameter names, so its checkpoints convert too.

This module also holds the pieces that the other mobile families (MobileNetV3,
EfficientNet) share: :class:`Sequential`, which keeps ``torch.nn.Sequential``'s numeric
child names, and :func:`conv_bn_act`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx
from jaxtyping import Array, Float

from robustjax.checks import check_positive_float, check_positive_int
from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import conv, global_average_pool

INPUT_SHAPE = (224, 224, 3)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# (expansion t, output channels c, repeats n, first stride s), Table 2 of the paper.
INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
WIDTHS = {"x0_5": 0.5, "x0_75": 0.75, "x1_0": 1.0, "x1_4": 1.4}


def make_divisible(value: float, divisor: int = 8) -> int:
    """``value`` rounded to the nearest multiple of ``divisor`` (at least ``divisor``), rounded
    up one step more when rounding lost over 10%: the channel rounding of the TensorFlow
    MobileNet code that torchvision and timm copy."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class Sequential(nnx.Module):
    """Layers applied in order, held as attributes ``"0"``, ``"1"``, ... like
    ``torch.nn.Sequential``'s children, so parameter paths and ``Classifier.features`` keys
    are the PyTorch module names. Parameter-free layers (activations, pooling) may be plain
    functions; they keep their index but hold no state."""

    def __init__(self, *layers: Callable[[jax.Array], jax.Array]):
        for index, layer in enumerate(layers):
            setattr(self, str(index), layer)
        self.length = len(layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        for index in range(self.length):
            x = getattr(self, str(index))(x)
        return x


def batch_norm(features: int, rngs: nnx.Rngs, *, eps: float = 1e-5, momentum: float = 0.1) -> nnx.BatchNorm:
    """BatchNorm with PyTorch's ``eps`` and ``momentum`` conventions (defaults as
    ``nn.BatchNorm2d``; Flax's momentum weighs the old running average, PyTorch's the new
    batch)."""
    return nnx.BatchNorm(features, momentum=1.0 - momentum, epsilon=eps, rngs=rngs)


def conv_bn_act(
    in_features: int,
    out_features: int,
    kernel: int,
    *,
    stride: int = 1,
    groups: int = 1,
    activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu6,
    bn_eps: float = 1e-5,
    bn_momentum: float = 0.1,
    rngs: nnx.Rngs,
) -> Sequential:
    """torchvision's ``Conv2dNormActivation``: a bias-free convolution padded by
    ``(kernel - 1) // 2`` on every side, BatchNorm, then ``activation`` (left out when None)."""
    layers = [conv(in_features, out_features, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups,
                   rngs=rngs),
              batch_norm(out_features, rngs, eps=bn_eps, momentum=bn_momentum)]
    return Sequential(*layers, *([] if activation is None else [activation]))


class InvertedResidual(nnx.Module):
    """``conv``: [1x1 expansion to ``round(in * t)`` channels, ReLU6] (only when t != 1),
    3x3 depthwise (strided) with ReLU6, linear 1x1 projection with BatchNorm; the input is
    added back when stride is 1 and the channel count is kept."""

    def __init__(self, in_features: int, out_features: int, stride: int, expand_ratio: int, *, rngs: nnx.Rngs):
        hidden = round(in_features * expand_ratio)
        self.use_res_connect = stride == 1 and in_features == out_features
        expand = [conv_bn_act(in_features, hidden, 1, rngs=rngs)] if expand_ratio != 1 else []
        self.conv = Sequential(
            *expand,
            conv_bn_act(hidden, hidden, 3, stride=stride, groups=hidden, rngs=rngs),
            conv(hidden, out_features, 1, rngs=rngs),
            batch_norm(out_features, rngs),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        out = self.conv(x)
        return x + out if self.use_res_connect else out


class MobileNetV2(nnx.Module):
    """``features`` (stem, inverted residual blocks, 1x1 head convolution), global average
    pooling, ``classifier`` (dropout, linear)."""

    def __init__(
        self,
        width_mult: float = 1.0,
        num_classes: int = 1000,
        setting: tuple[tuple[int, int, int, int], ...] = INVERTED_RESIDUAL_SETTING,
        dropout: float = 0.2,
        *,
        rngs: nnx.Rngs,
    ):
        check_positive_float(width_mult, "width_mult")
        in_features = make_divisible(32 * width_mult)
        last_features = make_divisible(1280 * max(1.0, width_mult))
        layers = [conv_bn_act(3, in_features, 3, stride=2, rngs=rngs)]
        for expand_ratio, channels, repeats, stride in setting:
            out_features = make_divisible(channels * width_mult)
            for index in range(repeats):
                layers.append(InvertedResidual(in_features, out_features, stride if index == 0 else 1,
                                               expand_ratio, rngs=rngs))
                in_features = out_features
        layers.append(conv_bn_act(in_features, last_features, 1, rngs=rngs))
        self.features = Sequential(*layers)
        self.classifier = Sequential(nnx.Dropout(dropout), nnx.Linear(last_features, num_classes, rngs=rngs))

    def __call__(self, x: Float[Array, "b h w 3"]) -> Float[Array, "b k"]:
        return self.classifier(global_average_pool(self.features(x)))


def check_build_sizes(num_classes: int, image_size: int) -> None:
    """Raises a ValueError for a non-positive or non-integer class count or image size."""
    check_positive_int(num_classes, "num_classes")
    check_positive_int(image_size, "image_size")


def feature_indices(weights: TorchWeights, prefix: str = "features") -> list[int]:
    """The numeric child indices ``i`` of ``{prefix}.{i}...`` in a state dict, sorted."""
    start = len(prefix) + 1
    children = {name[start:].split(".")[0] for name in weights.tensors if name.startswith(f"{prefix}.")}
    return sorted(int(child) for child in children if child.isdigit())


def convert_conv_bn(weights: TorchWeights, prefix: str) -> dict:
    """``{prefix}.0`` convolution and ``{prefix}.1`` BatchNorm of a ``Conv2dNormActivation``."""
    return {"0": weights.conv(f"{prefix}.0"), "1": weights.batch_norm(f"{prefix}.1")}


def convert_mobilenet_v2(weights: TorchWeights) -> dict:
    """A torchvision (or RobustART) MobileNetV2 state dict in this module's layout; a block
    has an expansion layer when its ``conv.3`` (the projection BatchNorm) exists."""
    last = max(feature_indices(weights), default=1)
    features = {"0": convert_conv_bn(weights, "features.0"), str(last): convert_conv_bn(weights, f"features.{last}")}
    for index in range(1, last):
        prefix = f"features.{index}.conv"
        expand = [convert_conv_bn(weights, f"{prefix}.0")] if f"{prefix}.3.running_mean" in weights else []
        layers = [*expand, convert_conv_bn(weights, f"{prefix}.{len(expand)}")]
        block = {str(i): layer for i, layer in enumerate(layers)}
        block[str(len(layers))] = weights.conv(f"{prefix}.{len(layers)}")
        block[str(len(layers) + 1)] = weights.batch_norm(f"{prefix}.{len(layers) + 1}")
        features[str(index)] = {"conv": block}
    return {"features": features, "classifier": {"1": weights.linear("classifier.1")}}


def _register(suffix: str, width_mult: float) -> None:
    name = f"mobilenet_v2_{suffix}"

    def build(*, key: jax.Array, num_classes: int = 1000,
              image_size: int = INPUT_SHAPE[0]) -> Classifier:
        check_build_sizes(num_classes, image_size)
        module = MobileNetV2(width_mult, num_classes, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=(image_size, image_size, 3),
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    build.__doc__ = (f"MobileNetV2 at width {width_mult} (torchvision ``mobilenet_v2(width_mult={width_mult})``); "
                     "ImageNet normalisation, 224x224 input (``image_size`` overrides it).")
    register_model(name, family="mobilenet_v2", weights=None, convert=convert_mobilenet_v2,
                   torch_source=f"torchvision.models.mobilenet_v2(width_mult={width_mult})")(build)


for _suffix, _width in WIDTHS.items():
    _register(_suffix, _width)
