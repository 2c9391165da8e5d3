"""Populations: many networks that one compiled program evaluates.

A :class:`Population` is a :class:`~robustjax.Classifier` whose per-network leaves carry a
leading network axis, with ``axes`` saying which (0) and which are shared (None):

- subnets of a supernet share its weights; each has its own op choice (NAS-Bench-201's
  one-hot op weights, BigNAS's width/depth/kernel masks) and its own recalibrated batch-norm
  statistics. Every NAS-Bench-201 cell has the same shapes, so any cells form one
  population; BigNAS subnets run masked at the supernet's largest shapes, one population per
  input resolution (:func:`resolution_buckets`);
- independently trained networks of one architecture stack all their leaves
  (:meth:`Population.stack`).

``population.map(fn, *args)`` applies ``fn(classifier, *args)`` to every network, so
attacks, corruptions and metrics take a population unchanged and return per-network results
with a leading network axis: side by side (``jax.vmap``), or, for a ``sequential``
population, one network after another within the same program (``jax.lax.map``), where each
NAS-Bench-201 edge runs only the op its network chose instead of every op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.nas import bignas_packed, build, nb201_packed
from robustjax.nas.bignas import BigNASConfig, BigNASSpace
from robustjax.nas.nb201 import NB201Config, NB201Space
from robustjax.nas.recalibrate import batch_norm_statistics
from robustjax.nas.supernet import Supernet, through_supernet


@dataclasses.dataclass(frozen=True)
class Population:
    """Networks batched on a leading axis of ``classifier``'s per-network leaves."""

    classifier: Classifier
    axes: Any  # a prefix of classifier.params (as jax.vmap's in_axes): 0 per network, None shared
    arch_ids: tuple[str, ...]
    sequential: bool = False  # networks one after another in one program, not side by side

    def __len__(self) -> int:
        return len(self.arch_ids)

    def map(self, fn: Callable[..., Any], *args) -> Any:
        """``fn(classifier, *args)`` for every network (:func:`over_networks`); ``args`` are
        shared. Every output leaf gains a leading network axis."""
        template = self.classifier
        return over_networks(lambda params: fn(template.replace(params=params), *args), self.classifier.params,
                             self.axes, self.sequential)

    def member(self, index: int) -> Classifier:
        """Network ``index`` alone, as a classifier."""
        return self.classifier.replace(params=_take(self.classifier.params, self.axes, index),
                                       name=self.arch_ids[index])

    @classmethod
    def stack(cls, classifiers: Sequence[Classifier]) -> Population:
        """Independently trained networks of one architecture (equal static fields)."""
        if not classifiers:
            raise ValueError("a population needs at least one network")
        first = classifiers[0]
        for other in classifiers[1:]:  # names may differ: each network keeps its own as its id
            if (jax.tree.structure(other.replace(name=first.name)) != jax.tree.structure(first)
                    or any(a.shape != b.shape for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(other)))):
                raise ValueError(f"cannot stack {other.name!r} with {first.name!r}: a population of independent "
                                 "networks needs one architecture (equal apply_fn, shapes and static fields)")
        stacked = jax.tree.map(lambda *leaves: np.stack([np.asarray(leaf) for leaf in leaves]),
                               *[c.params for c in classifiers])
        return cls(first.replace(params=stacked, name="population"), 0, tuple(c.name for c in classifiers))


def over_networks(fn: Callable[[Any], Any], params: Any, axes: Any, sequential: bool = False) -> Any:
    """``fn(one network's params)`` for every network of a population's ``params`` (network
    axis 0 where the prefix ``axes`` says 0), stacked on a leading network axis: side by side
    (``jax.vmap``), or, ``sequential``, one network after another in the same program
    (``jax.lax.map``). Under ``vmap`` a branch on per-network data (an NB201 edge's switch on
    its op index) computes every branch and selects; in turn, only the network's own runs.
    A lone network (``axes`` None) is a population of one, at its own shapes."""
    if axes is None:
        return jax.tree.map(lambda out: out[None], fn(params))
    if not sequential:
        return jax.vmap(fn, in_axes=(axes,))(params)
    return jax.lax.map(lambda index: fn(_take(params, axes, index)), jnp.arange(network_count(params, axes)))


