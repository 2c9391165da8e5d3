"""RegNetX (Radosavovic et al., "Designing Network Design Spaces", CVPR 2020) at 400MF,
800MF, 1.6GF, 3.2GF and 6.4GF, as ``timm.models.regnet`` (``regnetx_004`` ...
``regnetx_064``), which matches pycls and RobustART's parameter counts (torchvision's
``regnet_x_*`` round group widths differently and differ in size).

Block widths follow the paper's quantised linear rule: ``u_j = w0 + wa * j`` for block
``j < depth``, snapped to ``w0 * wm ** round(log(u_j / w0) / log(wm))`` and to a multiple
of 8; equal widths form a stage. Every block is an X block: 1x1 conv - 3x3 group conv
(groups of ``group_size`` channels, stride 2 in a stage's first block) - 1x1 conv, each
with BatchNorm, ReLU after the first two and after the residual sum. Names follow timm
(``s1.b1.conv2.conv``)."""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
from flax import nnx

from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import batch_norm, conv, global_average_pool

INPUT_SHAPE = (224, 224, 3)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
WIDTH_QUANTUM = 8


@dataclasses.dataclass(frozen=True)
class RegNetConfig:
    """The RegNet design-space parameters (the paper's d, w0, wa, wm, g)."""

    depth: int
    w0: int
    wa: float
    wm: float
    group_size: int
    stem_width: int = 32


# RobustART name: (timm name, config); the pycls RegNetX models of the paper's Table.
CONFIGS = {
    "regnetx_400m": ("regnetx_004", RegNetConfig(depth=22, w0=24, wa=24.48, wm=2.54, group_size=16)),
    "regnetx_800m": ("regnetx_008", RegNetConfig(depth=16, w0=56, wa=35.73, wm=2.28, group_size=16)),
    "regnetx_1600m": ("regnetx_016", RegNetConfig(depth=18, w0=80, wa=34.01, wm=2.25, group_size=24)),
    "regnetx_3200m": ("regnetx_032", RegNetConfig(depth=25, w0=88, wa=26.31, wm=2.25, group_size=48)),
    "regnetx_6400m": ("regnetx_064", RegNetConfig(depth=17, w0=184, wa=60.83, wm=2.07, group_size=56)),
}


def stage_plan(config: RegNetConfig) -> list[tuple[int, int, int]]:
    """``(width, depth, group_size)`` per stage from the quantised linear width rule.

    Computed in float32 like pycls and timm, so that rounding ties break the same way.
    """
    w0, wa, wm = np.float32(config.w0), np.float32(config.wa), np.float32(config.wm)
    continuous = np.arange(config.depth, dtype=np.float32) * wa + w0
    exponents = np.round(np.log(continuous / w0) / np.float32(np.log(config.wm)))
    widths = np.round(w0 * np.power(wm, exponents) / WIDTH_QUANTUM) * WIDTH_QUANTUM
    stage_widths, stage_depths = np.unique(widths.astype(int), return_counts=True)
    plan = []
    for width, depth in zip(stage_widths.tolist(), stage_depths.tolist()):
        group_size = min(config.group_size, width)
        width = int(round(width / group_size) * group_size)  # a whole number of groups
        plan.append((width, depth, group_size))
    return plan


class ConvNormAct(nnx.Module):
    """timm's ``ConvNormAct``: bias-free convolution, BatchNorm, optional ReLU."""

    def __init__(self, in_features: int, out_features: int, kernel: int, *, stride: int = 1,
                 groups: int = 1, act: bool = True, rngs: nnx.Rngs):
        self.conv = conv(in_features, out_features, kernel, stride=stride, groups=groups, rngs=rngs)
        self.bn = batch_norm(out_features, rngs)
        self.act = act

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.bn(self.conv(x))
        return nnx.relu(x) if self.act else x


