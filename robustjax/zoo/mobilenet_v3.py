"""MobileNetV3-Large (Howard et al., "Searching for MobileNetV3", ICCV 2019) as RobustART
builds it (``prototype.model.mobilenet_v3``, ``mode="large"``), at width multipliers 0.35,
0.5, 0.75, 1.0 and 1.4.

RobustART's network is neither torchvision's nor timm's, and only its own definition gives
the parameter counts RobustART reports (2.10M, 2.67M, 3.91M, 5.48M, 9.97M; torchvision
``mobilenet_v3_large(width_mult=w)`` has 1.00M, 1.73M, 3.38M, 5.48M, 9.99M and timm 2.13M,
2.69M, 3.99M, 5.48M, 8.81M). What sets it apart:

* the stem always has 16 channels, whatever the width (only block channels are scaled);
* the first block expands 16 to ``make_divisible(16 * width)`` channels when they differ;
* squeeze-excitation sits between the depthwise BatchNorm and its activation, and is two
  bias-free linear layers (``channels -> channels // 4 -> channels``, ReLU, hard sigmoid);
* the head is a 1x1 convolution to ``make_divisible(960 * width)`` with BatchNorm and hard
  swish, global average pooling, a 1x1 convolution *with* bias to 1280 channels
  (``make_divisible(1280 * width)`` when width > 1) and hard swish, then dropout and a
  linear classifier.

Hard swish is ``x * relu6(x + 3) / 6`` and hard sigmoid ``relu6(x + 3) / 6``, as in the
paper. BatchNorm has PyTorch's defaults. Parameter names follow RobustART's, so its
checkpoints (with ``module.`` prefixes removed) convert directly.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx
from jaxtyping import Array, Float

from robustjax.checks import check_positive_float
from robustjax.classifier import Classifier
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.mobilenet_v2 import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    INPUT_SHAPE,
    Sequential,
    batch_norm,
    check_build_sizes,
    convert_conv_bn,
    feature_indices,
    make_divisible,
)
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import conv, global_average_pool

# (kernel, expanded channels, output channels, squeeze-excitation, hard swish, stride),
# Table 1 of the paper.
LARGE_SETTING = (
    (3, 16, 16, False, False, 1),
    (3, 64, 24, False, False, 2),
    (3, 72, 24, False, False, 1),
    (5, 72, 40, True, False, 2),
    (5, 120, 40, True, False, 1),
    (5, 120, 40, True, False, 1),
    (3, 240, 80, False, True, 2),
    (3, 200, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 480, 112, True, True, 1),
    (3, 672, 112, True, True, 1),
    (5, 672, 160, True, True, 2),
    (5, 960, 160, True, True, 1),
    (5, 960, 160, True, True, 1),
)
STEM_FEATURES = 16
LAST_FEATURES = 1280
WIDTHS = {"x0_35": 0.35, "x0_5": 0.5, "x0_75": 0.75, "x1_0": 1.0, "x1_4": 1.4}


def identity(x: jax.Array) -> jax.Array:
    """The block's placeholder where a layer without squeeze-excitation would have it."""
    return x


def keepdims_average_pool(x: jax.Array) -> jax.Array:
    """(B, H, W, C) -> (B, 1, 1, C), ``nn.AdaptiveAvgPool2d(1)``."""
    return x.mean(axis=(1, 2), keepdims=True)


class SqueezeExcite(nnx.Module):
    """``x * hard_sigmoid(W2 relu(W1 mean_hw(x)))`` with bias-free ``fc.0`` (C -> C // 4) and
    ``fc.2`` (C // 4 -> C), RobustART's ``SEModule``."""

    def __init__(self, channels: int, reduction: int = 4, *, rngs: nnx.Rngs):
        squeezed = channels // reduction
        self.fc = Sequential(nnx.Linear(channels, squeezed, use_bias=False, rngs=rngs), jax.nn.relu,
                             nnx.Linear(squeezed, channels, use_bias=False, rngs=rngs), jax.nn.hard_sigmoid)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.fc(global_average_pool(x))[:, None, None, :]