def network_count(params: Any, axes: Any) -> int:
    """The length of the network axis of ``params`` (1 for a classifier that is not a population)."""
    if isinstance(axes, tuple):
        return max((network_count(p, a) for p, a in zip(params, axes)), default=1)
    return 1 if axes is None else jax.tree.leaves(params)[0].shape[0]


def _take(params: Any, axes: Any, index: int | jax.Array) -> Any:
    """Network ``index``'s part of ``params``, whose in-axes prefix is ``axes`` (``index`` may
    be traced, the leaves NumPy arrays)."""
    if axes is None:
        return params
    if isinstance(axes, tuple):
        return tuple(_take(p, a, index) for p, a in zip(params, axes))
    return jax.tree.map(lambda leaf: jax.lax.dynamic_index_in_dim(leaf, index, keepdims=False), params)


def resolve_configs(space: build.Space, archs: Sequence[Any]) -> list:
    """The configs of ``archs`` (ids, strings or configs) in ``space``, refusing another space's configs."""
    kind = BigNASConfig if isinstance(space, BigNASSpace) else NB201Config
    configs = []
    for arch in archs:
        if isinstance(arch, NB201Config | BigNASConfig) and not isinstance(arch, kind):
            raise TypeError(f"a population of {space.name} was given a config of another space: {arch.arch_id}")
        configs.append(space.resolve(arch))
    if not configs:
        raise ValueError("a population needs at least one network")
    return configs


def resolution_buckets(space: build.Space, archs: Sequence[Any]) -> dict[int, list]:
    """The configs of ``archs`` grouped by the resolution they compute at (one population,
    so one compiled program, per group)."""
    buckets: dict[int, list] = {}
    for config in resolve_configs(space, archs):
        buckets.setdefault(build.resolution(space, config), []).append(config)
    return buckets


LAYOUTS = ("auto", "masks", "sequential", "packed", "exact")


def check_layout(layout: str, network_shards: int = 1, allowed: tuple[str, ...] = LAYOUTS) -> None:
    """Refuses a layout not in ``allowed``; one that runs a network at a time
    (``"sequential"``, ``"exact"``) or packs a population's networks by choice (``"packed"``)
    with networks split over ``network_shards`` > 1."""
    if layout not in allowed:
        raise ValueError(f"layout must be one of {allowed}, got {layout!r}")
    if layout in ("exact", "sequential") and network_shards != 1:
        raise ValueError(f"layout={layout!r} runs one network at a time: it cannot split networks over "
                         "network_shards (--network-shards)")
    if layout == "packed" and network_shards != 1:
        raise ValueError("layout='packed' needs every network of a population on each device: it cannot split "
                         "networks over network_shards (--network-shards)")


def choose_layout(layout: str, networks: int, space: build.Space | None = None, network_shards: int = 1) -> str:
    """How a bucket of ``networks`` subnets runs: ``"masks"`` (one population over the
    supernet's shapes, the networks side by side: one program for all), ``"sequential"``
    (the same program's networks one after another, each NB201 edge running only its
    network's op), ``"packed"`` (side by side, each NB201 edge running each op once on the
    examples of the networks that chose it, each BigNAS block at each shape the networks
    take there, ``nas.packing``; one program per population signature) or ``"exact"``
    (each subnet sliced to its own shapes, one program each).
    ``"auto"`` takes exact shapes only for a lone network, which has no program to share
    (on the 2-core CPU, masks give 6.5x the networks per hour of exact shapes, whose
    compiles dominate), and runs NAS-Bench-201 populations sequentially on the CPU, where
    side by side they compute every op of every edge (``benchmarks/README.md``, ``nas``).
    Networks split over ``network_shards`` > 1 run side by side."""
    check_layout(layout, network_shards)
    if layout != "auto":
        return layout
    if network_shards != 1:
        return "masks"
    if networks == 1:
        return "exact"
    in_turn = isinstance(space, NB201Space) and jax.default_backend() == "cpu"
    return "sequential" if in_turn else "masks"


