"""NAS-Bench-201 subnets packed by op: exact work per network in one vmapped program.

Under ``jax.vmap`` over the networks of a population, an edge that takes its op as data
(``lax.switch`` on a per-network index) computes every op on every example and selects.
Subnets of one supernet share its weights, so the networks that choose the same op on an
edge can instead send their examples through that op together, as one larger batch: each
example then meets only its own network's op, as in the network alone, and the convolutions
run on batches as large as the op's group.

:class:`PackedChoice` carries each network's op indices and, as static data, how many
networks take each op on each edge (the population's *signature*: populations with equal
signatures share one compiled program). :func:`packed_edge` is an edge's op (with its
network's batch norm) whose batching rule (``jax.custom_batching.custom_vmap``) sorts the
networks by op, runs each op once on its group's examples and puts the results back in
network order. Its
input gradient is packed the same way (``jax.custom_vjp``); gradients with respect to the
supernet's weights are refused (train with one-hot op weights instead). Where the networks
under ``vmap`` are not as many as the signature describes, the rule falls back to a switch
per network, which gives the same values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from robustjax.nas.nb201 import EDGES, OPS, NB201Config
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.resnet_layers import BATCH_NORM_EPSILON

Signature = tuple[tuple[int, ...], ...]  # per edge, the networks taking each op (in OPS order)


@jax.tree_util.register_pytree_node_class
class PackedChoice:
    """Op indices (N, 6) of a population's networks, with its static :data:`Signature`.

    The signature must describe the indices: make one with :meth:`of` and take networks with
    :meth:`select`, never by indexing the leaves: the batching rule trusts it, and a signature
    of other ops would run those ops."""

    def __init__(self, indices, signature: Signature):
        self.indices = indices
        self.signature = signature

    @classmethod
    def of(cls, indices: np.ndarray) -> PackedChoice:
        """The choice of networks whose op indices (in ``OPS``) are the rows of ``indices``."""
        indices = np.asarray(indices, dtype=np.int32)
        if indices.ndim != 2 or indices.shape[1] != len(EDGES):
            raise ValueError(f"packed op indices must be (networks, {len(EDGES)}), got shape {indices.shape}")
        return cls(indices, signature_of(indices))

    def select(self, members: Sequence[int] | np.ndarray) -> PackedChoice:
        """The choice of networks ``members`` (repeats allowed), with their own signature."""
        return PackedChoice.of(np.asarray(self.indices)[np.asarray(members)])

    def tree_flatten(self):
        return (self.indices,), self.signature

    @classmethod
    def tree_unflatten(cls, signature, leaves):
        return cls(leaves[0], signature)

    def __repr__(self) -> str:
        return f"PackedChoice(networks={sum(self.signature[0])}, signature={self.signature})"


def signature_of(indices: np.ndarray) -> Signature:
    """Per edge, how many rows of the (N, 6) op ``indices`` take each op."""
    indices = np.asarray(indices)
    return tuple(tuple(int(n) for n in np.bincount(indices[:, edge], minlength=len(OPS))) for edge in range(len(EDGES)))


def packing_order(configs: Sequence, population_size: int) -> list:
    """``configs`` (NAS-Bench-201 cells) reordered so that consecutive populations of
    ``population_size`` share one signature, so one compiled program, where the cells allow.

    With ``5^k`` the largest power of five (k <= 6) dividing ``population_size``, cells are
    grouped by their coset of the subgroup ``H = {(a, s, ..., s) : a in Z5^k, s = sum(a)}``
    of Z5^6 (op indices mod 5): every coset holds, on each edge, each op ``5^(k-1)`` times,
    so populations of whole cosets all have the signature ``population_size / 5`` per op and
    edge. All 15,625 cells split into whole cosets; of a subset, the whole cosets among it
    come first (in the order they first appear), then the rest in the given order."""
    if isinstance(population_size, bool) or not isinstance(population_size, int) or population_size < 1:
        raise ValueError(f"population_size must be an integer >= 1, got {population_size!r}")
    if not all(isinstance(config, NB201Config) for config in configs):
        raise TypeError("packing_order orders NAS-Bench-201 cells (NB201Config); resolve ids with space.resolve")
    k = 0
    while k < len(EDGES) and population_size % 5 ** (k + 1) == 0:
        k += 1

    def coset(config) -> tuple[int, ...]:
        ops = np.asarray(config.op_indices())
        return tuple((ops[k:] - ops[:k].sum()) % 5)

    cosets: dict[tuple[int, ...], list] = {}
    for config in configs:
        cosets.setdefault(coset(config), []).append(config)
    whole = {key for key, members in cosets.items() if len(members) == 5 ** k}
    return ([config for key, members in cosets.items() if key in whole for config in members]
            + [config for config in configs if coset(config) not in whole])


def avg_pool_3x3(x: jax.Array) -> jax.Array:
    """3x3 average pooling, stride 1, padding 1, padded cells not counted
    (``nn.AvgPool2d(3, 1, 1, count_include_pad=False)``)."""
    def window_sum(v):
        return jax.lax.reduce_window(v, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))

    counts = window_sum(jnp.ones((1, *x.shape[1:3], 1), x.dtype))  # small, unlike a count over x's shape
    return window_sum(x) / counts


def _relu_conv_bn(x: jax.Array, kernel: jax.Array, norm: tuple) -> jax.Array:
    """``ReLUConvBN`` in eval mode on ``x`` (networks, examples, H, W, C): ReLU, the bias-free
    stride-1 same-size convolution, then batch norm with each network's statistics
    ``norm`` = (scale, bias, mean, var), each (networks, C)."""
    pad = kernel.shape[0] // 2
    y = conv_general_dilated(jax.nn.relu(x.reshape(-1, *x.shape[2:])), kernel, (1, 1), ((pad, pad), (pad, pad)),
                             dimension_numbers=("NHWC", "HWIO", "NHWC")).reshape(x.shape)
    scale, bias, mean, var = (v[:, None, None, None, :] for v in norm)
    return (y - mean) * (jax.lax.rsqrt(var + BATCH_NORM_EPSILON) * scale) + bias


# Each op of OPS on (networks, examples, H, W, C), given the edge's (1x1, 3x3) kernels and
# their batch norms' per-network (scale, bias, mean, var).
_FORWARD: tuple[Callable, ...] = (
    lambda kernels, norms, x: jnp.zeros_like(x),
    lambda kernels, norms, x: x,
    lambda kernels, norms, x: _relu_conv_bn(x, kernels[0], norms[0]),
    lambda kernels, norms, x: _relu_conv_bn(x, kernels[1], norms[1]),
    lambda kernels, norms, x: avg_pool_3x3(x.reshape(-1, *x.shape[2:])).reshape(x.shape),
)
# The input gradient of each op: (kernels, norms, x, cotangent) -> cotangent of x.
_BACKWARD: tuple[Callable, ...] = tuple(
    (lambda op: lambda kernels, norms, x, g: jax.vjp(lambda v: op(kernels, norms, v), x)[1](g)[0])(op)
    for op in _FORWARD)


def _grouped(branches: tuple[Callable, ...], counts: tuple[int, ...]) -> Callable:
    """``f(op, kernels, norms, *arrays) = branches[op](kernels, norms, *arrays)`` for one
    network, whose arrays' leading axis is the examples', batched over networks by grouping
    them by op: ``counts[k]`` networks take op ``k``. ``kernels`` are shared; ``norms`` may
    be per network."""
    def switch(op, kernels, norms, *arrays):
        one = jax.lax.switch(op, branches, kernels, jax.tree.map(lambda v: v[None], norms), *[a[None] for a in arrays])
        return one[0]

    grouped = jax.custom_batching.custom_vmap(switch)

    @grouped.def_vmap
    def rule(networks: int, batched, op, kernels, norms, *arrays):
        op_batched, kernels_batched, norms_batched, *arrays_batched = batched
        if any(jax.tree.leaves(kernels_batched)):  # weights per network: nothing is shared
            return _per_network(switch, batched, op, kernels, norms, *arrays), True
        arrays = [a if b else jnp.broadcast_to(a, (networks, *a.shape)) for a, b in zip(arrays, arrays_batched)]
        batched = (op_batched, kernels_batched, norms_batched, *[True] * len(arrays))
        if not op_batched:  # an inner vmap (restarts, an epsilon grid): its axis joins the examples
            if any(jax.tree.leaves(norms_batched)):
                return _per_network(switch, batched, op, kernels, norms, *arrays), True
            out = grouped(op, kernels, norms, *[a.reshape(-1, *a.shape[2:]) for a in arrays])
            return out.reshape(networks, -1, *out.shape[1:]), True
        if networks != sum(counts):  # not the population the signature describes
            return _per_network(switch, batched, op, kernels, norms, *arrays), True
        norms = jax.tree.map(lambda v, b: v if b else jnp.broadcast_to(v, (networks, *v.shape)), norms, norms_batched)
        order = jnp.argsort(op, stable=True)  # networks by op: op k's group is a static slice
        arrays, norms = [a[order] for a in arrays], jax.tree.map(lambda v: v[order], norms)
        parts, start = [], 0
        for index, count in enumerate(counts):
            if count:
                part = slice(start, start + count)
                parts.append(branches[index](kernels, jax.tree.map(lambda v: v[part], norms), *[a[part] for a in arrays]))
                start += count
        return jnp.concatenate(parts)[jnp.argsort(order)], True

    return grouped


def _per_network(switch: Callable, batched, op, kernels, norms, *arrays) -> jax.Array:
    """``switch`` vmapped over the batched arguments (the unpacked fallback)."""
    axes = jax.tree.map(lambda b: 0 if b else None, batched)
    return jax.vmap(switch, in_axes=tuple(axes))(op, kernels, norms, *arrays)


@functools.cache
def packed_edge(counts: tuple[int, ...]) -> Callable:
    """``edge(x, op, kernels, norms)``: op ``OPS[op]`` of an edge on examples ``x``, with the
    edge's shared (1x1, 3x3) ``kernels`` and their batch norms' (scale, bias, mean, var)
    ``norms``; under ``vmap`` over a population whose ``counts[k]`` networks take op ``k``,
    each op runs once on its group's examples."""
    forward, backward = _grouped(_FORWARD, counts), _grouped(_BACKWARD, counts)

    @jax.custom_vjp
    def edge(x, op, kernels, norms):
        return forward(op, kernels, norms, x)

    def edge_forward(x, op, kernels, norms):
        if any(v.perturbed for v in jax.tree.leaves((kernels, norms))):
            raise TypeError("a packed population (layout 'packed') gives no gradient with respect to the supernet's "
                            "weights; train or recalibrate through one-hot op weights (nas.from_supernet without "
                            "packed=True)")
        x, op, kernels, norms = jax.tree.map(lambda v: v.value, (x, op, kernels, norms))
        return forward(op, kernels, norms, x), (x, op, kernels, norms)

    def edge_backward(residuals, g):
        x, op, kernels, norms = residuals
        if isinstance(g, jax.custom_derivatives.SymbolicZero):
            gx = jnp.zeros_like(x)
        else:
            gx = backward(op, kernels, norms, x, g)
        return gx, None, *jax.tree.map(jnp.zeros_like, (kernels, norms))

    edge.defvjp(edge_forward, edge_backward, symbolic_zeros=True)
    return edge
