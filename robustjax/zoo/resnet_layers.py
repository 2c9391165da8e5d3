"""Layers with PyTorch's semantics shared by the residual families (ResNet, ResNeXt,
Wide-ResNet, CIFAR ResNets): bias-free convolutions padded as ``nn.Conv2d(padding=p)``
and BatchNorm with ``nn.BatchNorm2d``'s defaults; and the state-dict helpers their
converters share."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.convert import TorchWeights

BATCH_NORM_EPSILON = 1e-5  # PyTorch's default


def batch_norm(features: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
    """BatchNorm with PyTorch's defaults (eps 1e-5, running-average momentum 0.1)."""
    return nnx.BatchNorm(features, momentum=0.9, epsilon=BATCH_NORM_EPSILON, rngs=rngs)


def conv(
    in_features: int,
    out_features: int,
    kernel: int,
    *,
    stride: int = 1,
    padding: int | tuple[tuple[int, int], tuple[int, int]] | None = None,
    groups: int = 1,
    rngs: nnx.Rngs,
) -> nnx.Conv:
    """Bias-free ``kernel x kernel`` convolution.

    ``padding`` is PyTorch's: an int pads every side by that much (default ``kernel // 2``);
    pairs give (top, bottom), (left, right). Flax's ``"SAME"`` would pad a stride-2
    convolution of an even input on the bottom/right only, which PyTorch does not.
    """
    pad = kernel // 2 if padding is None else padding
    if isinstance(pad, int):
        pad = ((pad, pad), (pad, pad))
    return nnx.Conv(in_features, out_features, (kernel, kernel), strides=stride, padding=pad,
                    feature_group_count=groups, use_bias=False, rngs=rngs,
                    conv_general_dilated=conv_general_dilated)


class ConvBN(nnx.Module):
    """A bias-free convolution followed by BatchNorm: the projection shortcut
    (``nn.Sequential(conv1x1, BatchNorm2d)``, PyTorch names ``0`` and ``1``)."""

    def __init__(self, in_features: int, out_features: int, *, kernel: int = 1, stride: int = 1,
                 rngs: nnx.Rngs):
        self.conv = conv(in_features, out_features, kernel, stride=stride, rngs=rngs)
        self.bn = batch_norm(out_features, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(x))


def global_average_pool(x: jax.Array) -> jax.Array:
    """(B, H, W, C) -> (B, C): the mean over all positions."""
    return x.mean(axis=(1, 2))


def count_blocks(weights: TorchWeights, prefix: str, leaf: str) -> int:
    """How many blocks ``{prefix}.{i}`` a state dict holds, found by ``{prefix}.{i}.{leaf}``."""
    count = 0
    while f"{prefix}.{count}.{leaf}" in weights:
        count += 1
    return count


def has_module(weights: TorchWeights, prefix: str) -> bool:
    """Whether the state dict holds any tensor of the module ``prefix``, so that a module
    with some of its tensors missing is reported as missing those tensors."""
    return any(name.startswith(f"{prefix}.") for name in weights.tensors)


def take_normalization(weights: TorchWeights, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """Reads the ``mu``/``sigma`` buffers that RobustBench wrappers may store, and raises a
    ValueError if they differ from the registered model's normalisation (``mean``, ``std``),
    rather than converting to a classifier that normalises differently from its checkpoint."""
    for buffer, expected in (("mu", mean), ("sigma", std)):
        if buffer in weights:
            stored = np.asarray(weights.take(buffer), np.float64).reshape(-1)
            expected = np.broadcast_to(np.asarray(expected, np.float64), stored.shape)
            if not np.allclose(stored, expected, rtol=0, atol=1e-5):
                raise ValueError(
                    f"{weights.source} normalises inputs with {buffer}={stored.round(4).tolist()}, but the "
                    f"model expects mean={tuple(mean)}, std={tuple(std)}: drop the mu/sigma tensors, convert, "
                    "and set the checkpoint's statistics with classifier.replace(mean=..., std=...)")