def packing_order(space: build.Space, configs: Sequence, population_size: int) -> list:
    """``configs`` ordered so that packed populations of ``population_size`` share as much
    as they can: NB201 cells so that populations share one signature
    (``nb201_packed.packing_order``), BigNAS subnets by shape (``bignas_packed.packing_order``)."""
    if isinstance(space, BigNASSpace):
        return bignas_packed.packing_order(space, configs)
    return nb201_packed.packing_order(configs, population_size)


def exact_subnet(supernet: Supernet, arch: Any, *, calibration: np.ndarray | None = None) -> Population:
    """Subnet ``arch`` sliced to its own shapes, as a population of one."""
    config = supernet.space.resolve(arch)
    return Population.stack([supernet.subnet(config, calibration=calibration, name=config.arch_id)])


def from_supernet(supernet: Supernet, archs: Sequence[Any], *, calibration: np.ndarray | None = None,
                  batch_size: int = 256, sequential: bool = False, packed: bool = False) -> Population:
    """Subnets ``archs`` of ``supernet`` as one population: shared weights, per-subnet op
    choices, and per-subnet batch-norm statistics recalibrated on ``calibration`` images
    ([0, 1]) in one vmapped pass, or the supernet's own statistics when none are given;
    ``sequential``: its networks run one after another (:class:`Population`), each NB201
    subnet chosen by op indices, so that each edge runs only its op; ``packed``: side by
    side, the networks that make the same choice at an NB201 edge or a BigNAS block running
    it together, each at its own shapes (:mod:`~robustjax.nas.packing`)."""
    space = supernet.space
    if packed and sequential:
        raise ValueError(f"{space.name}: packed populations run their networks side by side, not sequentially")
    buckets = resolution_buckets(space, archs)
    if len(buckets) > 1:
        raise ValueError(f"{space.name}: these subnets compute at {len(buckets)} resolutions "
                         f"{sorted(buckets)}; make one population per resolution (nas.resolution_buckets)")
    configs = next(iter(buckets.values()))
    choices = jax.tree.map(lambda *c: np.stack(c), *[build.choice(space, c) for c in configs])
    module = supernet.module()
    _, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
    stats_axis = None
    if calibration is not None:
        images = supernet.prepare(calibration, configs[0])
        statistics = batch_norm_statistics(module, images, batch_size=batch_size, forward=through_supernet,
                                           choices=choices, batched=True)
        stats = _with_statistics(module, stats, statistics)
        stats_axis = 0
    module.eval()
    graphdef = nnx.split(module, nnx.Param, nnx.BatchStat)[0]
    if packed and isinstance(space, BigNASSpace):
        choices = bignas_packed.PackedSubnets.of(np.stack([bignas_packed.block_keys(space, c) for c in configs]))
    elif sequential or packed:  # each NB201 edge runs its network's op alone, or packed by op
        choices = jax.tree.map(lambda *c: np.stack(c), *[build.choice(space, c, op_indices=True) for c in configs])
        choices = nb201_packed.PackedChoice.of(choices) if packed else choices
    classifier = Classifier(
        params=(params, stats, choices),
        apply_fn=build.Resized(build.SupernetLogits(graphdef), build.resolution(space, configs[0])),
        num_classes=space.num_classes, input_shape=space.input_shape, mean=space.mean, std=space.std,
        name=f"population of {space.name}")
    return Population(classifier, (None, stats_axis, 0), tuple(c.arch_id for c in configs), sequential)


def _with_statistics(module: nnx.Module, stats: nnx.State, statistics: list) -> nnx.State:
    """``stats`` with every BatchNorm's mean and var replaced by the stacked ``statistics``."""
    by_path = {}
    norms = [(path, m) for path, m in nnx.iter_modules(module) if isinstance(m, nnx.BatchNorm)]
    for (path, _), (mean, var) in zip(norms, statistics):
        by_path[(*path, "mean")], by_path[(*path, "var")] = mean, var
    return nnx.from_flat_state([(path, variable.replace(by_path[tuple(path)]))
                                for path, variable in nnx.to_flat_state(stats)])
