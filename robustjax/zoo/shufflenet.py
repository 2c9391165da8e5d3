"""ShuffleNetV2 x0.5 / x1.0 / x1.5 / x2.0 (Ma et al., "ShuffleNet V2: Practical Guidelines
for Efficient CNN Architecture Design", ECCV 2018) as ``torchvision.models.shufflenetv2``.

Each unit splits its channels in two (or, when it downsamples, feeds the input to two
branches), passes one half through 1x1 conv - 3x3 depthwise conv - 1x1 conv, concatenates
and shuffles the channels across the two halves. PyTorch's ``nn.Sequential`` containers
are ``nnx.List`` here, with the same indices (ReLUs included), so activations are keyed
as PyTorch names its modules (``stage2.0.branch2.5``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import batch_norm, conv, global_average_pool

INPUT_SHAPE = (224, 224, 3)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
STAGES_REPEATS = (4, 8, 4)
# name: channels of conv1, stage2, stage3, stage4, conv5.
STAGES_OUT_CHANNELS = {
    "shufflenet_v2_x0_5": (24, 48, 96, 192, 1024),
    "shufflenet_v2_x1_0": (24, 116, 232, 464, 1024),
    "shufflenet_v2_x1_5": (24, 176, 352, 704, 1024),
    "shufflenet_v2_x2_0": (24, 244, 488, 976, 2048),
}


class ReLU(nnx.Module):
    """``nn.ReLU`` as a module, so that ``nnx.List`` indices match ``nn.Sequential``'s."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(x)


def run_sequential(layers: nnx.List, x: jax.Array) -> jax.Array:
    """``nn.Sequential.forward``: each layer of ``layers`` applied in turn."""
    for layer in layers:
        x = layer(x)
    return x


