"""RobustART's BigNAS ResNet search spaces (arXiv 2109.05211 §NAS; BigNAS, Yu et al. 2020).

A network is a stem convolution and 4 stages of residual blocks (basic or bottleneck), each
stage stride 2 on ImageNet, then global average pooling and a linear head. Per stage the
space chooses the width (output channels), the depth (blocks), the kernel size and the
expand ratio (middle channels ``make_divisible(width * ratio, 8)``); per network, the input
resolution. Lists are RobustART's: 5 entries, the stem first (its depth is 1 and its expand
ratio unused, written 0).

RobustART never released its supernet's configuration; the choices here are the ranges that
its named subnets span (``../shared/reference/robustart.md`` §2.2), every named subnet
inside them. The space is the full product of the per-stage choices (no ordering between
stages), so ids are a mixed-radix number.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

import jax

from robustjax.nas.space import (
    CIFAR_MEAN,
    CIFAR_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Cost,
    check_index,
    register_space,
    sample_indices,
)

Block = Literal["basic", "bottleneck"]
NUM_STAGES = 5  # the stem and 4 block stages


def make_divisible(value: float, divisor: int = 8) -> int:
    """The nearest multiple of ``divisor`` (at least ``divisor``), not more than 10% below
    ``value``: the rounding MobileNet, BigNAS and RobustART use for channel counts."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


@dataclasses.dataclass(frozen=True)
class BigNASConfig:
    """One subnet, in RobustART's layout: per-stage lists of 5 (stem first) and a resolution."""

    block: Block
    resolution: int
    widths: tuple[int, ...]
    depths: tuple[int, ...]
    kernels: tuple[int, ...]
    expand_ratios: tuple[float, ...]

    def __post_init__(self):
        for field in ("widths", "depths", "kernels", "expand_ratios"):
            value = tuple(getattr(self, field))
            if len(value) != NUM_STAGES:
                raise ValueError(f"{field} needs {NUM_STAGES} stage values (stem first), got {value}")
            object.__setattr__(self, field, value)
        object.__setattr__(self, "expand_ratios", tuple(float(r) for r in self.expand_ratios))

    @property
    def arch_id(self) -> str:
        def join(values):
            return "_".join(f"{v:g}" for v in values)

        return (f"bignas-{self.block}:r{self.resolution}-w{join(self.widths)}-d{join(self.depths)}"
                f"-k{join(self.kernels)}-e{join(self.expand_ratios)}")

    @classmethod
    def from_arch_id(cls, arch_id: str) -> BigNASConfig:
        """Parses :attr:`arch_id` (``bignas-basic:r224-w8_8_24_32_112-d1_1_1_2_1-k...-e...``)."""
        try:
            prefix, _, body = arch_id.partition(":")
            block = prefix.removeprefix("bignas-")
            parts = {part[0]: part[1:] for part in body.split("-")}
            lists = [tuple(float(v) for v in parts[key].split("_")) for key in "wdke"]
            return cls(block, int(parts["r"]), *(tuple(int(v) for v in values) for values in lists[:3]), lists[3])
        except (KeyError, ValueError, IndexError):
            raise ValueError(f"not a BigNAS arch id (bignas-BLOCK:rRES-wW_W_W_W_W-dD_..-kK_..-eE_..): {arch_id!r}") from None

    def middle_channels(self, stage: int) -> int:
        """Middle channels of the blocks of ``stage`` (1..4)."""
        return make_divisible(self.widths[stage] * self.expand_ratios[stage])


def stage_values(values: tuple, depths: tuple[int, ...]) -> tuple:
    """RobustART's per-stage value of a stage-wise (5) or block-wise (sum of depths) list.

    ``BigNAS_ResNet_Basic`` expands the list to one value per block and gives every block of
    a stage the value of the stage's last block.
    """
    if len(values) == len(depths):
        return tuple(values)
    if len(values) != sum(depths):
        raise ValueError(f"need {len(depths)} stage-wise or {sum(depths)} block-wise values, got {len(values)}")
    last_block = [sum(depths[: stage + 1]) - 1 for stage in range(len(depths))]
    return tuple(values[i] for i in last_block)


