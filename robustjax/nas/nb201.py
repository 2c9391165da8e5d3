"""The NAS-Bench-201 cell space (Dong & Yang, ICLR 2020), with NAS-Bench-201's own ids.

A cell has 4 nodes; node ``j`` sums one operation applied to each earlier node ``i < j``,
so a cell is 6 operations, one per edge, each one of ``OPS``: 5^6 = 15,625 cells.

Ids are NAS-Bench-201's: its generator lists the cells lexicographically (the edge into node
1 varies slowest, the edge 2 -> 3 fastest, ops in the order of ``OPS``) and shuffles the list
with Python's ``random.seed(88); random.shuffle(...)``; the id is the position after the
shuffle. Reproducing that shuffle here gives the published ids without downloading anything,
so results join the robustness datasets built over the space (Jung et al., ICLR 2023;
NAS-RobBench-201, ICLR 2024), which report the 6,466 isomorphism classes by their smallest id.

Arch strings are NAS-Bench-201's: ``|op~0|+|op~0|op~1|+|op~0|op~1|op~2|``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from typing import Any

import jax

from robustjax.nas.space import (
    CIFAR_MEAN,
    CIFAR_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    Cost,
    check_index,
    register_space,
    sample_indices,
)

ARCH_ID_PREFIX = "nb201:"
OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
EDGES = ((1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2))  # (node, source), in arch-string order
NUM_CELLS = len(OPS) ** len(EDGES)
_SHUFFLE_SEED = 88  # NAS-Bench-201's generate_meta_info


@dataclasses.dataclass(frozen=True)
class NB201Config:
    """One NAS-Bench-201 cell: the operation on each of the 6 edges, in ``EDGES`` order."""

    ops: tuple[str, ...]

    def __post_init__(self):
        ops = tuple(self.ops)
        if len(ops) != len(EDGES) or any(op not in OPS for op in ops):
            raise ValueError(f"an NB201 cell is 6 ops from {OPS}, got {self.ops!r}")
        object.__setattr__(self, "ops", ops)

    @classmethod
    def from_string(cls, arch: str) -> NB201Config:
        """Parses ``|op~0|+|op~0|op~1|+|op~0|op~1|op~2|``."""
        nodes = arch.split("+")
        if len(nodes) != 3:
            raise ValueError(f"an NB201 arch string has 3 nodes joined by '+', got {arch!r}")
        ops = []
        for node, text in enumerate(nodes, start=1):
            if not (text.startswith("|") and text.endswith("|")):
                raise ValueError(f"node {node} of {arch!r} must be written |op~src|...|, got {text!r}")
            edges = text[1:-1].split("|")
            if len(edges) != node:
                raise ValueError(f"node {node} of {arch!r} needs {node} inputs, got {len(edges)}")
            for source, edge in enumerate(edges):
                op, _, src = edge.partition("~")
                if op not in OPS or src != str(source):
                    raise ValueError(
                        f"edge {edge!r} of node {node} in {arch!r} must be 'op~{source}' with op in {OPS}"
                    )
                ops.append(op)
        return cls(tuple(ops))

    @property
    def arch_string(self) -> str:
        ops = iter(self.ops)
        return "+".join("|" + "|".join(f"{next(ops)}~{i}" for i in range(node)) + "|" for node in (1, 2, 3))

    @property
    def index(self) -> int:
        """The NAS-Bench-201 id."""
        return _index_of_ops()[self.ops]

    @property
    def arch_id(self) -> str:
        return f"{ARCH_ID_PREFIX}{self.index}"

    def op_indices(self) -> tuple[int, ...]:
        """Each edge's op as its position in ``OPS``."""
        return tuple(OPS.index(op) for op in self.ops)


@functools.cache
def _cells_in_id_order() -> tuple[tuple[str, ...], ...]:
    cells = list(itertools.product(OPS, repeat=len(EDGES)))  # lexicographic, NB201's gen_all order
    random.Random(_SHUFFLE_SEED).shuffle(cells)
    return tuple(cells)


@functools.cache
def _index_of_ops() -> dict[tuple[str, ...], int]:
    return {ops: i for i, ops in enumerate(_cells_in_id_order())}


def isomorphism_key(config: NB201Config) -> str:
    """The key NAS-Bench-201 groups isomorphic cells by (``to_unique_str(consider_zero=True)``).

    Each node is written as the sorted sum of its inputs: ``none`` (or an input that is the
    zero string ``#``) gives ``#``, ``skip_connect`` passes the input through, any other op
    gives ``(input)@op``. Like the original, a node whose inputs are all zero is written
    ``#+#`` rather than ``#``; keeping that rule is what reproduces the published 6,466 classes.
    """
    nodes = {0: "0"}
    ops = iter(config.ops)
    for node in (1, 2, 3):
        terms = []
        for source in range(node):
            op = next(ops)
            if op == "none" or nodes[source] == "#":
                terms.append("#")
            elif op == "skip_connect":
                terms.append(nodes[source])
            else:
                terms.append(f"({nodes[source]})@{op}")
        nodes[node] = "+".join(sorted(terms))
    return nodes[3]


