"""Wide ResNets for 32x32 CIFAR images (Zagoruyko and Komodakis, "Wide Residual Networks",
2016) in the two layouts of the RobustBench leaderboard.

* :class:`WideResNet`, RobustBench's ``architectures/wide_resnet.py`` (from TRADES):
  ``conv1``, groups ``block1..3`` of pre-activation blocks (``bn1 relu1 conv1 bn2 relu2
  conv2`` and a 1x1 ``convShortcut`` where the width changes), final ``bn1``, ReLU, global
  average pooling and ``fc``. No normalisation inside: most of its checkpoints
  (Carmon2019Unlabeled, Zhang2019Theoretically, Wang2020Improving, ...) take [0, 1] images,
  so ``wrn_28_10`` and ``wrn_34_10`` default to mean 0, std 1; builders accept ``mean``/``std``
  for the others. Checkpoints of ``WideResNet(sub_block1=True)`` carry a ``sub_block1`` group
  that the forward pass never uses; the converter reads and drops it.
* :class:`DMWideResNet`, RobustBench's ``architectures/dm_wide_resnet.py`` (Gowal et al.,
  "Uncovering the Limits of Adversarial Training against Norm-Bounded Adversarial Examples",
  2020): ``init_conv``, ``layer.{g}.block.{i}`` blocks (``batchnorm_0 conv_0 batchnorm_1
  conv_1`` and a 1x1 ``shortcut``), ``batchnorm``, ``logits``, with the input ``mean``/``std``
  stored in the state dict and applied inside the network. A block's strided convolution
  pads like TensorFlow's ``SAME`` (bottom/right only), as the original. Its leaderboard
  checkpoints (Gowal2020Uncovering, Rebuffi2021Fixing, Gowal2021Improving, Wang2023Better,
  ...) use Swish (= SiLU), the default of ``wrn_70_16`` and ``dm_wrn_28_10``; ``activation=
  "relu"`` builds the ReLU variant.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import (
    batch_norm,
    conv,
    count_blocks,
    global_average_pool,
    has_module,
    take_normalization,
)

INPUT_SHAPE = (32, 32, 3)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2471, 0.2435, 0.2616)
ACTIVATIONS = {"relu": nnx.relu, "swish": nnx.swish}


def group_widths(depth: int, width: int) -> tuple[int, tuple[int, ...]]:
    """Blocks per group ``(depth - 4) / 6`` and the channels (16, 16k, 32k, 64k) of WRN-depth-k."""
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"Wide ResNet depth must be 6n + 4 with n >= 1, got {depth}")
    if width < 1:
        raise ValueError(f"Wide ResNet width must be a positive int, got {width}")
    return (depth - 4) // 6, (16, 16 * width, 32 * width, 64 * width)


def _check_block_shape(in_features: int, out_features: int, stride: int) -> None:
    if in_features == out_features and stride != 1:  # the PyTorch originals fail on this too
        raise ValueError("a block with an identity shortcut must have stride 1")


class BasicBlock(nnx.Module):
    """``a = relu(bn1(x))``; ``conv2(relu(bn2(conv1(a)))) + (x or convShortcut(a))``."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        _check_block_shape(in_features, out_features, stride)
        self.bn1 = batch_norm(in_features, rngs)
        self.conv1 = conv(in_features, out_features, 3, stride=stride, rngs=rngs)
        self.bn2 = batch_norm(out_features, rngs)
        self.conv2 = conv(out_features, out_features, 3, rngs=rngs)
        changes_width = in_features != out_features
        self.convShortcut = conv(in_features, out_features, 1, stride=stride, rngs=rngs) if changes_width else None

    def __call__(self, x: jax.Array) -> jax.Array:
        activated = nnx.relu(self.bn1(x))
        out = self.conv2(nnx.relu(self.bn2(self.conv1(activated))))
        return (x if self.convShortcut is None else self.convShortcut(activated)) + out