def _named(block: Block, resolution, widths, depths, kernels, expands) -> BigNASConfig:
    return BigNASConfig(block, resolution, widths, depths, stage_values(kernels, depths),
                        stage_values(expands, depths))


# RobustART's named subnets (prototype/model/bignas_resnet_{basicblock,bottleneck}.py), at the
# resolutions of SenseTime's model zoo; the names give the MACs at that resolution.
NAMED_SUBNETS: dict[str, BigNASConfig] = {
    "bignas_resnet18_9M": _named("basic", 128, (8, 8, 24, 32, 112), (1, 1, 1, 2, 1), (3,) * 5, (0, 1, 1, 1, 1)),
    "bignas_resnet18_37M": _named("basic", 188, (8, 8, 16, 48, 192), (1, 1, 1, 1, 2), (7, 3, 3, 3, 3, 3),
                                  (0, 1, 1, 0.5, 0.5, 0.5)),
    "bignas_resnet18_49M": _named("basic", 224, (8, 8, 24, 32, 224), (1, 1, 1, 2, 2), (7, 3, 3, 3, 3, 3, 3),
                                  (0, 1, 1, 1, 1, 0.25, 0.25)),
    "bignas_resnet18_50M": _named("basic", 192, (8, 8, 16, 48, 224), (1, 2, 2, 1, 2), (7, 3, 3, 3, 3, 3, 3, 3),
                                  (0, 1, 1, 1, 1, 0.5, 0.5, 0.5)),
    "bignas_resnet18_66M": _named("basic", 224, (8, 8, 16, 48, 192), (1, 1, 1, 1, 2), (7, 3, 3, 3, 3, 3),
                                  (0, 1, 1, 0.75, 0.75, 0.75)),
    "bignas_resnet18_107M": _named("basic", 224, (16, 16, 32, 48, 160), (1, 1, 1, 2, 3), (3,) * 5, (0, 1, 1, 1, 1)),
    "bignas_resnet18_125M": _named("basic", 224, (16, 16, 48, 64, 192), (1, 1, 1, 2, 2), (3,) * 5, (0, 1, 1, 1, 1)),
    "bignas_resnet18_150M": _named("basic", 224, (16, 16, 48, 64, 192), (1, 1, 1, 1, 3), (3,) * 5, (0, 1, 1, 1, 1)),
    "bignas_resnet18_312M": _named("basic", 224, (24, 24, 48, 112, 320), (1, 1, 1, 2, 2), (5, 3, 3, 3, 3),
                                   (0, 1, 1, 1, 1)),
    "bignas_resnet18_403M": _named("basic", 224, (16, 24, 48, 128, 320), (1, 1, 1, 2, 3), (3,) * 5, (0, 1, 1, 1, 1)),
    "bignas_resnet18_492M": _named("basic", 224, (32, 32, 64, 144, 320), (1, 1, 1, 2, 3), (3,) * 5, (0, 1, 1, 1, 1)),
    "bignas_resnet18_1555M": _named("basic", 224, (32, 64, 112, 256, 592), (1, 1, 1, 3, 2), (7, 3, 3, 3, 3),
                                    (0, 1, 1, 1, 1)),
    "bignas_resnet50_2954M": _named("bottleneck", 224, (48, 192, 448, 960, 2176), (1, 3, 3, 6, 2), (5, 3, 3, 3, 3),
                                    (0, 0.25, 0.25, 0.25, 0.25)),
    "bignas_resnet50_3145M": _named("bottleneck", 224, (48, 192, 416, 960, 2112), (1, 3, 4, 7, 2), (3,) * 5,
                                    (0, 0.25, 0.25, 0.25, 0.25)),
    "bignas_resnet50_3811M": _named("bottleneck", 224, (80, 240, 416, 896, 2496), (1, 2, 5, 7, 3), (5, 3, 3, 3, 3),
                                    (0, 0.25, 0.25, 0.25, 0.25)),
}


