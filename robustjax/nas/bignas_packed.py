"""BigNAS subnets packed by block shape (:mod:`~robustjax.nas.packing`): at each block of the
supernet, the networks whose block has the same shape (input and output widths, middle
channels, kernel, or skipped for a shallower stage) send their examples through that
block's sliced weights together, at exactly that shape.

Masked (:mod:`~robustjax.nas.bignas_net`), every subnet computes at the supernet's largest
shapes. Packed, each example meets its own network's block at its own shape, as in the
standalone subnet: activations are kept at the supernet's widths, zero beyond each
network's own (as masks keep them), so the blocks compose, but the convolutions run only on
a network's own channels, taps and blocks. :class:`PackedSubnets` carries each network's
block keys and, as static data, how many networks take each key at each block (the
*signature*: one compiled program per signature).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from robustjax.nas.bignas import NUM_STAGES, BigNASConfig, BigNASSpace
from robustjax.nas.packing import PackedChoices, packed_op
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.resnet_layers import BATCH_NORM_EPSILON

Key = tuple[int, int, int, int, int]  # a block's (active, input width, middle channels, output width, kernel)
Signature = tuple[tuple[tuple[Key, int], ...], ...]  # per position (stem, then each block): (key, networks), sorted
SKIPPED: Key = (0, 0, 0, 0, 0)


def block_keys(space: BigNASSpace, config: BigNASConfig) -> np.ndarray:
    """(positions, 5): the :data:`Key` of ``config``'s stem, then of each block of the
    supernet (blocks beyond the subnet's depth in a stage are :data:`SKIPPED`)."""
    widths, kernels = config.widths, config.kernels
    keys = [(1, space.in_channels, 0, widths[0], kernels[0])]
    for stage in range(1, NUM_STAGES):
        for i in range(max(space.depths[stage])):
            cin = widths[stage - 1] if i == 0 else widths[stage]
            active = (1, cin, config.middle_channels(stage), widths[stage], kernels[stage])
            keys.append(active if i < config.depths[stage] else SKIPPED)
    return np.asarray(keys, np.int32)


@jax.tree_util.register_pytree_node_class
class PackedSubnets(PackedChoices):
    """Block keys (N, positions, 5) of a population's subnets, each network's group at each
    position (the rank of its key there), and the static :data:`Signature`. Make one with
    :meth:`of` and take networks with :meth:`select`: the batching rule trusts the signature."""

    def __init__(self, keys, groups, signature: Signature):
        self.keys, self.groups, self.signature = keys, groups, signature

    @classmethod
    def of(cls, keys: np.ndarray) -> PackedSubnets:
        keys = np.asarray(keys, np.int32)
        if keys.ndim != 3 or keys.shape[-1] != len(SKIPPED):
            raise ValueError(f"packed block keys must be (networks, positions, {len(SKIPPED)}), got {keys.shape}")
        groups = np.empty(keys.shape[:2], np.int32)
        signature = []
        for position in range(keys.shape[1]):
            distinct, inverse, counts = np.unique(keys[:, position], axis=0, return_inverse=True, return_counts=True)
            groups[:, position] = inverse.ravel()
            signature.append(tuple((tuple(int(v) for v in key), int(n)) for key, n in zip(distinct, counts)))
        return cls(keys, groups, tuple(signature))

    def select(self, members: Sequence[int] | np.ndarray) -> PackedSubnets:
        """The choice of networks ``members`` (repeats allowed), with their own signature."""
        return PackedSubnets.of(np.asarray(self.keys)[np.asarray(members)])

    def tree_flatten(self):
        return (self.keys, self.groups), self.signature

    @classmethod
    def tree_unflatten(cls, signature, leaves):
        return cls(*leaves, signature)

    def __repr__(self) -> str:
        groups = [len(position) for position in self.signature]
        return f"PackedSubnets(networks={sum(n for _, n in self.signature[0])}, groups per position={groups})"


def packing_order(space: BigNASSpace, configs: Sequence[BigNASConfig]) -> list[BigNASConfig]:
    """``configs`` sorted by their block keys, stem first: consecutive subnets share their
    early blocks' shapes, so a population's blocks form few, large groups. (Subnets of
    different shapes give different signatures: a packed BigNAS population compiles its own
    program unless one of the same signature ran before.)"""
    return sorted(configs, key=lambda config: tuple(block_keys(space, config).ravel()))


def _pad(x: jax.Array, width: int) -> jax.Array:
    """``x`` padded with zero channels to ``width``."""
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


def _conv_bn(x: jax.Array, conv: tuple, norm: tuple, cin: int, cout: int, kernel: int, stride: int) -> jax.Array:
    """The supernet's convolution (with bias) cut to ``cin`` -> ``cout`` channels and its
    centred ``kernel`` window, then batch norm with each network's statistics, on ``x``
    (networks, examples, H, W, C >= cin); ``norm`` = (scale, bias, mean, var), each
    (networks, C)."""
    weights, bias = conv
    trim = (weights.shape[0] - kernel) // 2
    weights = weights[trim:weights.shape[0] - trim, trim:weights.shape[1] - trim, :cin, :cout]
    pad = kernel // 2
    y = conv_general_dilated(x[..., :cin].reshape(-1, *x.shape[2:4], cin), weights, (stride, stride),
                             ((pad, pad), (pad, pad)), dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias[:cout]
    y = y.reshape(*x.shape[:2], *y.shape[1:])
    scale, shift, mean, var = (v[:, None, None, None, :cout] for v in norm)
    return (y - mean) * (jax.lax.rsqrt(var + BATCH_NORM_EPSILON) * scale) + shift


@functools.cache
def stem_branch(key: Key, stride: int, width: int):
    """The stem at ``key``'s shape: convolution, batch norm, ReLU, padded to ``width``."""
    _, cin, _, cout, kernel = key
    return lambda shared, own, x: _pad(jax.nn.relu(_conv_bn(x, shared["conv"], own["conv"], cin, cout, kernel,
                                                            stride)), width)


@functools.cache
def block_branch(block: str, key: Key, stride: int, projection: bool, width: int):
    """A basic or bottleneck block at ``key``'s shape (the identity when skipped), padded to
    ``width``; its layers are named as in :func:`block_layers`."""
    active, cin, mid, cout, kernel = key

    def run(shared, own, x):
        if not active:
            return x

        def layer(name, h, cin, cout, kernel, stride=1):
            return _conv_bn(h, shared[name], own[name], cin, cout, kernel, stride)

        if block == "basic":
            h = layer("conv2", jax.nn.relu(layer("conv1", x, cin, mid, kernel, stride)), mid, cout, kernel)
        else:
            h = jax.nn.relu(layer("reduce", x, cin, mid, 1))
            h = layer("expand", jax.nn.relu(layer("conv", h, mid, mid, kernel, stride)), mid, cout, 1)
        shortcut = layer("shortcut", x, cin, cout, 1, stride) if projection else x[..., :cout]
        return _pad(jax.nn.relu(h + shortcut), width)

    return run


def block_layers(block: Any) -> dict[str, tuple[Any, Any]]:
    """A supernet block's (convolution, batch norm) pairs by the names its branch uses."""
    if hasattr(block, "normal_conv1"):
        layers = {"conv1": block.normal_conv1, "conv2": block.normal_conv2, "shortcut": block.shortcut}
        return {name: (layer.conv, layer.bn) for name, layer in layers.items() if layer is not None}
    layers = {"reduce": block.point_conv1, "conv": block.normal_conv, "expand": block.point_conv2}
    pairs = {name: (layer.conv, layer.bn) for name, layer in layers.items()}
    return pairs if block.shortcut is None else {**pairs, "shortcut": (block.shortcut, block.shortcutbn)}


def run_packed(branches: list, counts: tuple[int, ...], x: jax.Array, group: jax.Array,
               layers: dict[str, tuple[Any, Any]]) -> jax.Array:
    """One position of a packed population: ``layers``' weights shared, their batch norms'
    statistics per network (``packing.packed_op``)."""
    shared = {name: (conv.kernel[...], conv.bias[...]) for name, (conv, _) in layers.items()}
    own = {name: (bn.scale[...], bn.bias[...], bn.mean[...], bn.var[...]) for name, (_, bn) in layers.items()}
    return packed_op(tuple(branches), counts)(x, group, shared, own)