class NetworkBlock(nnx.Module):
    """A group of ``blocks`` BasicBlocks, the first with ``stride``, held in ``layer``."""

    def __init__(self, blocks: int, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        self.layer = nnx.List([BasicBlock(in_features if i == 0 else out_features, out_features,
                                          stride if i == 0 else 1, rngs=rngs) for i in range(blocks)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.layer:
            x = block(x)
        return x


class WideResNet(nnx.Module):
    """WRN-depth-width: conv3x3(16), three groups (strides 1, 2, 2), BN-ReLU, pool, ``fc``."""

    def __init__(self, depth: int = 28, widen_factor: int = 10, num_classes: int = 10, *, rngs: nnx.Rngs):
        blocks, widths = group_widths(depth, widen_factor)
        self.conv1 = conv(3, widths[0], 3, rngs=rngs)
        self.block1 = NetworkBlock(blocks, widths[0], widths[1], 1, rngs=rngs)
        self.block2 = NetworkBlock(blocks, widths[1], widths[2], 2, rngs=rngs)
        self.block3 = NetworkBlock(blocks, widths[2], widths[3], 2, rngs=rngs)
        self.bn1 = batch_norm(widths[3], rngs)
        self.fc = nnx.Linear(widths[3], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.block3(self.block2(self.block1(self.conv1(x))))
        return self.fc(global_average_pool(nnx.relu(self.bn1(x))))


class Buffer(nnx.Variable):
    """A constant stored with the weights, like a PyTorch ``register_buffer`` tensor."""


class DMBlock(nnx.Module):
    """``a = act(batchnorm_0(x))``; ``conv_1(act(batchnorm_1(conv_0(a)))) + (x or shortcut(a))``,
    with ``conv_0`` padded (1, 1) at stride 1 and (0, 1) (bottom/right) at stride 2."""

    def __init__(self, in_features: int, out_features: int, stride: int, activation: str, *, rngs: nnx.Rngs):
        _check_block_shape(in_features, out_features, stride)
        if stride not in (1, 2):
            raise ValueError(f"DMWideResNet blocks support stride 1 or 2, got {stride}")
        self.activation = activation
        self.batchnorm_0 = batch_norm(in_features, rngs)
        pad = (1, 1) if stride == 1 else (0, 1)
        self.conv_0 = conv(in_features, out_features, 3, stride=stride, padding=(pad, pad), rngs=rngs)
        self.batchnorm_1 = batch_norm(out_features, rngs)
        self.conv_1 = conv(out_features, out_features, 3, rngs=rngs)
        changes_width = in_features != out_features
        self.shortcut = (conv(in_features, out_features, 1, stride=stride, padding=0, rngs=rngs)
                         if changes_width else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        activated = act(self.batchnorm_0(x))
        out = self.conv_1(act(self.batchnorm_1(self.conv_0(activated))))
        return (x if self.shortcut is None else self.shortcut(activated)) + out


class DMBlockGroup(nnx.Module):
    """A group of ``blocks`` DMBlocks, the first with ``stride``, held in ``block``."""

    def __init__(self, blocks: int, in_features: int, out_features: int, stride: int, activation: str, *,
                 rngs: nnx.Rngs):
        self.block = nnx.List([DMBlock(in_features if i == 0 else out_features, out_features,
                                       stride if i == 0 else 1, activation, rngs=rngs) for i in range(blocks)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.block:
            x = block(x)
        return x


class DMWideResNet(nnx.Module):
    """``(x - mean) / std``, conv3x3(16), three block groups (strides 1, 2, 2), BN-act, pool,
    ``logits``."""

    def __init__(self, depth: int = 70, width: int = 16, num_classes: int = 10, activation: str = "swish",
                 mean: tuple[float, ...] = CIFAR10_MEAN, std: tuple[float, ...] = CIFAR10_STD, *, rngs: nnx.Rngs):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        blocks, widths = group_widths(depth, width)
        self.activation = activation
        self.mean = Buffer(jnp.broadcast_to(jnp.asarray(mean, jnp.float32), (3,)))
        self.std = Buffer(jnp.broadcast_to(jnp.asarray(std, jnp.float32), (3,)))
        self.init_conv = conv(3, widths[0], 3, rngs=rngs)
        self.layer = nnx.List([DMBlockGroup(blocks, widths[g], widths[g + 1], 1 if g == 0 else 2, activation,
                                            rngs=rngs) for g in range(3)])
        self.batchnorm = batch_norm(widths[3], rngs)
        self.logits = nnx.Linear(widths[3], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.init_conv((x - self.mean[...]) / self.std[...])
        for group in self.layer:
            x = group(x)
        x = ACTIVATIONS[self.activation](self.batchnorm(x))
        return self.logits(global_average_pool(x))


def convert_wide_resnet(weights: TorchWeights, *, mean=(0.0,), std=(1.0,)) -> dict:
    """A RobustBench ``WideResNet`` state dict in :class:`WideResNet`'s layout (an unused
    ``sub_block1`` group is read and dropped)."""
    take_normalization(weights, mean, std)
    for name in [k for k in weights.tensors if k.startswith("sub_block1.")]:
        weights.take(name)

    def block(prefix: str) -> dict:
        out = {name: weights.conv(f"{prefix}.{name}") for name in ("conv1", "conv2")}
        out |= {name: weights.batch_norm(f"{prefix}.{name}") for name in ("bn1", "bn2")}
        if has_module(weights, f"{prefix}.convShortcut"):
            out["convShortcut"] = weights.conv(f"{prefix}.convShortcut")
        return out

    out = {"conv1": weights.conv("conv1"), "bn1": weights.batch_norm("bn1"), "fc": weights.linear("fc")}
    for group in range(1, 4):
        prefix = f"block{group}.layer"
        out[f"block{group}"] = {"layer": {i: block(f"{prefix}.{i}")
                                          for i in range(count_blocks(weights, prefix, "conv1.weight"))}}
    return out


def convert_dm_wide_resnet(weights: TorchWeights) -> dict:
    """A RobustBench / DeepMind ``DMWideResNet`` state dict (``mean`` and ``std`` included) in
    :class:`DMWideResNet`'s layout."""

    def block(prefix: str) -> dict:
        out = {name: weights.conv(f"{prefix}.{name}") for name in ("conv_0", "conv_1")}
        out |= {name: weights.batch_norm(f"{prefix}.{name}") for name in ("batchnorm_0", "batchnorm_1")}
        if has_module(weights, f"{prefix}.shortcut"):
            out["shortcut"] = weights.conv(f"{prefix}.shortcut")
        return out

    groups = {}
    for group in range(3):
        prefix = f"layer.{group}.block"
        groups[group] = {"block": {i: block(f"{prefix}.{i}")
                                   for i in range(count_blocks(weights, prefix, "conv_0.weight"))}}
    return {"mean": weights.take("mean").reshape(-1), "std": weights.take("std").reshape(-1),
            "init_conv": weights.conv("init_conv"), "layer": groups,
            "batchnorm": weights.batch_norm("batchnorm"), "logits": weights.linear("logits")}


def _register_wide_resnet(depth: int, widen_factor: int) -> None:
    name = f"wrn_{depth}_{widen_factor}"

    def build(*, key: jax.Array, num_classes: int = 10, depth: int = depth,
              widen_factor: int = widen_factor, mean: tuple[float, ...] = (0.0,),
              std: tuple[float, ...] = (1.0,)) -> Classifier:
        module = WideResNet(depth, widen_factor, num_classes, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE, mean=mean, std=std,
                                   name=name)

    build.__doc__ = (f"WRN-{depth}-{widen_factor} in RobustBench's WideResNet layout, [0, 1] inputs "
                     "(mean 0, std 1) by default; ``depth``/``widen_factor`` build other sizes.")
    register_model(name, family="wide_resnet", weights=None, convert=convert_wide_resnet,
                   torch_source="robustbench.model_zoo.architectures.wide_resnet.WideResNet")(build)


def _register_dm_wide_resnet(name: str, depth: int, width: int) -> None:
    def build(*, key: jax.Array, num_classes: int = 10, depth: int = depth,
              width: int = width, activation: str = "swish", mean: tuple[float, ...] = CIFAR10_MEAN,
              std: tuple[float, ...] = CIFAR10_STD) -> Classifier:
        module = DMWideResNet(depth, width, num_classes, activation, mean, std, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE, name=name)

    build.__doc__ = (f"WRN-{depth}-{width} in RobustBench's DMWideResNet layout with Swish (``activation=\"relu\"`` "
                     "for ReLU); normalises inside with its stored mean/std (CIFAR-10 until converted).")
    register_model(name, family="wide_resnet", weights=None, convert=convert_dm_wide_resnet,
                   torch_source="robustbench.model_zoo.architectures.dm_wide_resnet.DMWideResNet")(build)


_register_wide_resnet(28, 10)
_register_wide_resnet(34, 10)
_register_dm_wide_resnet("wrn_70_16", 70, 16)
_register_dm_wide_resnet("dm_wrn_28_10", 28, 10)