def channel_shuffle(x: Float[Array, "b h w c"], groups: int) -> Float[Array, "b h w c"]:
    """Interleaves ``groups`` equal channel groups: channel ``g * (C / groups) + i`` moves to
    ``i * groups + g`` (torchvision's view-transpose-view on NCHW)."""
    *spatial, channels = x.shape
    grouped = x.reshape(*spatial, groups, channels // groups)
    return jnp.swapaxes(grouped, -1, -2).reshape(*spatial, channels)


def depthwise_conv(features: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    return conv(features, features, 3, stride=stride, groups=features, rngs=rngs)


class InvertedResidual(nnx.Module):
    """A ShuffleNetV2 unit; ``branch1`` exists only in the first, stride-2 unit of a stage."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        branch_features = out_features // 2
        self.stride = stride
        self.branch1 = nnx.List([
            depthwise_conv(in_features, stride, rngs), batch_norm(in_features, rngs),
            conv(in_features, branch_features, 1, rngs=rngs), batch_norm(branch_features, rngs), ReLU(),
        ]) if stride > 1 else None
        self.branch2 = nnx.List([
            conv(in_features if stride > 1 else branch_features, branch_features, 1, rngs=rngs),
            batch_norm(branch_features, rngs), ReLU(),
            depthwise_conv(branch_features, stride, rngs), batch_norm(branch_features, rngs),
            conv(branch_features, branch_features, 1, rngs=rngs), batch_norm(branch_features, rngs),
            ReLU(),
        ])

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.branch1 is None:
            kept, transformed = jnp.split(x, 2, axis=-1)
            out = jnp.concatenate([kept, run_sequential(self.branch2, transformed)], axis=-1)
        else:
            branches = (run_sequential(self.branch1, x), run_sequential(self.branch2, x))
            out = jnp.concatenate(branches, axis=-1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nnx.Module):
    """conv1 - max pool - stage2..4 - conv5 - global average pool - fc."""

    def __init__(self, stages_out_channels: tuple[int, ...],
                 stages_repeats: tuple[int, ...] = STAGES_REPEATS, num_classes: int = 1000, *,
                 rngs: nnx.Rngs):
        stem, *stage_widths, last = stages_out_channels
        self.conv1 = nnx.List([conv(3, stem, 3, stride=2, rngs=rngs), batch_norm(stem, rngs), ReLU()])
        in_features = stem
        for stage, (repeats, width) in enumerate(zip(stages_repeats, stage_widths), start=2):
            units = [InvertedResidual(in_features, width, 2, rngs=rngs)]
            units += [InvertedResidual(width, width, 1, rngs=rngs) for _ in range(repeats - 1)]
            setattr(self, f"stage{stage}", nnx.List(units))
            in_features = width
        self.num_stages = len(stage_widths)
        self.conv5 = nnx.List([conv(in_features, last, 1, rngs=rngs), batch_norm(last, rngs), ReLU()])
        self.fc = nnx.Linear(last, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = run_sequential(self.conv1, x)
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage in range(2, 2 + self.num_stages):
            x = run_sequential(getattr(self, f"stage{stage}"), x)
        x = run_sequential(self.conv5, x)
        return self.fc(global_average_pool(x))


def _conv_bn(weights: TorchWeights, conv_name: str, bn_name: str) -> dict:
    return {int(conv_name.rsplit(".", 1)[1]): weights.conv(conv_name),
            int(bn_name.rsplit(".", 1)[1]): weights.batch_norm(bn_name)}


def convert_shufflenet_v2(weights: TorchWeights) -> dict:
    """Parameters of :class:`ShuffleNetV2` from a torchvision ShuffleNetV2 state dict."""
    units_per_stage: dict[int, int] = {}
    for key in weights.tensors:
        match = re.match(r"stage(\d+)\.(\d+)\.", key)
        if match:
            stage, unit = int(match[1]), int(match[2])
            units_per_stage[stage] = max(units_per_stage.get(stage, 0), unit + 1)
    params = {"conv1": _conv_bn(weights, "conv1.0", "conv1.1"),
              "conv5": _conv_bn(weights, "conv5.0", "conv5.1"),
              "fc": weights.linear("fc")}
    for stage in range(2, max(units_per_stage, default=1) + 1):
        units = {}
        for unit in range(units_per_stage.get(stage, 0)):
            prefix = f"stage{stage}.{unit}"
            branch2 = {}
            for conv_index, bn_index in ((0, 1), (3, 4), (5, 6)):
                branch2 |= _conv_bn(weights, f"{prefix}.branch2.{conv_index}",
                                    f"{prefix}.branch2.{bn_index}")
            units[unit] = {"branch2": branch2}
            if unit == 0:
                units[unit]["branch1"] = (
                    _conv_bn(weights, f"{prefix}.branch1.0", f"{prefix}.branch1.1")
                    | _conv_bn(weights, f"{prefix}.branch1.2", f"{prefix}.branch1.3")
                )
        params[f"stage{stage}"] = units
    return params


def _register(name: str, stages_out_channels: tuple[int, ...]) -> None:
    def build(*, key: jax.Array, num_classes: int = 1000,
              stages_repeats: tuple[int, ...] = STAGES_REPEATS) -> Classifier:
        if len(stages_repeats) != len(stages_out_channels) - 2:
            raise ValueError(f"stages_repeats must have {len(stages_out_channels) - 2} entries, "
                             f"got {tuple(stages_repeats)}")
        for index, repeats in enumerate(stages_repeats):
            check_positive_int(repeats, f"stages_repeats[{index}]")
        module = ShuffleNetV2(stages_out_channels, tuple(stages_repeats), num_classes,
                              rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE,
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    width = name.rsplit("_x", 1)[1].replace("_", ".")
    build.__doc__ = f"ShuffleNetV2 x{width} (channels {stages_out_channels}), as torchvision."
    register_model(name, family="shufflenet_v2", weights=None, convert=convert_shufflenet_v2,
                   torch_source=f"torchvision.models.{name}")(build)


for _name, _channels in STAGES_OUT_CHANNELS.items():
    _register(_name, _channels)