def _steps(start: int, stop: int, step: int) -> tuple[int, ...]:
    return tuple(range(start, stop + 1, step))


@dataclasses.dataclass(frozen=True)
class BigNASSpace:
    """A BigNAS ResNet space: the choices of each of the 5 stages, and of the resolution.

    ``input_size`` is the side of the images the networks take; a subnet of another
    resolution resizes them (bicubic) first, as BigNAS and RobustART do.
    """

    name: str
    block: Block
    widths: tuple[tuple[int, ...], ...]
    depths: tuple[tuple[int, ...], ...]
    kernels: tuple[tuple[int, ...], ...]
    expand_ratios: tuple[tuple[float, ...], ...]
    resolutions: tuple[int, ...]
    strides: tuple[int, ...] = (2, 2, 2, 2, 2)
    in_channels: int = 3
    num_classes: int = 1000
    input_size: int | None = None
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __post_init__(self):
        for field in ("widths", "depths", "kernels", "expand_ratios", "strides"):
            if len(getattr(self, field)) != NUM_STAGES:
                raise ValueError(f"{self.name}: {field} needs {NUM_STAGES} entries (stem first)")
        if self.depths[0] != (1,) or self.expand_ratios[0] != (0,):
            raise ValueError(f"{self.name}: the stem has depth (1,) and expand ratio (0,)")
        if any(k % 2 == 0 for ks in self.kernels for k in ks):
            raise ValueError(f"{self.name}: kernel sizes must be odd, got {self.kernels}")
        if self.input_size is None:
            object.__setattr__(self, "input_size", max(self.resolutions))

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.input_size, self.input_size, self.in_channels)

    def _axes(self) -> list[tuple]:
        """The choice lists, in the order of the mixed-radix id (resolution most significant)."""
        return [self.resolutions, *self.widths, *self.depths, *self.kernels, *self.expand_ratios]

    def __len__(self) -> int:
        return math.prod(len(axis) for axis in self._axes())

    def config(self, index: int) -> BigNASConfig:
        index = check_index(self, index)
        digits = []
        for axis in reversed(self._axes()):
            index, digit = divmod(index, len(axis))
            digits.append(axis[digit])
        values = digits[::-1]
        return BigNASConfig(self.block, values[0], *(tuple(values[1 + 5 * i: 6 + 5 * i]) for i in range(4)))

    def resolve(self, arch: Any) -> BigNASConfig:
        """A config of this space from a config, an id, an ``arch_id`` or a named subnet; a
        ValueError names each value that the space does not allow."""
        if isinstance(arch, str) and arch.startswith("bignas-"):
            arch = BigNASConfig.from_arch_id(arch)
        elif isinstance(arch, str):
            if arch not in NAMED_SUBNETS:
                raise ValueError(f"{self.name}: unknown subnet name {arch!r}; named subnets: "
                                 f"{', '.join(self.named_subnets()) or 'none in this space'}")
            arch = NAMED_SUBNETS[arch]
        if not isinstance(arch, BigNASConfig):
            return self.config(arch)
        self.check(arch)
        return arch

    def check(self, config: BigNASConfig) -> None:
        problems = []
        if config.block != self.block:
            problems.append(f"block {config.block!r} (the space has {self.block!r} blocks)")
        if config.resolution not in self.resolutions:
            problems.append(f"resolution {config.resolution} (allowed {_describe(self.resolutions)})")
        for field in ("widths", "depths", "kernels", "expand_ratios"):
            for stage, (value, allowed) in enumerate(zip(getattr(config, field), getattr(self, field))):
                if value not in allowed:
                    problems.append(f"{field}[{stage}] = {value:g} (allowed {_describe(allowed)})")
        if problems:
            raise ValueError(f"config outside {self.name}: " + "; ".join(problems))

    def index(self, arch: Any) -> int:
        config = self.resolve(arch)
        values = [config.resolution, *config.widths, *config.depths, *config.kernels, *config.expand_ratios]
        index = 0
        for axis, value in zip(self._axes(), values):
            index = index * len(axis) + axis.index(value)
        return index

    def named_subnets(self) -> list[str]:
        """RobustART's named subnets that lie in this space."""
        return [name for name, config in NAMED_SUBNETS.items() if self._contains(config)]

    def _contains(self, config: BigNASConfig) -> bool:
        try:
            self.check(config)
        except ValueError:
            return False
        return True

    def largest(self) -> BigNASConfig:
        """Every choice at its maximum: the supernet's full shape (sandwich rule's max)."""
        return BigNASConfig(self.block, max(self.resolutions), *(tuple(max(c) for c in choices) for choices in
                            (self.widths, self.depths, self.kernels, self.expand_ratios)))

    def smallest(self) -> BigNASConfig:
        return BigNASConfig(self.block, min(self.resolutions), *(tuple(min(c) for c in choices) for choices in
                            (self.widths, self.depths, self.kernels, self.expand_ratios)))

    def sample(self, key: jax.Array, n: int, *, flops_range: tuple[float, float] | None = None,
               unique: bool = True) -> list[BigNASConfig]:
        return [self.config(i) for i in sample_indices(self, key, n, flops_range=flops_range, unique=unique)]

    def has_projection(self, stage: int) -> bool:
        """Whether the first block of ``stage`` (1..4) has a 1x1 projection shortcut.

        RobustART's rule is "stride != 1 or the widths differ"; here the widths count as
        different when either stage has more than one width choice, so that every subnet has
        the supernet's structure. On RobustART's spaces every stage has stride 2, so every
        first block projects, as in RobustART's own networks.
        """
        return self.strides[stage] != 1 or len(set(self.widths[stage - 1]) | set(self.widths[stage])) > 1

    def cost(self, arch: Any) -> Cost:
        """Parameters and MACs at the subnet's own resolution, counted layer by layer."""
        config = self.resolve(arch)
        size = _conv_size(config.resolution, self.strides[0])
        k, width = config.kernels[0], config.widths[0]
        params = k * k * self.in_channels * width + width + 2 * width
        macs = size * size * k * k * self.in_channels * width
        for stage in range(1, NUM_STAGES):
            out, mid, k = config.widths[stage], config.middle_channels(stage), config.kernels[stage]
            for block in range(config.depths[stage]):
                stride = self.strides[stage] if block == 0 else 1
                in_size, size = size, _conv_size(size, stride)
                if self.block == "basic":
                    layers = [(k, width, mid, size), (k, mid, out, size)]
                else:
                    layers = [(1, width, mid, in_size), (k, mid, mid, size), (1, mid, out, size)]
                if block == 0 and self.has_projection(stage):
                    layers.append((1, width, out, size))
                for kernel, cin, cout, side in layers:
                    params += kernel * kernel * cin * cout + 3 * cout  # weights, bias, BN scale and shift
                    macs += side * side * kernel * kernel * cin * cout
                width = out
        params += width * self.num_classes + self.num_classes
        macs += width * self.num_classes
        return Cost(params=params, macs=macs)


