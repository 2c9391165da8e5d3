"""The protocol every streaming accumulator of :mod:`robustjax.metrics` follows, and the
sum-over-count accumulator most of them share.

An accumulator is an immutable pytree (a ``flax.struct.dataclass``) whose array leaves are
the running state and whose settings are static metadata, so one accumulator is a valid
``jax.jit`` argument and ``lax.scan`` carry, and a stack of them (one per network) maps
under ``jax.vmap``::

    def step(acc, batch):
        return acc.update(*batch), None

    acc, _ = jax.lax.scan(step, Accuracy.empty(), (logits, labels))  # leading axis: batches
    acc.compute()  # {"accuracy": ...}

Every metric name a ``compute`` returns has its direction in ``robustjax.metrics.DIRECTIONS``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Protocol, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float, Int

from robustjax.checks import concrete_values

setting = functools.partial(struct.field, pytree_node=False)
"""A static field of an accumulator: a setting fixed by ``empty`` (part of the tree structure)."""


A = TypeVar("A", bound="Accumulator")


@runtime_checkable
class Accumulator(Protocol):
    """A dataset-level metric streamed over batches.

    - ``Acc.empty(**settings)`` fixes every setting (bins, beta, k, capacity,
      ``toolkit_compat``, layer widths, bounds, ...); ``update``, ``merge`` and ``compute``
      take none.
    - ``acc.update(*arrays)`` takes one batch of data and returns an accumulator of the same
      tree structure, shapes and dtypes.
    - ``acc.merge(other)`` combines two accumulators created by the same ``empty`` call
      (batches or devices seen apart) into one of the same fixed size, in any order.
      Buffer-based accumulators have a fixed capacity: ``CalibrationStats`` and ``OODStats``
      count every sample seen (a count above the capacity is an overflow), ``TopKPatterns``
      sets ``overflowed``; ``compute`` then raises on concrete values and returns NaN
      inside a trace.
    - ``acc.compute()`` returns ``{metric name: jax.Array}``; a metric the data leave
      undefined (no example seen, an empty success set) raises ``ValueError`` on concrete
      values and is NaN inside a trace.
    - Counts are int32 (``count`` is the number of examples in the metric's denominator);
      sums of floats are float32.
    """

    @classmethod
    def empty(cls: type[A], **settings) -> A: ...

    def update(self: A, *arrays) -> A: ...

    def merge(self: A, other: A) -> A: ...

    def compute(self) -> dict[str, jax.Array]: ...


def batch_count(values: jax.Array | np.ndarray) -> jax.Array:
    """The number of examples in a batch (its leading axis), as an int32 count."""
    return jnp.asarray(values.shape[0], jnp.int32)


def _settings(acc) -> dict:
    return {f.name: getattr(acc, f.name) for f in dataclasses.fields(acc) if not f.metadata.get("pytree_node", True)}


def check_mergeable(acc, other) -> None:
    """``acc`` and ``other`` must be accumulators of one type, with the same settings and shapes."""
    if type(other) is not type(acc):
        raise TypeError(f"cannot merge {type(acc).__name__} with {type(other).__name__}")
    name = type(acc).__name__
    if (mine := _settings(acc)) != (theirs := _settings(other)):
        raise ValueError(f"cannot merge {name} with different settings: {mine} and {theirs}")
    shapes = [[leaf.shape for leaf in jax.tree.leaves(a)] for a in (acc, other)]
    if jax.tree.structure(acc) != jax.tree.structure(other) or shapes[0] != shapes[1]:
        raise ValueError(f"cannot merge {name} of different sizes (array shapes {shapes[0]} and {shapes[1]}); "
                         "create both with the same empty(...) arguments")


def divide(numerator: jax.Array, denominator: jax.Array, metric: str, reason: str) -> jax.Array:
    """``numerator / denominator``, refusing (on the host) an empty denominator; NaN when traced."""
    values = concrete_values(denominator)
    if values is not None and not (values > 0).all():
        raise ValueError(f"{metric} is undefined: {reason}")
    return numerator / denominator


@struct.dataclass
class Ratio:
    """A dataset-level metric ``total / count``: a sum of per-example terms over a set of
    examples and the size of that set.

    Subclasses name their metric (``metric``), define ``update`` and, when the terms are
    themselves counts, take an int32 ``total``. Both leaves are plain sums, so accumulators
    of different batches or devices also combine with ``psum``.
    """

    total: Float[Array, "..."] | Int[Array, "..."]
    count: Int[Array, "..."]

    metric: ClassVar[str]
    total_dtype: ClassVar = jnp.float32
    total_shape: ClassVar[tuple[int, ...]] = ()
    empty_reason: ClassVar[str] = "no examples were seen"

    @classmethod
    def empty(cls, **settings) -> Ratio:
        return cls(jnp.zeros(cls.total_shape, cls.total_dtype), jnp.zeros((), jnp.int32), **settings)

    def merge(self, other: Ratio) -> Ratio:
        check_mergeable(self, other)
        return self.add(other.total, other.count)

    def ratio(self) -> jax.Array:
        """``total / count``; raises on concrete values when ``count`` is 0 (NaN when traced)."""
        return divide(self.total, self.count, type(self).__name__, self.empty_reason)

    def compute(self) -> dict[str, jax.Array]:
        return {self.metric: self.ratio()}

    def add(self, total: jax.Array, count: jax.Array) -> Ratio:
        """The accumulator with a batch's sum of terms and count added."""
        return self.replace(total=self.total + total, count=self.count + count)
