"""A per-example loop whose batch shrinks, inside one program, as examples finish.

``lax.while_loop`` over a batch runs until its slowest example is done, and every iteration
computes every example, finished or not. :func:`while_pending` runs the same iterations on
a ladder of batch sizes (the batch, then halves down to ``smallest``): once the examples
still pending fit in the next size, they are gathered into it and the loop goes on there,
and each size's results are scattered back when it leaves. The work is at most about twice
what each example needs on its own (against the batch times the slowest example's
iterations), the shapes are static, and the function stays pure: it can be jitted, vmapped,
sharded and run inside ``shard_map`` like the plain loop. Each size of the ladder is one
more copy of the loop's body in the program.

The loop must treat examples independently (an example's step reads only its own rows, as
a model in inference mode does) and leave a finished example as it is: a finished example
may still be stepped while others of its size are pending.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from robustjax.checks import check_positive_int
from robustjax.sharding import varying_like

State = Any  # a pytree of arrays whose leading axis is the batch


def halving_sizes(batch: int, smallest: int = 16) -> tuple[int, ...]:
    """``batch``, then halves of it (rounded up) while they stay at least ``smallest``."""
    check_positive_int(batch, "batch")
    check_positive_int(smallest, "smallest")
    sizes = [batch]
    while -(-sizes[-1] // 2) >= smallest:
        sizes.append(-(-sizes[-1] // 2))
    return tuple(sizes)


def while_pending(step: Callable[[jax.Array, State, State], State], pending: Callable[[State], jax.Array],
                  state: State, inputs: State, limit: int, *, smallest: int = 16) -> State:
    """Runs ``state = step(i, state, inputs)`` for i = 0, 1, ... while ``i < limit`` and
    some example is ``pending(state)`` (a boolean per example), computing at each iteration
    only the smallest size of :func:`halving_sizes` that holds the pending examples.

    ``state`` (carried) and ``inputs`` (read only) are pytrees of per-example arrays with
    the batch as leading axis; ``step`` maps a batch of them to its next state. The result
    equals the plain loop's up to the model's rounding on batches of another size.
    """
    leaves = jax.tree.leaves(inputs)
    if not leaves or jnp.ndim(leaves[0]) == 0:
        raise ValueError("inputs must hold arrays with the batch as leading axis, got no batched array")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
    batch = leaves[0].shape[0]
    sizes = halving_sizes(batch, smallest)
    state = varying_like(state, *jax.tree.leaves(inputs))  # inside shard_map: per shard, as the inputs
    index = jnp.int32(0)
    for level, size in enumerate(sizes):
        leave_at = sizes[level + 1] if level + 1 < len(sizes) else 0
        if level == 0:
            rows = jnp.arange(batch)
        else:  # the pending examples first; rows past the batch are fillers, dropped on write-back
            rows = jnp.nonzero(pending(state), size=size, fill_value=batch)[0]
        real = rows < batch
        part, part_inputs = (jax.tree.map(lambda leaf: jnp.take(leaf, rows, axis=0, mode="clip"), tree)
                             for tree in (state, inputs))

        def more(carry, real=real, leave_at=leave_at):
            i, part = carry
            return (i < limit) & (jnp.sum(pending(part) & real) > leave_at)

        def body(carry, part_inputs=part_inputs):
            i, part = carry
            return i + 1, step(i, part, part_inputs)

        index, part = jax.lax.while_loop(more, body, (index, part))
        state = jax.tree.map(lambda whole, new, rows=rows: whole.at[rows].set(new, mode="drop"), state, part)
    return state