def _conv_size(size: int, stride: int) -> int:
    """Output side of a convolution padded by ``kernel // 2`` (odd kernel)."""
    return (size - 1) // stride + 1


def _describe(values: tuple) -> str:
    return "{" + ", ".join(f"{v:g}" for v in values) + "}"


@functools.cache
def _imagenet_basic() -> dict:
    return {
        "block": "basic",
        "widths": (_steps(8, 32, 8), _steps(8, 64, 8), _steps(16, 112, 8), _steps(32, 256, 16), _steps(112, 592, 16)),
        "depths": ((1,), (1, 2), (1, 2), (1, 2, 3), (1, 2, 3)),
        "kernels": ((3, 5, 7), (3,), (3,), (3,), (3,)),
        "expand_ratios": ((0,),) + ((0.25, 0.5, 0.75, 1.0),) * 4,
        "resolutions": _steps(128, 224, 4),
    }


@register_space("bignas_resnet_basic")
def bignas_resnet_basic(**options) -> BigNASSpace:
    """RobustART's ResNet-18-like BigNAS space on ImageNet (basic blocks), ranges inferred
    from its named subnets: 9M to 1.6G MACs."""
    return BigNASSpace(**{"name": "bignas_resnet_basic", **_imagenet_basic(), **options})


@register_space("bignas_resnet_bottleneck")
def bignas_resnet_bottleneck(**options) -> BigNASSpace:
    """RobustART's ResNet-50-like BigNAS space on ImageNet (bottleneck blocks, expand 0.25),
    ranges inferred from its named subnets: about 3G MACs."""
    return BigNASSpace(**{
        "name": "bignas_resnet_bottleneck", "block": "bottleneck",
        "widths": (_steps(48, 80, 16), _steps(192, 240, 16), _steps(416, 448, 32), _steps(896, 960, 32),
                   _steps(2112, 2496, 64)),
        "depths": ((1,), (2, 3), (3, 4, 5), (6, 7), (2, 3)),
        "kernels": ((3, 5), (3,), (3,), (3,), (3,)),
        "expand_ratios": ((0,),) + ((0.25,),) * 4,
        "resolutions": (224,), **options})


