"""EfficientNet-B0 to B7 (Tan and Le, "EfficientNet: Rethinking Model Scaling for
Convolutional Neural Networks", ICML 2019) as torchvision builds them.

A 3x3 stride-2 stem, seven stages of MBConv blocks (1x1 expansion, depthwise convolution,
squeeze-excitation with ``max(1, in // 4)`` channels, linear 1x1 projection, identity
shortcut when the shape is kept), a 1x1 head convolution to ``4 * round(320 * width)``
channels, global average pooling, dropout and a linear layer; SiLU activations. Widths are
rounded to multiples of 8, depths are ``ceil(repeats * depth_mult)``. Convolutions are padded
symmetrically by ``(kernel - 1) // 2`` as PyTorch's (timm's ``tf_efficientnet_*`` ports use
TensorFlow's asymmetric "same" padding instead and do not convert here).

BatchNorm follows torchvision: PyTorch's defaults (eps 1e-5) for B0-B4 and eps 1e-3 with
momentum 0.01 for B5-B7. Residual blocks carry torchvision's stochastic depth as an
inactive drop-path layer (:mod:`robustjax.zoo.drop_path`) whose share of the rate is
``block / blocks``, torchvision's rule (its default rate is 0.2); training turns it on. Layer
names follow torchvision (``features.2.1.block.3.0``). The parameter counts equal those of
RobustART's own EfficientNets (which use other names and eps 1e-5 throughout).
"""

from __future__ import annotations

import math

import jax
from flax import nnx
from jaxtyping import Array, Float

from robustjax.checks import check_positive_float
from robustjax.classifier import Classifier
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.drop_path import DropPath, residual
from robustjax.zoo.mobilenet_v2 import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Sequential,
    check_build_sizes,
    conv_bn_act,
    convert_conv_bn,
    feature_indices,
    make_divisible,
)
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import global_average_pool

# (expansion, kernel, stride, input channels, output channels, repeats) at B0, Table 1 of the paper.
STAGES = (
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
)
# name: (width, depth, native resolution, dropout, BatchNorm eps, BatchNorm momentum).
VARIANTS = {
    "efficientnet_b0": (1.0, 1.0, 224, 0.2, 1e-5, 0.1),
    "efficientnet_b1": (1.0, 1.1, 240, 0.2, 1e-5, 0.1),
    "efficientnet_b2": (1.1, 1.2, 260, 0.3, 1e-5, 0.1),
    "efficientnet_b3": (1.2, 1.4, 300, 0.3, 1e-5, 0.1),
    "efficientnet_b4": (1.4, 1.8, 380, 0.4, 1e-5, 0.1),
    "efficientnet_b5": (1.6, 2.2, 456, 0.4, 1e-3, 0.01),
    "efficientnet_b6": (1.8, 2.6, 528, 0.5, 1e-3, 0.01),
    "efficientnet_b7": (2.0, 3.1, 600, 0.5, 1e-3, 0.01),
}


