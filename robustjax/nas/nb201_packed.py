"""NAS-Bench-201 subnets packed by op (:mod:`~robustjax.nas.packing`): the networks that
choose the same op on an edge send their examples through it together.

:class:`PackedChoice` carries each network's op indices and, as static data, how many
networks take each op on each edge (the population's *signature*: populations with equal
signatures share one compiled program). :func:`packed_edge` is an edge's op with its
network's batch norm; :func:`packing_order` orders cells so that populations share a
signature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from robustjax.nas.nb201 import EDGES, OPS, NB201Config
from robustjax.nas.packing import PackedChoices, packed_op
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.resnet_layers import BATCH_NORM_EPSILON

Signature = tuple[tuple[int, ...], ...]  # per edge, the networks taking each op (in OPS order)


@jax.tree_util.register_pytree_node_class
class PackedChoice(PackedChoices):
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


def packed_edge(counts: tuple[int, ...]) -> Callable:
    """``edge(x, op, kernels, norms)``: op ``OPS[op]`` of an edge on examples ``x``, with the
    edge's shared (1x1, 3x3) ``kernels`` and their batch norms' (scale, bias, mean, var)
    ``norms``; under ``vmap`` over a population whose ``counts[k]`` networks take op ``k``,
    each op runs once on its group's examples (``packing.packed_op``)."""
    return packed_op(_FORWARD, counts)
