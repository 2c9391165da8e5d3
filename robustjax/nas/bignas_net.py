"""BigNAS ResNets in Flax NNX: one module that is either a standalone subnet or the supernet.

Built at a subnet's own shapes, :class:`BigNASResNet` is that subnet, with RobustART's module
names (``first_conv``, ``blocks.{i}.normal_conv1``, ..., ``classifier``), so RobustART's
PyTorch state dicts convert one to one. Built at the space's largest shapes it is the
supernet, and called with a :class:`SubnetChoice` it runs any subnet by masking, as BigNAS
and Once-for-All slice: the leading channels of each layer, the centre of each kernel, the
first blocks of each stage. Masking keeps every shape static, so one compiled program runs
every subnet of a resolution (for training, recalibration and population evaluation), and
its logits equal those of the standalone subnet loaded with the sliced weights.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from robustjax.nas.bignas import NUM_STAGES, BigNASConfig, BigNASSpace, make_divisible
from robustjax.nas.bignas_packed import (
    PackedSubnets,
    block_branch,
    block_layers,
    run_packed,
    stem_branch,
)
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.resnet_layers import batch_norm, global_average_pool


class SubnetChoice(NamedTuple):
    """A subnet as arrays (so it can be traced, stacked and vmapped): per stage (stem first)
    the width, the depth, the kernel size and the middle channels (0 for the stem)."""

    widths: jax.Array
    depths: jax.Array
    kernels: jax.Array
    middles: jax.Array

    @classmethod
    def of(cls, config: BigNASConfig) -> SubnetChoice:
        middles = [0] + [config.middle_channels(stage) for stage in range(1, NUM_STAGES)]
        return cls(*(np.asarray(v, np.int32) for v in (config.widths, config.depths, config.kernels, middles)))


def _channel_mask(active: jax.Array, size: int) -> jax.Array:
    return (jnp.arange(size) < active).astype(jnp.float32)


def _kernel_mask(active: jax.Array, size: int) -> jax.Array:
    """(size, size, 1, 1): ones on the centred ``active x active`` window."""
    inside = jnp.abs(jnp.arange(size) - size // 2) <= active // 2
    return (inside[:, None] & inside[None, :]).astype(jnp.float32)[:, :, None, None]


def conv(cin: int, cout: int, kernel: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    """``nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2)`` with its bias."""
    pad = kernel // 2
    return nnx.Conv(cin, cout, (kernel, kernel), strides=stride, padding=((pad, pad), (pad, pad)),
                    use_bias=True, rngs=rngs, conv_general_dilated=conv_general_dilated)


def apply_conv(layer: nnx.Conv, x: jax.Array, kernel_size: jax.Array | None) -> jax.Array:
    """``layer(x)``, with only the centred ``kernel_size`` window of its kernel when given."""
    if kernel_size is None:
        return layer(x)
    kernel = layer.kernel[...] * _kernel_mask(kernel_size, layer.kernel.shape[0])
    stride = layer.strides if isinstance(layer.strides, int) else layer.strides[0]
    y = conv_general_dilated(x, kernel, (stride, stride), layer.padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + layer.bias[...]


class ConvBN(nnx.Module):
    """A convolution (with bias) and BatchNorm: RobustART's ``conv`` / ``bn`` pair."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, *, rngs: nnx.Rngs):
        self.conv = conv(cin, cout, kernel, stride, rngs)
        self.bn = batch_norm(cout, rngs)

    def __call__(self, x: jax.Array, kernel_size: jax.Array | None = None) -> jax.Array:
        return self.bn(apply_conv(self.conv, x, kernel_size))


class Masks(NamedTuple):
    """What a masked block needs: its kernel size and its middle and output channel masks."""

    kernel: jax.Array
    middle: jax.Array
    out: jax.Array


class BasicBlock(nnx.Module):
    """Two ``kernel x kernel`` convolutions (the first with the stride) and a shortcut."""

    def __init__(self, cin: int, cout: int, mid: int, kernel: int, stride: int, projection: bool, *,
                 rngs: nnx.Rngs):
        self.normal_conv1 = ConvBN(cin, mid, kernel, stride, rngs=rngs)
        self.normal_conv2 = ConvBN(mid, cout, kernel, rngs=rngs)
        self.shortcut = ConvBN(cin, cout, 1, stride, rngs=rngs) if projection else None

    def __call__(self, x: jax.Array, masks: Masks | None = None) -> jax.Array:
        kernel = None if masks is None else masks.kernel
        h = _masked(nnx.relu(self.normal_conv1(x, kernel)), masks, "middle")
        h = self.normal_conv2(h, kernel)
        shortcut = x if self.shortcut is None else self.shortcut(x)
        return _masked(nnx.relu(h + shortcut), masks, "out")