class SqueezeExcitation(nnx.Module):
    """``x * sigmoid(fc2(silu(fc1(mean_hw(x)))))`` with 1x1 convolutions ``fc1`` and ``fc2``
    that have biases (torchvision's ``SqueezeExcitation``)."""

    def __init__(self, channels: int, squeezed: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Conv(channels, squeezed, (1, 1), padding="VALID", rngs=rngs,
                            conv_general_dilated=conv_general_dilated)
        self.fc2 = nnx.Conv(squeezed, channels, (1, 1), padding="VALID", rngs=rngs,
                            conv_general_dilated=conv_general_dilated)

    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.fc2(jax.nn.silu(self.fc1(x.mean(axis=(1, 2), keepdims=True))))
        return x * jax.nn.sigmoid(scale)


class MBConv(nnx.Module):
    """``block``: [1x1 expansion, SiLU] (when it changes the width), depthwise (strided) with
    SiLU, squeeze-excitation, 1x1 projection with BatchNorm only; plus the input, through
    ``stochastic_depth``, when stride is 1 and the width is kept."""

    def __init__(self, in_features: int, out_features: int, expand_ratio: int, kernel: int, stride: int,
                 drop_path_scale: float = 0.0, *, bn_eps: float, bn_momentum: float, rngs: nnx.Rngs):
        expanded = make_divisible(in_features * expand_ratio)
        norm = {"bn_eps": bn_eps, "bn_momentum": bn_momentum, "rngs": rngs}
        self.use_res_connect = stride == 1 and in_features == out_features
        expand = ([conv_bn_act(in_features, expanded, 1, activation=jax.nn.silu, **norm)]
                  if expanded != in_features else [])
        self.block = Sequential(
            *expand,
            conv_bn_act(expanded, expanded, kernel, stride=stride, groups=expanded, activation=jax.nn.silu, **norm),
            SqueezeExcitation(expanded, max(1, in_features // 4), rngs=rngs),
            conv_bn_act(expanded, out_features, 1, activation=None, **norm),
        )
        self.stochastic_depth = DropPath(drop_path_scale) if self.use_res_connect else None

    def __call__(self, x: jax.Array) -> jax.Array:
        out = self.block(x)
        return residual(x, out, self.stochastic_depth) if self.use_res_connect else out


class EfficientNet(nnx.Module):
    """``features``: stem (conv 3x3/2, BN, SiLU), one ``Sequential`` of MBConv blocks per
    stage, head (conv 1x1, BN, SiLU); global average pooling; ``classifier`` (dropout,
    linear)."""

    def __init__(
        self,
        width_mult: float = 1.0,
        depth_mult: float = 1.0,
        num_classes: int = 1000,
        dropout: float = 0.2,
        *,
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
        stages: tuple[tuple[int, int, int, int, int, int], ...] = STAGES,
        rngs: nnx.Rngs,
    ):
        check_positive_float(width_mult, "width_mult")
        check_positive_float(depth_mult, "depth_mult")
        norm = {"bn_eps": bn_eps, "bn_momentum": bn_momentum, "rngs": rngs}
        in_features = make_divisible(stages[0][3] * width_mult)
        layers = [conv_bn_act(3, in_features, 3, stride=2, activation=jax.nn.silu, **norm)]
        total_blocks, block_id = sum(math.ceil(stage[5] * depth_mult) for stage in stages), 0
        for expand_ratio, kernel, stride, _, channels, repeats in stages:
            out_features = make_divisible(channels * width_mult)
            blocks = []
            for index in range(math.ceil(repeats * depth_mult)):
                blocks.append(MBConv(in_features, out_features, expand_ratio, kernel, stride if index == 0 else 1,
                                     block_id / total_blocks, **norm))
                block_id += 1
                in_features = out_features
            layers.append(Sequential(*blocks))
        last_features = 4 * in_features
        layers.append(conv_bn_act(in_features, last_features, 1, activation=jax.nn.silu, **norm))
        self.features = Sequential(*layers)
        self.classifier = Sequential(nnx.Dropout(dropout), nnx.Linear(last_features, num_classes, rngs=rngs))

    def __call__(self, x: Float[Array, "b h w 3"]) -> Float[Array, "b k"]:
        return self.classifier(global_average_pool(self.features(x)))


def _convert_mbconv(weights: TorchWeights, prefix: str) -> dict:
    """An MBConv's ``block`` children; it has an expansion layer when it has four (``block.3``)."""
    expand = [convert_conv_bn(weights, f"{prefix}.0")] if f"{prefix}.3.0.weight" in weights else []
    squeeze = f"{prefix}.{len(expand) + 1}"
    layers = [*expand, convert_conv_bn(weights, f"{prefix}.{len(expand)}"),
              {"fc1": weights.conv(f"{squeeze}.fc1", bias=True), "fc2": weights.conv(f"{squeeze}.fc2", bias=True)},
              convert_conv_bn(weights, f"{prefix}.{len(expand) + 2}")]
    return {str(index): layer for index, layer in enumerate(layers)}


def convert_efficientnet(weights: TorchWeights) -> dict:
    """A torchvision EfficientNet-B* state dict in this module's layout: ``features.0`` is
    the stem, the last ``features`` child the head, those between are stages."""
    last = max(feature_indices(weights), default=1)
    features = {"0": convert_conv_bn(weights, "features.0"), str(last): convert_conv_bn(weights, f"features.{last}")}
    for stage in range(1, last):
        prefix = f"features.{stage}"
        features[str(stage)] = {str(block): {"block": _convert_mbconv(weights, f"{prefix}.{block}.block")}
                                for block in feature_indices(weights, prefix)}
    return {"features": features, "classifier": {"1": weights.linear("classifier.1")}}


def _register(name: str, width_mult: float, depth_mult: float, resolution: int, dropout: float,
              bn_eps: float, bn_momentum: float) -> None:
    def build(*, key: jax.Array, num_classes: int = 1000,
              image_size: int = resolution) -> Classifier:
        check_build_sizes(num_classes, image_size)
        module = EfficientNet(width_mult, depth_mult, num_classes, dropout, bn_eps=bn_eps, bn_momentum=bn_momentum,
                              rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=(image_size, image_size, 3),
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    build.__doc__ = (f"torchvision {name}: width {width_mult}, depth {depth_mult}, BatchNorm eps {bn_eps}; "
                     f"ImageNet normalisation, native {resolution}x{resolution} input (``image_size`` overrides "
                     "it; RobustART trained every variant at 224).")
    register_model(name, family="efficientnet", weights=None, convert=convert_efficientnet,
                   torch_source=f"torchvision.models.{name}")(build)


for _name, _config in VARIANTS.items():
    _register(_name, *_config)
