"""Weight-shared subnets packed by choice: exact work per network in one vmapped program.

Under ``jax.vmap`` over the networks of a population, a layer that takes its choice as data
(``lax.switch`` on a per-network index) computes every branch on every example and selects.
Subnets of one supernet share its weights, so the networks that make the same choice at a
layer (an NB201 edge's op, a BigNAS block's shape) can instead send their examples through
that branch together, as one larger batch: each example then meets only its own network's
branch, as in the network alone.

:func:`packed_op` is such a layer. Which networks take which branch is the population's
static *signature* (populations with equal signatures share one compiled program); the
batching rule (``jax.custom_batching.custom_vmap``) sorts the networks by branch, runs each
branch once on its group's examples and puts the results back in network order. Its input
gradient is packed the same way (``jax.custom_vjp``); gradients with respect to the shared
weights are refused. Where the networks under ``vmap`` are not as many as the signature
describes, or the weights differ per network, the rule falls back to a switch per network,
which gives the same values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp


class PackedChoices:
    """Base of a space's packed choice (a pytree whose signature is static): ``select``
    gives the choice of some of its networks, with their own signature."""

    def select(self, members) -> PackedChoices:
        raise NotImplementedError


def _grouped(branches: tuple[Callable, ...], counts: tuple[int, ...]) -> Callable:
    """``f(group, shared, own, *arrays) = branches[group](shared, own, *arrays)`` for one
    network, whose arrays' leading axis is the examples', batched over networks by grouping
    them: ``counts[k]`` networks take branch ``k``. Each branch takes its arrays and ``own``
    with a leading axis of networks. ``shared`` is the same for every network; ``own``
    (e.g. batch-norm statistics) may be per network."""
    def switch(group, shared, own, *arrays):
        one = jax.lax.switch(group, branches, shared, jax.tree.map(lambda v: v[None], own), *[a[None] for a in arrays])
        return one[0]

    grouped = jax.custom_batching.custom_vmap(switch)

    @grouped.def_vmap
    def rule(networks: int, batched, group, shared, own, *arrays):
        group_batched, shared_batched, own_batched, *arrays_batched = batched
        if any(jax.tree.leaves(shared_batched)):  # weights per network: nothing is shared
            return _per_network(switch, batched, group, shared, own, *arrays), True
        arrays = [a if b else jnp.broadcast_to(a, (networks, *a.shape)) for a, b in zip(arrays, arrays_batched)]
        batched = (group_batched, shared_batched, own_batched, *[True] * len(arrays))
        if not group_batched:  # an inner vmap (restarts, an epsilon grid): its axis joins the examples
            if any(jax.tree.leaves(own_batched)):
                return _per_network(switch, batched, group, shared, own, *arrays), True
            out = grouped(group, shared, own, *[a.reshape(-1, *a.shape[2:]) for a in arrays])
            return out.reshape(networks, -1, *out.shape[1:]), True
        if networks != sum(counts):  # not the population the signature describes
            return _per_network(switch, batched, group, shared, own, *arrays), True
        own = jax.tree.map(lambda v, b: v if b else jnp.broadcast_to(v, (networks, *v.shape)), own, own_batched)
        order = jnp.argsort(group, stable=True)  # networks by branch: branch k's group is a static slice
        arrays, own = [a[order] for a in arrays], jax.tree.map(lambda v: v[order], own)
        parts, start = [], 0
        for index, count in enumerate(counts):
            if count:
                part = slice(start, start + count)
                parts.append(branches[index](shared, jax.tree.map(lambda v: v[part], own), *[a[part] for a in arrays]))
                start += count
        return jnp.concatenate(parts)[jnp.argsort(order)], True

    return grouped


def _per_network(switch: Callable, batched, group, shared, own, *arrays) -> jax.Array:
    """``switch`` vmapped over the batched arguments (the unpacked fallback)."""
    axes = jax.tree.map(lambda b: 0 if b else None, batched)
    return jax.vmap(switch, in_axes=tuple(axes))(group, shared, own, *arrays)


def _input_gradient(branch: Callable) -> Callable:
    """``(shared, own, x, cotangent) -> cotangent of x`` of ``branch(shared, own, x)``."""
    return lambda shared, own, x, g: jax.vjp(lambda v: branch(shared, own, v), x)[1](g)[0]


@functools.cache
def packed_op(branches: tuple[Callable, ...], counts: tuple[int, ...]) -> Callable:
    """``op(x, group, shared, own)``: ``branches[group](shared, own, x)`` on one network's
    examples ``x``, each branch taking ``x`` and ``own`` with a leading axis of networks and
    giving one output shape; under ``vmap`` over a population whose ``counts[k]`` networks
    take branch ``k``, each branch runs once on its group's examples. ``branches`` must be
    the same objects for the same choices (the result is cached on them)."""
    forward = _grouped(branches, counts)
    backward = _grouped(tuple(_input_gradient(branch) for branch in branches), counts)

    @jax.custom_vjp
    def op(x, group, shared, own):
        return forward(group, shared, own, x)

    def op_forward(x, group, shared, own):
        if any(v.perturbed for v in jax.tree.leaves((shared, own))):
            raise TypeError("a packed population (layout 'packed') gives no gradient with respect to the supernet's "
                            "weights; train or recalibrate through the supernet's own choice arrays "
                            "(nas.from_supernet without packed=True)")
        x, group, shared, own = jax.tree.map(lambda v: v.value, (x, group, shared, own))
        return forward(group, shared, own, x), (x, group, shared, own)

    def op_backward(residuals, g):
        x, group, shared, own = residuals
        if isinstance(g, jax.custom_derivatives.SymbolicZero):
            gx = jnp.zeros_like(x)
        else:
            gx = backward(group, shared, own, x, g)
        return gx, None, *jax.tree.map(jnp.zeros_like, (shared, own))

    op.defvjp(op_forward, op_backward, symbolic_zeros=True)
    return op
