"""Standalone NAS-Bench-201 networks of different cells in one graph, so that they train
together as one population (:func:`robustjax.training.train_population`).

The network of a cell is the supernet's layout with the cell's op choice held as state
(:class:`CellNetwork`): the ops an edge does not choose have zero weights and are either
computed and selected out (one-hot op weights, for networks side by side under ``vmap``) or
not computed at all (op indices, ``sequential``: for networks one after another, each edge a
switch), so the logits, gradients and batch statistics are those of the standalone network
(``NB201Network``) while every cell of a space shares one graph definition. Its initial weights are the standalone network's for the
same key, as ``zoo.create("nas.SPACE", arch=..., key=...)`` and ``robustjax train`` build it;
:func:`standalone` takes a trained network back to its own shapes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.nas import build, nb201_net, standalone
from robustjax.nas.nb201 import NB201Config, NB201Space


class OpChoice(nnx.Variable):
    """A cell's (6, 5) one-hot op weights or (6,) op indices: state that is neither trained
    nor a batch statistic."""


class CellNetwork(nnx.Module):
    """The standalone network of one cell, in the supernet's layout (see the module's docstring)."""

    def __init__(self, space: NB201Space, config: NB201Config, *, rngs: nnx.Rngs, sequential: bool = False):
        self.supernet = nb201_net.NB201Supernet(space, rngs=rngs)
        self.ops = OpChoice(_choice(config, sequential))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.supernet(x, self.ops[...])


def trainable(space: NB201Space, arch: Any, *, key: jax.Array, sequential: bool = False) -> Classifier:
    """The untrained standalone network of ``arch`` initialised from ``key``, as a classifier
    in the shared layout (eval mode); ``sequential``: its edges switch to their op, for a
    population trained one network after another (``train_population(sequential=True)``)."""
    config = _config(space, arch)
    own = nnx.to_pure_dict(nnx.state(build.build_network(space, config, key=key)))
    graphdef, state = nnx.split(nnx.eval_shape(lambda: CellNetwork(space, config, rngs=nnx.Rngs(0),
                                                                    sequential=sequential)))
    layout = nnx.to_pure_dict(state)["supernet"]
    nnx.replace_by_pure_dict(state, {"supernet": jax.tree.map(jnp.asarray, standalone.embed(own, config, layout)),
                                     "ops": _choice(config, sequential)})
    return build.as_classifier(space, nnx.merge(graphdef, state), config, name=f"{config.arch_id} (trainable)")


def standalone_network(space: NB201Space, arch: Any, classifier: Classifier) -> Classifier:
    """The network ``classifier`` (a :func:`trainable` one, trained) at its own shapes."""
    config = _config(space, arch)
    weights = nnx.to_pure_dict(classifier.params)
    if "ops" not in weights or not any(bool(jnp.array_equal(weights["ops"], _choice(config, sequential)))
                                       for sequential in (False, True)):
        raise ValueError(f"standalone_network: the classifier {classifier.name!r} is not a trainable network of "
                         f"{config.arch_id}")
    return standalone.network(space, config, nb201_net.subnet_weights(weights["supernet"], config))


def _choice(config: NB201Config, sequential: bool) -> jax.Array:
    return jnp.asarray(nb201_net.op_indices(config) if sequential else nb201_net.op_weights(config))


def _config(space: Any, arch: Any) -> NB201Config:
    if not isinstance(space, NB201Space):
        raise TypeError(f"trainable networks of different cells are NAS-Bench-201 cells; got the space "
                        f"{getattr(space, 'name', type(space).__name__)!r} (train BigNAS subnets of one config, or "
                        "zoo networks of one architecture, as a population directly)")
    return space.resolve(arch)