@functools.cache
def _canonical_ids() -> tuple[int, ...]:
    smallest: dict[str, int] = {}
    keys = [isomorphism_key(NB201Config(ops)) for ops in _cells_in_id_order()]
    for index, key in enumerate(keys):
        smallest.setdefault(key, index)  # ids ascend, so the first seen is the smallest
    return tuple(smallest[key] for key in keys)


@dataclasses.dataclass(frozen=True)
class NB201Space:
    """NAS-Bench-201's 15,625 cells inside its macro skeleton (``TinyNetwork``).

    The macro: a 3x3 stem convolution to ``channels`` and batch norm; 3 stages of
    ``cells_per_stage`` cells at ``channels``, 2x and 4x, with a stride-2 residual block
    between stages; batch norm, ReLU, global average pooling and a linear head. NAS-Bench-201
    trains C=16, N=5 on 32x32 images.
    """

    name: str = "nb201"
    channels: int = 16
    cells_per_stage: int = 5
    input_shape: tuple[int, int, int] = (32, 32, 3)
    num_classes: int = 10
    mean: tuple[float, ...] = CIFAR_MEAN
    std: tuple[float, ...] = CIFAR_STD

    def __post_init__(self):
        if self.channels < 1 or self.cells_per_stage < 1:
            raise ValueError(f"{self.name}: channels and cells_per_stage must be >= 1")
        height, width, _ = self.input_shape
        if height % 4 or width % 4:
            raise ValueError(f"{self.name}: the two stride-2 reductions need H and W divisible by 4, "
                             f"got {self.input_shape}")

    def __len__(self) -> int:
        return NUM_CELLS

    def config(self, index: int) -> NB201Config:
        return NB201Config(_cells_in_id_order()[check_index(self, index)])

    def resolve(self, arch: Any) -> NB201Config:
        """A config from a config, an id, an arch id (``"nb201:11472"``) or an arch string."""
        if isinstance(arch, NB201Config):
            return arch
        if isinstance(arch, str) and arch.startswith(ARCH_ID_PREFIX) and arch[len(ARCH_ID_PREFIX):].isdigit():
            return self.config(int(arch[len(ARCH_ID_PREFIX):]))
        if isinstance(arch, str):
            return NB201Config.from_string(arch)
        return self.config(arch)

    def index(self, arch: Any) -> int:
        return self.resolve(arch).index

    def arch_string(self, arch: Any) -> str:
        return self.resolve(arch).arch_string

    def canonical(self, arch: Any) -> int:
        """The smallest id of the isomorphism class of ``arch`` (the id the robustness
        datasets over NAS-Bench-201 use)."""
        return _canonical_ids()[self.index(arch)]

    def representatives(self) -> list[int]:
        """The 6,466 class representatives (smallest ids), ascending."""
        return sorted(set(_canonical_ids()))

    def sample(self, key: jax.Array, n: int, *, flops_range: tuple[float, float] | None = None,
               unique: bool = True) -> list[NB201Config]:
        return [self.config(i) for i in sample_indices(self, key, n, flops_range=flops_range, unique=unique)]

    def cost(self, arch: Any) -> Cost:
        """Parameters and MACs of the network, counted layer by layer (tests check the
        parameters against an abstract build and against xautodl's network)."""
        config = self.resolve(arch)
        height, width, in_channels = self.input_shape
        c = self.channels
        params = 9 * in_channels * c + 2 * c
        macs = height * width * 9 * in_channels * c
        for stage in range(3):
            if stage:
                height, width = height // 2, width // 2
                params += 9 * c * 2 * c + 9 * (2 * c) ** 2 + c * 2 * c + 2 * (2 * 2 * c)
                macs += height * width * (9 * c * 2 * c + 9 * (2 * c) ** 2 + c * 2 * c)
                c *= 2
            for op in config.ops:
                kernel_area = {"nor_conv_1x1": 1, "nor_conv_3x3": 9}.get(op, 0)
                if kernel_area:
                    params += self.cells_per_stage * (kernel_area * c * c + 2 * c)
                    macs += self.cells_per_stage * height * width * kernel_area * c * c
        params += 2 * c + c * self.num_classes + self.num_classes
        macs += c * self.num_classes
        return Cost(params=params, macs=macs)


@register_space("nb201")
def nb201(**options) -> NB201Space:
    """NAS-Bench-201 as published: C=16, N=5, 32x32 RGB, 10 classes (CIFAR-10)."""
    return NB201Space(**options)


@register_space("nb201_digits")
def nb201_digits(**options) -> NB201Space:
    """The NAS-Bench-201 cells in a small macro for the embedded 8x8 digits: C=8, N=1."""
    return NB201Space(**{"name": "nb201_digits", "channels": 8, "cells_per_stage": 1,
                         "input_shape": (8, 8, 1), "num_classes": 10,
                         "mean": DIGITS_MEAN, "std": DIGITS_STD, **options})