class BottleneckBlock(nnx.Module):
    """1x1 reduce, ``kernel x kernel`` (with the stride), 1x1 expand, and a shortcut."""

    def __init__(self, cin: int, cout: int, mid: int, kernel: int, stride: int, projection: bool, *,
                 rngs: nnx.Rngs):
        self.point_conv1 = ConvBN(cin, mid, 1, rngs=rngs)
        self.normal_conv = ConvBN(mid, mid, kernel, stride, rngs=rngs)
        self.point_conv2 = ConvBN(mid, cout, 1, rngs=rngs)
        self.shortcut = conv(cin, cout, 1, stride, rngs) if projection else None
        self.shortcutbn = batch_norm(cout, rngs) if projection else None

    def __call__(self, x: jax.Array, masks: Masks | None = None) -> jax.Array:
        kernel = None if masks is None else masks.kernel
        h = _masked(nnx.relu(self.point_conv1(x)), masks, "middle")
        h = _masked(nnx.relu(self.normal_conv(h, kernel)), masks, "middle")
        h = self.point_conv2(h)
        shortcut = x if self.shortcut is None else self.shortcutbn(self.shortcut(x))
        return _masked(nnx.relu(h + shortcut), masks, "out")


def _masked(x: jax.Array, masks: Masks | None, which: str) -> jax.Array:
    return x if masks is None else x * getattr(masks, which)


@dataclasses.dataclass(frozen=True)
class Shape:
    """The static shape of a network: per stage (stem first) width, depth, kernel, middle
    channels and stride; which stages' first blocks project; the classes."""

    block: str
    widths: tuple[int, ...]
    depths: tuple[int, ...]
    kernels: tuple[int, ...]
    middles: tuple[int, ...]
    strides: tuple[int, ...]
    projections: tuple[bool, ...]
    in_channels: int
    num_classes: int

    @classmethod
    def of(cls, space: BigNASSpace, config: BigNASConfig) -> Shape:
        middles = (0,) + tuple(config.middle_channels(s) for s in range(1, NUM_STAGES))
        projections = (False,) + tuple(space.has_projection(s) for s in range(1, NUM_STAGES))
        return cls(space.block, config.widths, config.depths, config.kernels, middles, space.strides,
                   projections, space.in_channels, space.num_classes)

    @classmethod
    def supernet(cls, space: BigNASSpace) -> Shape:
        """The largest shapes: every stage at its widest width, depth, kernel and middle."""
        middles = (0,) + tuple(max(make_divisible(w * e) for w in space.widths[s] for e in space.expand_ratios[s])
                               for s in range(1, NUM_STAGES))
        return dataclasses.replace(cls.of(space, space.largest()), middles=middles)


