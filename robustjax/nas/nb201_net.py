"""NAS-Bench-201 networks in Flax NNX: a standalone cell network and the weight-sharing supernet.

:class:`NB201Network` is NAS-Bench-201's ``TinyNetwork`` for one cell, with its module names
(``stem``, ``cells.{i}``, ``lastact``, ``classifier``), so xautodl's PyTorch state dicts
convert one to one. :class:`NB201Supernet` keeps one weight set per (cell, edge, op) and
takes each edge's op choice as data (one-hot op weights, or op indices), so one compiled
program runs every cell, and its logits equal those of the standalone network
loaded with that cell's weights (``subnet_weights``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from robustjax.nas.nb201 import EDGES, OPS, NB201Config, NB201Space
from robustjax.nas.nb201_packed import PackedChoice, avg_pool_3x3, packed_edge
from robustjax.zoo.resnet_layers import batch_norm, conv, global_average_pool

CONV_KERNELS = {"nor_conv_1x1": 1, "nor_conv_3x3": 3}


class ReLUConvBN(nnx.Module):
    """ReLU, a bias-free convolution, BatchNorm (NAS-Bench-201's ``nor_conv_kxk``)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, *, rngs: nnx.Rngs):
        self.conv = conv(cin, cout, kernel, stride=stride, rngs=rngs)
        self.bn = batch_norm(cout, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(nnx.relu(x)))


class Cell(nnx.Module):
    """One NAS-Bench-201 cell (``InferCell``): node j sums an op of every node i < j."""

    def __init__(self, config: NB201Config, channels: int, *, rngs: nnx.Rngs):
        self.ops = config.ops
        self.layers = nnx.Dict({str(edge): ReLUConvBN(channels, channels, CONV_KERNELS[op], rngs=rngs)
                                for edge, op in enumerate(config.ops) if op in CONV_KERNELS})

    def __call__(self, x: jax.Array) -> jax.Array:
        def edge_output(edge: int, op: str, source: jax.Array) -> jax.Array | None:
            if op == "none":
                return None
            if op == "skip_connect":
                return source
            if op == "avg_pool_3x3":
                return avg_pool_3x3(source)
            return self.layers[str(edge)](source)

        return _cell_forward(x, edge_output, self.ops)


class SuperCell(nnx.Module):
    """Every op of every edge: a 1x1 and a 3x3 ``ReLUConvBN`` per edge (the others have no
    weights). Each edge takes its op as data, either way in one compiled program for every
    cell:

    - (6,) integer op indices (:func:`op_indices`): the edge runs that op alone
      (``nnx.switch``), so a network computes only its own ops, and the op's batch norm
      may update its statistics (training); run one network at a time (under ``vmap`` over
      networks a switch computes every op);
    - (6, 5) one-hot op weights (:func:`op_weights`): every op runs and the chosen one is
      selected, not multiplied in, so no inf or NaN of an op the network does not use
      reaches the sum (0 * inf = NaN); batch norm may update its statistics (training,
      recalibration);
    - a population's :class:`~robustjax.nas.nb201_packed.PackedChoice`: under ``vmap`` over
      its networks, each edge runs each op once on the examples of the networks that chose
      it (inference and input gradients only)."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs):
        self.conv1x1 = nnx.List([ReLUConvBN(channels, channels, 1, rngs=rngs) for _ in EDGES])
        self.conv3x3 = nnx.List([ReLUConvBN(channels, channels, 3, rngs=rngs) for _ in EDGES])

    def __call__(self, x: jax.Array, ops: jax.Array | PackedChoice) -> jax.Array:
        def edge_output(edge: int, op: None, source: jax.Array) -> jax.Array:
            if isinstance(ops, PackedChoice):
                return self._packed(edge, ops.indices[edge], ops.signature[edge], source)
            if jnp.issubdtype(ops.dtype, jnp.integer):
                layers = (self.conv1x1[edge], self.conv3x3[edge])
                if layers[0].bn.use_running_average:  # inference: no state changes, a plain switch
                    return jax.lax.switch(ops[edge], (jnp.zeros_like, lambda s: s, *layers, avg_pool_3x3), source)
                return nnx.switch(ops[edge], _SWITCHED, *layers, source)  # the chosen op's batch norm updates
            w = ops[edge]  # in OPS order; "none" contributes nothing
            outputs = (source, self.conv1x1[edge](source), self.conv3x3[edge](source), avg_pool_3x3(source))
            return sum(jnp.where(w[op] != 0, w[op] * out, 0) for op, out in enumerate(outputs, start=1))

        return _cell_forward(x, edge_output, (None,) * len(EDGES))

    def _packed(self, edge: int, op: jax.Array, counts: tuple[int, ...], source: jax.Array) -> jax.Array:
        """Edge ``edge``'s op ``op`` on ``source``, packed by network (``packed_edge``)."""
        layers = (self.conv1x1[edge], self.conv3x3[edge])
        kernels = tuple(layer.conv.kernel[...] for layer in layers)
        norms = tuple((n.scale[...], n.bias[...], n.mean[...], n.var[...]) for n in (layer.bn for layer in layers))
        return packed_edge(counts)(source, op, kernels, norms)


# An edge's ops in OPS order, as nnx.switch branches of (its 1x1 layer, its 3x3 layer, input).
_SWITCHED = (lambda conv1x1, conv3x3, x: jnp.zeros_like(x), lambda conv1x1, conv3x3, x: x,
             lambda conv1x1, conv3x3, x: conv1x1(x), lambda conv1x1, conv3x3, x: conv3x3(x),
             lambda conv1x1, conv3x3, x: avg_pool_3x3(x))


def _cell_forward(x: jax.Array, edge_output: Callable, ops: tuple) -> jax.Array:
    nodes = [x]
    for node in (1, 2, 3):
        total = None
        for edge, (target, source) in enumerate(EDGES):
            if target != node:
                continue
            out = edge_output(edge, ops[edge], nodes[source])
            if out is not None:
                total = out if total is None else total + out
        nodes.append(jnp.zeros_like(x) if total is None else total)
    return nodes[3]


class ResidualReduction(nnx.Module):
    """The stride-2 residual block between stages (``ResNetBasicblock``): two 3x3
    ``ReLUConvBN`` and a shortcut of 2x2 average pooling then a 1x1 convolution."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs):
        self.conv_a = ReLUConvBN(cin, cout, 3, stride=2, rngs=rngs)
        self.conv_b = ReLUConvBN(cout, cout, 3, rngs=rngs)
        self.downsample = conv(cin, cout, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        shortcut = self.downsample(nnx.avg_pool(x, (2, 2), strides=(2, 2)))
        return shortcut + self.conv_b(self.conv_a(x))


class _Macro(nnx.Module):
    """NAS-Bench-201's macro skeleton around a cell factory."""

    def __init__(self, space: NB201Space, make_cell: Callable[[int], nnx.Module], *, rngs: nnx.Rngs):
        c = space.channels
        self.stem_conv = conv(space.input_shape[-1], c, 3, rngs=rngs)
        self.stem_bn = batch_norm(c, rngs)
        cells = []
        for stage in range(3):
            if stage:
                cells.append(ResidualReduction(c, 2 * c, rngs=rngs))
                c *= 2
            cells.extend(make_cell(c) for _ in range(space.cells_per_stage))
        self.cells = nnx.List(cells)
        self.lastact = batch_norm(c, rngs)
        self.classifier = nnx.Linear(c, space.num_classes, rngs=rngs)

    def _forward(self, x: jax.Array, run_cell: Callable) -> jax.Array:
        x = self.stem_bn(self.stem_conv(x))
        for cell in self.cells:
            x = cell(x) if isinstance(cell, ResidualReduction) else run_cell(cell, x)
        return self.classifier(global_average_pool(nnx.relu(self.lastact(x))))


class NB201Network(_Macro):
    """The standalone network of one cell (``TinyNetwork``)."""

    def __init__(self, space: NB201Space, config: NB201Config, *, rngs: nnx.Rngs):
        super().__init__(space, lambda c: Cell(config, c, rngs=rngs), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self._forward(x, lambda cell, h: cell(h))


class NB201Supernet(_Macro):
    """The weight-sharing supernet of every cell; called with its op choice (``SuperCell``)."""

    def __init__(self, space: NB201Space, *, rngs: nnx.Rngs):
        super().__init__(space, lambda c: SuperCell(c, rngs=rngs), rngs=rngs)

    def __call__(self, x: jax.Array, ops: jax.Array) -> jax.Array:
        return self._forward(x, lambda cell, h: cell(h, ops))


def op_weights(config: NB201Config) -> np.ndarray:
    """The (6, 5) one-hot op weights that select ``config`` in the supernet."""
    return np.eye(len(OPS), dtype=np.float32)[list(op_indices(config))]


def op_indices(config: NB201Config) -> np.ndarray:
    """The (6,) op index per edge (in ``OPS``) that runs only ``config``'s ops in the supernet."""
    return np.asarray(config.op_indices(), dtype=np.int32)


def subnet_weights(supernet: dict, config: NB201Config) -> dict:
    """The standalone network's weights (``nnx.to_pure_dict`` layout) taken from the
    supernet's: each conv edge keeps the weights of its chosen op."""
    out = {name: value for name, value in supernet.items() if name != "cells"}
    cells = {}
    for index, cell in supernet["cells"].items():
        if "conv_a" in cell:  # a residual reduction block
            cells[index] = cell
            continue
        layers = {str(edge): cell["conv1x1" if op == "nor_conv_1x1" else "conv3x3"][edge]
                  for edge, op in enumerate(config.ops) if op in CONV_KERNELS}
        if layers:  # a cell of skips, pools and zeros has no weights
            cells[index] = {"layers": layers}
    out["cells"] = cells
    return out
