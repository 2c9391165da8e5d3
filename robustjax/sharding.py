"""How robustjax's programs meet a caller's sharding: explicit mesh axes and ``shard_map``.

Two modes of JAX sharding need care from a library whose functions run inside other
people's programs:

- **Explicit axes** (``jax.make_mesh``'s default axis type): every operation must say how
  its output is sharded, and reshapes, gathers and tilings of a batch-sharded array often
  cannot. :func:`auto_axes_over_batch` runs a function with the batch's explicit axes
  treated as ``Auto`` (XLA's sharding propagation, ``jax.sharding.auto_axes``), and shards
  its outputs over the batch as the input was.
- **``shard_map`` with ``check_vma=True``** (the default): a loop's carry and a ``cond``'s
  branches must vary over the same manual axes. A carry built from constants (a fresh
  ``done`` mask) does not vary, while the body's output, computed from the images, does.
  :func:`varying_like` casts such values to vary as the images do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
from jax.sharding import AxisType, PartitionSpec


def varying_like(tree, *like: jax.Array):
    """``tree`` with every leaf made to vary over the manual axes any of ``like`` varies over.

    Outside ``shard_map`` (or with its check off) nothing varies and ``tree`` is returned
    as it is.
    """
    axes = frozenset().union(*map(_varying_axes, like))
    if not axes:
        return tree

    def cast(leaf):
        missing = tuple(sorted(axes - _varying_axes(leaf)))
        return jax.lax.pcast(leaf, missing, to="varying") if missing else leaf

    return jax.tree.map(cast, tree)


def skip_unless(needed, fn: Callable, skip: Callable, operand):
    """``fn(operand)`` when ``needed``, else the cheap ``skip(operand)`` (``lax.cond``).

    Inside ``shard_map`` with its varying-axes check, ``fn`` always runs: JAX (0.10) turns
    a ``cond`` under ``vmap`` into a select over both branches whose constants it makes
    varying, and a model's constants (its normalisation) then fail the check. Under
    ``vmap`` both branches run anyway, so only a shard whose examples are all done loses
    the saving.
    """
    if _varying_axes(operand):
        return fn(operand)
    return jax.lax.cond(needed, fn, skip, operand)


def _varying_axes(value) -> frozenset:
    """The manual mesh axes ``value`` varies over (empty outside ``shard_map``)."""
    manual = getattr(jax.typeof(value), "manual_axis_type", None)
    return frozenset() if manual is None else manual.varying


def auto_axes_over_batch(fn: Callable, batch: jax.Array, *, batch_dim: int | None = 0) -> Callable:
    """``fn`` run with ``batch``'s explicit mesh axes as ``Auto`` axes, when it has any.

    Every output of the returned function is sharded along dimension ``batch_dim`` as
    ``batch`` is along its first dimension, and replicated over the others (all of them
    with ``batch_dim=None``: dataset-level figures). Without explicit axes (no mesh, an
    ``Auto`` mesh, or inside ``shard_map``) ``fn`` is returned.
    """
    sharding = jax.typeof(batch).sharding
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return fn
    explicit = tuple(name for name, kind in zip(mesh.axis_names, mesh.axis_types) if kind == AxisType.Explicit)
    if not explicit:
        return fn
    batch_spec = sharding.spec[0] if sharding.spec else None
    out_spec = PartitionSpec() if batch_dim is None else PartitionSpec(*([None] * batch_dim), batch_spec)

    def run(*args):
        with jax.sharding.use_abstract_mesh(mesh):
            return jax.sharding.auto_axes(fn, axes=explicit, out_sharding=out_spec)(*args)

    return run


def with_auto_axes(fn: Callable) -> Callable:
    """Decorates a jitted body ``fn(batch, ...)`` that reduces a batch to dataset-level
    figures: it runs with the batch's explicit mesh axes as ``Auto`` axes, its results
    replicated. Arguments that are not arrays (static settings) pass through unchanged."""

    @functools.wraps(fn)
    def run(*args):
        positions = [i for i, value in enumerate(args) if isinstance(value, jax.Array)]

        def call(*arrays):
            full = list(args)
            for position, array in zip(positions, arrays):
                full[position] = array
            return fn(*full)

        return auto_axes_over_batch(call, args[positions[0]], batch_dim=None)(*(args[i] for i in positions))

    return run