class BigNASResNet(nnx.Module):
    """A BigNAS ResNet of the given :class:`Shape` (RobustART's ``BigNAS_ResNet_*``)."""

    def __init__(self, shape: Shape, *, rngs: nnx.Rngs):
        self.shape = shape
        make_block = BasicBlock if shape.block == "basic" else BottleneckBlock
        self.first_conv = ConvBN(shape.in_channels, shape.widths[0], shape.kernels[0], shape.strides[0], rngs=rngs)
        blocks, cin = [], shape.widths[0]
        for stage in range(1, NUM_STAGES):
            for i in range(shape.depths[stage]):
                blocks.append(make_block(cin, shape.widths[stage], shape.middles[stage], shape.kernels[stage],
                                         shape.strides[stage] if i == 0 else 1,
                                         i == 0 and shape.projections[stage], rngs=rngs))
                cin = shape.widths[stage]
        self.blocks = nnx.List(blocks)
        self.classifier = nnx.Linear(shape.widths[-1], shape.num_classes, rngs=rngs)

    def __call__(self, x: jax.Array, choice: SubnetChoice | PackedSubnets | None = None) -> jax.Array:
        """Logits; with ``choice``, those of that subnet (this module being the supernet),
        masked, or packed with the other networks of its population (:mod:`~robustjax.nas.bignas_packed`)."""
        if isinstance(choice, PackedSubnets):
            return self._packed(x, choice)
        shape = self.shape
        kernel = None if choice is None else choice.kernels[0]
        x = nnx.relu(self.first_conv(x, kernel))
        if choice is not None:
            x = x * _channel_mask(choice.widths[0], shape.widths[0])
        index = 0
        for stage in range(1, NUM_STAGES):
            masks = None if choice is None else Masks(
                choice.kernels[stage], _channel_mask(choice.middles[stage], shape.middles[stage]),
                _channel_mask(choice.widths[stage], shape.widths[stage]))
            for i in range(shape.depths[stage]):
                y = self.blocks[index](x, masks)
                x = y if choice is None or i == 0 else jnp.where(i < choice.depths[stage], y, x)
                index += 1
        return self.classifier(global_average_pool(x))

    def _packed(self, x: jax.Array, choice: PackedSubnets) -> jax.Array:
        """Each block at its network's own shape, the networks of one shape together."""
        shape, signature = self.shape, choice.signature

        def position(index: int, make_branch) -> tuple[list, tuple[int, ...]]:
            keys, counts = zip(*signature[index])
            return [make_branch(key) for key in keys], counts

        branches, counts = position(0, lambda key: stem_branch(key, shape.strides[0], shape.widths[0]))
        first = self.first_conv
        x = run_packed(branches, counts, x, choice.groups[0], {"conv": (first.conv, first.bn)})
        index = 0
        for stage in range(1, NUM_STAGES):
            for i in range(shape.depths[stage]):
                projection = i == 0 and shape.projections[stage]
                branches, counts = position(index + 1, lambda key: block_branch(
                    shape.block, key, shape.strides[stage] if i == 0 else 1, projection, shape.widths[stage]))
                x = run_packed(branches, counts, x, choice.groups[index + 1], block_layers(self.blocks[index]))
                index += 1
        return self.classifier(global_average_pool(x))  # zero beyond each network's width, as masked


def slice_weights(supernet: dict, shape: Shape, subnet: Shape) -> dict:
    """The weights of ``subnet`` cut from the supernet's (pure dicts, ``nnx.to_pure_dict``
    layout): leading channels, centred kernels, and each stage's first blocks."""
    def take(layer: dict, cin: int | None, cout: int, kernel: int | None = None) -> dict:
        out = {}
        for name, value in layer.items():
            value = np.asarray(value)
            if name == "kernel" and value.ndim == 4:
                trim = (value.shape[0] - kernel) // 2
                out[name] = value[trim:value.shape[0] - trim, trim:value.shape[1] - trim, :cin, :cout]
            elif name == "kernel":  # linear (in, out)
                out[name] = value[:cin, :cout]
            else:
                out[name] = value[:cout]
        return out

    def conv_bn(layer: dict, cin: int, cout: int, kernel: int) -> dict:
        return {"conv": take(layer["conv"], cin, cout, kernel), "bn": take(layer["bn"], None, cout)}

    result = {"first_conv": conv_bn(supernet["first_conv"], subnet.in_channels, subnet.widths[0], subnet.kernels[0])}
    blocks, cin = {}, subnet.widths[0]
    for stage in range(1, NUM_STAGES):
        first = sum(shape.depths[1:stage])
        cout, mid, k = subnet.widths[stage], subnet.middles[stage], subnet.kernels[stage]
        for i in range(subnet.depths[stage]):
            source = supernet["blocks"][first + i]
            if subnet.block == "basic":
                block = {"normal_conv1": conv_bn(source["normal_conv1"], cin, mid, k),
                         "normal_conv2": conv_bn(source["normal_conv2"], mid, cout, k)}
                if source.get("shortcut") is not None:
                    block["shortcut"] = conv_bn(source["shortcut"], cin, cout, 1)
            else:
                block = {"point_conv1": conv_bn(source["point_conv1"], cin, mid, 1),
                         "normal_conv": conv_bn(source["normal_conv"], mid, mid, k),
                         "point_conv2": conv_bn(source["point_conv2"], mid, cout, 1)}
                if source.get("shortcut") is not None:
                    block["shortcut"] = take(source["shortcut"], cin, cout, 1)
                    block["shortcutbn"] = take(source["shortcutbn"], None, cout)
            blocks[len(blocks)] = block
            cin = cout
    result["blocks"] = blocks
    result["classifier"] = take(supernet["classifier"], cin, subnet.num_classes)
    return result
