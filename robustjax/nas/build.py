"""Config -> Flax NNX network -> :class:`~robustjax.Classifier`, for every search space."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from robustjax.classifier import Classifier, NNXFeatures, NNXLogits
from robustjax.nas import bignas_net, nb201_net
from robustjax.nas.bignas import BigNASConfig, BigNASSpace
from robustjax.nas.nb201 import NB201Config, NB201Space

Space = NB201Space | BigNASSpace
Config = NB201Config | BigNASConfig


def check_space(space: Any) -> Space:
    if not isinstance(space, NB201Space | BigNASSpace):
        raise TypeError(f"expected a search space from robustjax.nas.space(...), got {type(space).__name__}")
    return space


def build_network(space: Space, arch: Any, *, key: jax.Array) -> nnx.Module:
    """The standalone network of ``arch`` (a config, an id, an arch string or a subnet name)."""
    config = check_space(space).resolve(arch)
    rngs = nnx.Rngs(params=key)
    if isinstance(space, NB201Space):
        return nb201_net.NB201Network(space, config, rngs=rngs)
    return bignas_net.BigNASResNet(bignas_net.Shape.of(space, config), rngs=rngs)


def build_supernet(space: Space, *, key: jax.Array) -> nnx.Module:
    """The weight-sharing supernet of ``space``: called as ``module(x, choice(space, arch))``."""
    rngs = nnx.Rngs(params=key)
    if isinstance(check_space(space), NB201Space):
        return nb201_net.NB201Supernet(space, rngs=rngs)
    return bignas_net.BigNASResNet(bignas_net.Shape.supernet(space), rngs=rngs)


def choice(space: Space, arch: Any, *, op_indices: bool = False):
    """The arrays that select ``arch`` in the supernet: (6, 5) one-hot op weights for
    NAS-Bench-201, or with ``op_indices`` its (6,) op indices (each edge then runs its op
    alone: ``nb201_net.SuperCell``), a :class:`~robustjax.nas.bignas_net.SubnetChoice` for
    BigNAS."""
    config = check_space(space).resolve(arch)
    if isinstance(space, NB201Space):
        return nb201_net.op_indices(config) if op_indices else nb201_net.op_weights(config)
    return bignas_net.SubnetChoice.of(config)


def resolution(space: Space, arch: Any) -> int:
    """The side the network of ``arch`` computes at (a BigNAS subnet's own resolution)."""
    if isinstance(space, NB201Space):
        return space.input_shape[0]
    return space.resolve(arch).resolution


def slice_subnet(space: Space, supernet: nnx.Module, arch: Any) -> nnx.Module:
    """The standalone network of ``arch`` holding its part of the supernet's weights."""
    config = space.resolve(arch)
    subnet = nnx.eval_shape(lambda: build_network(space, config, key=jax.random.key(0)))
    weights = nnx.to_pure_dict(nnx.state(supernet))
    if isinstance(space, NB201Space):
        sliced = nb201_net.subnet_weights(weights, config)
    else:
        sliced = bignas_net.slice_weights(weights, supernet.shape, subnet.shape)
    graphdef, state = nnx.split(subnet)
    nnx.replace_by_pure_dict(state, jax.tree.map(jax.numpy.asarray, sliced))
    return nnx.merge(graphdef, state)


@dataclasses.dataclass(frozen=True)
class Resized:
    """``apply_fn`` that first resizes the (normalised) images to ``resolution`` (bicubic,
    as BigNAS and RobustART interpolate inside the network)."""

    inner: Callable
    resolution: int

    def __call__(self, params: Any, x: jax.Array):
        return self.inner(params, resize_to(x, self.resolution))


def resize_to(x: jax.Array, side: int) -> jax.Array:
    """NHWC images resized (bicubic) to ``side x side``; unchanged when already that size."""
    if x.shape[1:3] == (side, side):
        return x
    return jax.image.resize(x, (x.shape[0], side, side, x.shape[3]), "bicubic")


@dataclasses.dataclass(frozen=True)
class SupernetLogits:
    """``apply_fn`` of one subnet run through the supernet: params are ``(*states, choice)``,
    the supernet's state (whole, or split as parameters and batch statistics) and the choice."""

    graphdef: Any

    def __call__(self, params: Any, x: jax.Array) -> jax.Array:
        *states, selected = params
        return nnx.merge(self.graphdef, *states)(x, selected)


def as_classifier(space: Space, module: nnx.Module, arch: Any, *, name: str) -> Classifier:
    """Wraps a standalone network (put in eval mode) as a classifier on the space's images."""
    module.eval()
    graphdef, state = nnx.split(module)
    side = resolution(space, arch)
    return Classifier(params=state, apply_fn=Resized(NNXLogits(graphdef), side),
                      features_fn=Resized(NNXFeatures(graphdef), side), num_classes=space.num_classes,
                      input_shape=space.input_shape, mean=space.mean, std=space.std, name=name)


def supernet_classifier(space: Space, supernet: nnx.Module, arch: Any, *, name: str) -> Classifier:
    """One subnet as a classifier that runs through the (eval-mode) supernet: every subnet of
    a resolution shares one compiled program, since the choice is data."""
    supernet.eval()
    graphdef, state = nnx.split(supernet)
    return Classifier(params=(state, choice(space, arch)), apply_fn=Resized(SupernetLogits(graphdef),
                      resolution(space, arch)), num_classes=space.num_classes, input_shape=space.input_shape,
                      mean=space.mean, std=space.std, name=name)
