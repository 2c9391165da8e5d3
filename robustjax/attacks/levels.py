"""Thresholds found by binary search over float32 bit patterns, instead of sorting.

Several projections need, per row, the threshold at which a monotone piecewise-linear sum
crosses a budget (FAB's hyperplane-box projection, the l1-box projection, a top-k
threshold). Sorting the kinks finds it exactly, but XLA's sort is slow on the CPU (sorting
120 rows of 64 values takes about 1 ms, 32 rows of 3,072 about 30 ms, on 2 cores).
Non-negative float32 values are ordered as their bit patterns read as integers, so 31
halvings of the integer range find the smallest float32 at which a monotone condition
holds, each one O(d): 10-15x faster there, and as exact as float32 allows.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from robustjax.sharding import varying_like

_INF_BITS = 0x7F800000  # the bit pattern of float32 +inf; finite non-negative values lie below


def smallest_level(holds: Callable[[Float[Array, " n"]], Bool[Array, " n"]], *operands: Array) -> Float[Array, " n"]:
    """Per row, the smallest float32 ``t >= 0`` with ``holds(t)`` true (``inf`` when none is).

    ``holds`` maps one candidate per row to a boolean per row and must be monotone: once
    true, true for every larger ``t``. It is never called with ``inf``. ``operands`` are
    the arrays ``holds`` reads, rows first (inside ``shard_map`` the search varies as they do).
    """
    rows = operands[0].shape[0]

    def halve(_, bounds):
        low, high = bounds  # holds at high (or high is inf), and not just below low
        middle = low + (high - low) // 2
        ok = holds(jax.lax.bitcast_convert_type(middle, jnp.float32))
        return jnp.where(ok, low, middle + 1), jnp.where(ok, middle, high)

    bounds = varying_like((jnp.zeros((rows,), jnp.int32), jnp.full((rows,), _INF_BITS, jnp.int32)), *operands)
    _, high = jax.lax.fori_loop(0, 31, halve, bounds)
    return jax.lax.bitcast_convert_type(high, jnp.float32)