@register_space("bignas_resnet_basic_cifar")
def bignas_resnet_basic_cifar(**options) -> BigNASSpace:
    """A CIFAR-size (32x32) basic-block space: stem and first stage at stride 1."""
    return BigNASSpace(**{
        "name": "bignas_resnet_basic_cifar", "block": "basic",
        "widths": ((16, 24, 32), (16, 24, 32, 48), (32, 48, 64), (64, 96, 128), (128, 192, 256)),
        "depths": ((1,), (1, 2), (1, 2), (1, 2, 3), (1, 2)),
        "kernels": ((3, 5), (3,), (3,), (3,), (3,)),
        "expand_ratios": ((0,),) + ((0.5, 0.75, 1.0),) * 4,
        "resolutions": (32,), "strides": (1, 1, 2, 2, 2), "num_classes": 10, "mean": CIFAR_MEAN, "std": CIFAR_STD,
        **options})


@register_space("bignas_resnet_bottleneck_cifar")
def bignas_resnet_bottleneck_cifar(**options) -> BigNASSpace:
    """A CIFAR-size (32x32) bottleneck space: stem and first stage at stride 1."""
    return BigNASSpace(**{
        "name": "bignas_resnet_bottleneck_cifar", "block": "bottleneck",
        "widths": ((16, 32), (64, 96), (128, 192), (256, 384), (512, 768)),
        "depths": ((1,), (1, 2), (1, 2), (1, 2, 3), (1, 2)),
        "kernels": ((3, 5), (3,), (3,), (3,), (3,)),
        "expand_ratios": ((0,),) + ((0.25,),) * 4,
        "resolutions": (32,), "strides": (1, 1, 2, 2, 2), "num_classes": 10, "mean": CIFAR_MEAN, "std": CIFAR_STD,
        **options})


@register_space("bignas_resnet_basic_digits")
def bignas_resnet_basic_digits(**options) -> BigNASSpace:
    """A basic-block space for the embedded 8x8 grey digits (8 -> 4 -> 2 pixels)."""
    return BigNASSpace(**{
        "name": "bignas_resnet_basic_digits", "block": "basic",
        "widths": ((4, 8, 16), (4, 8, 16), (8, 16, 32), (16, 32, 48), (16, 32, 64)),
        "depths": ((1,), (1, 2), (1, 2), (1, 2), (1, 2)),
        "kernels": ((3, 5), (3,), (3,), (3,), (3,)),
        "expand_ratios": ((0,),) + ((0.5, 1.0),) * 4,
        "resolutions": (8,), "strides": (1, 1, 2, 1, 2), "in_channels": 1, "num_classes": 10,
        "mean": DIGITS_MEAN, "std": DIGITS_STD, **options})