class Bottleneck(nnx.Module):
    """The X block: ``relu(conv3(conv2(conv1(x))) + downsample(x))`` (bottleneck ratio 1)."""

    def __init__(self, in_features: int, out_features: int, stride: int, group_size: int, *,
                 rngs: nnx.Rngs):
        self.conv1 = ConvNormAct(in_features, out_features, 1, rngs=rngs)
        self.conv2 = ConvNormAct(out_features, out_features, 3, stride=stride,
                                 groups=out_features // group_size, rngs=rngs)
        self.conv3 = ConvNormAct(out_features, out_features, 1, act=False, rngs=rngs)
        changes_shape = stride != 1 or in_features != out_features
        self.downsample = (
            ConvNormAct(in_features, out_features, 1, stride=stride, act=False, rngs=rngs)
            if changes_shape else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        shortcut = x if self.downsample is None else self.downsample(x)
        return nnx.relu(self.conv3(self.conv2(self.conv1(x))) + shortcut)


class RegStage(nnx.Module):
    """Blocks ``b1 .. bN`` of one width; ``b1`` has stride 2."""

    def __init__(self, in_features: int, width: int, depth: int, group_size: int, *, rngs: nnx.Rngs):
        self.depth = depth
        for index in range(depth):
            block = Bottleneck(in_features if index == 0 else width, width, 2 if index == 0 else 1,
                               group_size, rngs=rngs)
            setattr(self, f"b{index + 1}", block)

    def __call__(self, x: jax.Array) -> jax.Array:
        for index in range(1, self.depth + 1):
            x = getattr(self, f"b{index}")(x)
        return x


class ClassifierHead(nnx.Module):
    """Global average pooling and ``fc``."""

    def __init__(self, in_features: int, num_classes: int, *, rngs: nnx.Rngs):
        self.fc = nnx.Linear(in_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc(global_average_pool(x))


class RegNet(nnx.Module):
    """stem (3x3 conv, stride 2) - stages s1..sN - head."""

    def __init__(self, config: RegNetConfig, num_classes: int = 1000, *, rngs: nnx.Rngs):
        self.stem = ConvNormAct(3, config.stem_width, 3, stride=2, rngs=rngs)
        in_features = config.stem_width
        plan = stage_plan(config)
        for index, (width, depth, group_size) in enumerate(plan, start=1):
            setattr(self, f"s{index}", RegStage(in_features, width, depth, group_size, rngs=rngs))
            in_features = width
        self.num_stages = len(plan)
        self.head = ClassifierHead(in_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.stem(x)
        for index in range(1, self.num_stages + 1):
            x = getattr(self, f"s{index}")(x)
        return self.head(x)


def _conv_norm(weights: TorchWeights, prefix: str) -> dict:
    return {"conv": weights.conv(f"{prefix}.conv"), "bn": weights.batch_norm(f"{prefix}.bn")}


def convert_regnet(weights: TorchWeights) -> dict:
    """Parameters of :class:`RegNet` from a timm RegNet state dict (``regnetx_004`` ...)."""
    blocks_per_stage: dict[int, int] = {}
    for key in weights.tensors:
        match = re.match(r"s(\d+)\.b(\d+)\.", key)
        if match:
            stage, block = int(match[1]), int(match[2])
            blocks_per_stage[stage] = max(blocks_per_stage.get(stage, 0), block)
    params = {"stem": _conv_norm(weights, "stem"), "head": {"fc": weights.linear("head.fc")}}
    for stage in range(1, max(blocks_per_stage, default=0) + 1):
        blocks = {}
        for block in range(1, blocks_per_stage.get(stage, 0) + 1):
            prefix = f"s{stage}.b{block}"
            blocks[f"b{block}"] = {name: _conv_norm(weights, f"{prefix}.{name}")
                                   for name in ("conv1", "conv2", "conv3")}
            if block == 1:  # the stride-2 block, the only one with a projection shortcut
                blocks[f"b{block}"]["downsample"] = _conv_norm(weights, f"{prefix}.downsample")
        params[f"s{stage}"] = blocks
    return params


def _register(name: str, timm_name: str, config: RegNetConfig) -> None:
    def build(*, key: jax.Array, num_classes: int = 1000, **overrides) -> Classifier:
        fields = {field.name for field in dataclasses.fields(RegNetConfig)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise TypeError(f"unknown {name} arguments {unknown}; "
                            f"the design-space fields are {sorted(fields)}")
        cfg = dataclasses.replace(config, **overrides)
        for label in ("depth", "w0", "group_size", "stem_width"):
            check_positive_int(getattr(cfg, label), label)
        if cfg.w0 % WIDTH_QUANTUM:
            raise ValueError(f"w0 must be a multiple of {WIDTH_QUANTUM}, got {cfg.w0}")
        if not cfg.wa >= 0 or not cfg.wm > 1:
            raise ValueError(f"wa must be >= 0 and wm > 1, got wa={cfg.wa}, wm={cfg.wm}")
        module = RegNet(cfg, num_classes, rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE,
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    build.__doc__ = (f"RegNetX-{name.rsplit('_', 1)[1].upper()}F (d={config.depth}, w0={config.w0}, "
                     f"wa={config.wa}, wm={config.wm}, g={config.group_size}), as timm {timm_name}.")
    register_model(name, family="regnetx", weights=None, convert=convert_regnet,
                   torch_source=f"timm:{timm_name}")(build)


for _name, (_timm_name, _config) in CONFIGS.items():
    _register(_name, _timm_name, _config)