class InvertedResidual(nnx.Module):
    """``conv``: [1x1 expansion, BN, activation] (when the expanded width differs from the
    input's), depthwise ``kernel`` x ``kernel`` (strided), BN, squeeze-excitation or identity,
    activation, linear 1x1 projection, BN; plus the input when stride is 1 and the width is
    kept."""

    def __init__(self, in_features: int, out_features: int, kernel: int, stride: int, expanded: int,
                 squeeze_excite: bool, activation: Callable[[jax.Array], jax.Array], *, rngs: nnx.Rngs):
        self.use_res_connect = stride == 1 and in_features == out_features
        expand = ([conv(in_features, expanded, 1, rngs=rngs), batch_norm(expanded, rngs), activation]
                  if in_features != expanded else [])
        self.conv = Sequential(
            *expand,
            conv(expanded, expanded, kernel, stride=stride, padding=(kernel - 1) // 2, groups=expanded, rngs=rngs),
            batch_norm(expanded, rngs),
            SqueezeExcite(expanded, rngs=rngs) if squeeze_excite else identity,
            activation,
            conv(expanded, out_features, 1, rngs=rngs),
            batch_norm(out_features, rngs),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        out = self.conv(x)
        return x + out if self.use_res_connect else out


class MobileNetV3Large(nnx.Module):
    """``features``: stem (conv 3x3/2, BN, hard swish), 15 inverted residual blocks, head
    (conv 1x1, BN, hard swish), average pool, conv 1x1 with bias, hard swish; then
    ``classifier`` (dropout, linear)."""

    def __init__(
        self,
        width_mult: float = 1.0,
        num_classes: int = 1000,
        setting: tuple[tuple[int, int, int, bool, bool, int], ...] = LARGE_SETTING,
        dropout: float = 0.8,
        *,
        rngs: nnx.Rngs,
    ):
        check_positive_float(width_mult, "width_mult")
        last_features = make_divisible(LAST_FEATURES * width_mult) if width_mult > 1.0 else LAST_FEATURES
        layers = [Sequential(conv(3, STEM_FEATURES, 3, stride=2, padding=1, rngs=rngs),
                             batch_norm(STEM_FEATURES, rngs), jax.nn.hard_swish)]
        in_features = STEM_FEATURES
        for kernel, expanded, channels, squeeze_excite, hard_swish, stride in setting:
            out_features = make_divisible(channels * width_mult)
            activation = jax.nn.hard_swish if hard_swish else jax.nn.relu
            layers.append(InvertedResidual(in_features, out_features, kernel, stride,
                                           make_divisible(expanded * width_mult), squeeze_excite, activation,
                                           rngs=rngs))
            in_features = out_features
        head_features = make_divisible(960 * width_mult)
        layers += [
            Sequential(conv(in_features, head_features, 1, rngs=rngs), batch_norm(head_features, rngs),
                       jax.nn.hard_swish),
            keepdims_average_pool,
            nnx.Conv(head_features, last_features, (1, 1), padding="VALID", rngs=rngs,
                     conv_general_dilated=conv_general_dilated),
            jax.nn.hard_swish,
        ]
        self.features = Sequential(*layers)
        self.classifier = Sequential(nnx.Dropout(dropout), nnx.Linear(last_features, num_classes, rngs=rngs))

    def __call__(self, x: Float[Array, "b h w 3"]) -> Float[Array, "b k"]:
        return self.classifier(global_average_pool(self.features(x)))


def _convert_block(weights: TorchWeights, prefix: str) -> dict:
    """A block's ``conv`` children; it expands when it has nine children (``conv.8``)."""
    first = 3 if f"{prefix}.8.running_mean" in weights else 0
    block = {"0": weights.conv(f"{prefix}.0"), "1": weights.batch_norm(f"{prefix}.1")} if first else {}
    block[str(first)] = weights.conv(f"{prefix}.{first}")
    block[str(first + 1)] = weights.batch_norm(f"{prefix}.{first + 1}")
    squeeze_excite = f"{prefix}.{first + 2}.fc"
    if f"{squeeze_excite}.0.weight" in weights:
        block[str(first + 2)] = {"fc": {"0": weights.linear(f"{squeeze_excite}.0", bias=False),
                                        "2": weights.linear(f"{squeeze_excite}.2", bias=False)}}
    block[str(first + 4)] = weights.conv(f"{prefix}.{first + 4}")
    block[str(first + 5)] = weights.batch_norm(f"{prefix}.{first + 5}")
    return block


def convert_mobilenet_v3(weights: TorchWeights) -> dict:
    """A RobustART MobileNetV3-Large state dict in this module's layout. The blocks are the
    ``features.i`` with a ``conv`` child; after them come the head (conv, BN), the pool and
    the biased 1x1 convolution."""
    indices = feature_indices(weights)
    blocks = [i for i in indices if f"features.{i}.conv.0.weight" in weights]
    head = blocks[-1] + 1 if blocks else 1
    features = {"0": convert_conv_bn(weights, "features.0"), str(head): convert_conv_bn(weights, f"features.{head}"),
                str(head + 2): weights.conv(f"features.{head + 2}", bias=True)}
    for index in blocks:
        features[str(index)] = {"conv": _convert_block(weights, f"features.{index}.conv")}
    return {"features": features, "classifier": {"1": weights.linear("classifier.1")}}


def _register(suffix: str, width_mult: float) -> None:
    name = f"mobilenet_v3_large_{suffix}"

    def build(*, key: jax.Array, num_classes: int = 1000,
              image_size: int = INPUT_SHAPE[0]) -> Classifier:
        check_build_sizes(num_classes, image_size)
        module = MobileNetV3Large(width_mult, num_classes, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=(image_size, image_size, 3),
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    build.__doc__ = (f"MobileNetV3-Large at width {width_mult}, RobustART's definition; ImageNet "
                     "normalisation, 224x224 input (``image_size`` overrides it).")
    register_model(name, family="mobilenet_v3", weights=None, convert=convert_mobilenet_v3,
                   torch_source=f"RobustART:prototype.model.mobilenet_v3(mode='large', scale={width_mult})")(build)


for _suffix, _width in WIDTHS.items():
    _register(_suffix, _width)
