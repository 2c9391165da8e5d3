"""Iterative attacks that spend compute only on the examples still being attacked.

A batched ``lax`` loop keeps computing for examples that are already finished (they are
masked, so shapes never change). A :class:`Segmented` attack exposes its loop as a state
and a segment of iterations; on concrete arrays, :func:`run_compacted` runs it segment by
segment and, between segments, moves the examples still active into a smaller batch (a
ladder of a few sizes, see :func:`bucket`, each compiled once), as torchattacks' Square and
the AutoAttack authors' code run only the examples not yet fooled. A batch spread over
several devices keeps the one-program run, which XLA spreads over them.

A segment's randomness never depends on which examples share the batch (the score attacks
give each example its own key; PGD's random start is drawn on the whole batch, before any
compaction), so the result equals the one-program run of :meth:`Segmented.run`, up to
the model's floating-point rounding on batches of another size (a few 1e-6 in the logits
on the CPU, which the finite-difference steps of SPSA and NES can magnify to about 1e-5).
A randomized classifier's noise does depend on it, so attacks on one run as one program.

State convention: a pytree whose leaves of rank 0 are shared by all examples (an iteration
counter, the same for every active example) and whose other leaves are per example, with
the batch as leading axis.
"""

from __future__ import annotations

import abc
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool

from robustjax.attacks.base import (
    Attack,
    AttackResult,
    as_arrays,
    split_traceable,
    with_traced_fields,
)
from robustjax.fast_conv import with_fast_convolutions
from robustjax.sharding import varying_like

State = Any


class Segmented(Attack):
    """An attack whose loop can be stopped between segments and resumed on a sub-batch.

    Subclasses define :meth:`start`, :meth:`advance`, :meth:`active` and :meth:`finish`;
    :meth:`run` is then the whole loop in one program, and a call on concrete arrays runs
    it compacted.
    """

    @abc.abstractmethod
    def start(self, classifier, x, y, key, target) -> State:
        """The state before the first iteration."""

    @abc.abstractmethod
    def advance(self, classifier, x, y, target, state: State) -> State:
        """One segment: a fixed number of iterations; inactive examples stay unchanged."""

    @abc.abstractmethod
    def active(self, state: State) -> Bool[Array, " b"]:
        """The examples whose attack goes on."""

    @abc.abstractmethod
    def finish(self, classifier, x, y, target, state: State) -> AttackResult:
        """The result once no example is active."""

    @property
    def compactable(self) -> bool:
        """Whether examples can finish early (otherwise compaction gains nothing)."""
        return True

    def run(self, classifier, x, y, key, target) -> AttackResult:
        state = varying_like(self.start(classifier, x, y, key, target), x)
        state = jax.lax.while_loop(
            lambda s: self.active(s).any(), lambda s: self.advance(classifier, x, y, target, s), state)
        return self.finish(classifier, x, y, target, state)

    def __call__(self, classifier, x, y, *, key: jax.Array | None = None, target=None) -> AttackResult:
        static, fields = split_traceable(self)
        if not compacts(self, classifier) or not on_one_device(classifier, x, y, key, target, fields):
            return super().__call__(classifier, x, y, key=key, target=target)
        self.validate(classifier, x, y, key, target)
        return run_compacted(static, classifier, *as_arrays(x, y, target), key, fields)

    def sweep(self, classifier, x, y, *, key=None, eps=None, restarts=1, target=None) -> AttackResult:
        """As :meth:`Attack.sweep`; on concrete arrays, run as a nested search instead of
        one program.

        The epsilons run in increasing order, and restarts one after the other, each only
        on the examples not yet fooled: an example fooled at some epsilon keeps that point
        for every larger one (it lies in their balls too), so robust accuracy never rises
        with epsilon, and it is charged no further queries. An example keeps its first
        successful restart, or the restart with the lowest margin when none succeeded.
        """
        if not compacts(self, classifier) or not on_one_device(classifier, x, y, key, target, split_traceable(self)[1],
                                                               eps):
            return super().sweep(classifier, x, y, key=key, eps=eps, restarts=restarts, target=target)
        grid = self.check_sweep(classifier, x, y, key, eps, restarts, target)
        return nested_sweep(self, classifier, *as_arrays(x, y, target), key, grid, restarts)


def compacts(attack: Segmented, classifier) -> bool:
    """Whether ``attack`` on ``classifier`` gains from compaction and keeps its result: not
    on a randomized classifier, whose noise draw depends on an example's place in the batch."""
    return attack.compactable and not classifier.is_randomized


def traced(*trees) -> bool:
    """Whether the call is being staged into a program (inside ``jax.jit``, ``lax.scan``,
    ``eval_shape``, where even constants become tracers) or any leaf is a tracer."""
    return isinstance(jnp.zeros(()), jax.core.Tracer) or any(
        isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(trees))


def on_one_device(*trees) -> bool:
    """Whether the call runs eagerly on concrete leaves of which none is spread over
    several devices.

    Sharded batches keep the one-program run, which XLA spreads over their devices.
    """
    if traced(*trees):
        return False
    return all(len(leaf.sharding.device_set) == 1 for leaf in jax.tree.leaves(trees) if isinstance(leaf, jax.Array))


def bucket(count: int, batch: int, factor: int = 2, parts: int = 4) -> int:
    """The smallest batch size of the ladder that holds ``count`` examples: the multiples of
    ``batch / parts`` (rounded up), then ``batch / parts`` divided by ``factor`` again and
    again (rounded up) down to 1. Each size compiles once per program."""
    part = -(-batch // parts)
    if count > part:
        return min(batch, -(-count // part) * part)
    size = part
    while size > 1 and -(-size // factor) >= count:
        size = -(-size // factor)
    return size


def run_compacted(attack: Segmented, classifier, x, y, target, key, fields) -> AttackResult:
    """Runs ``attack`` segment by segment on a working batch that shrinks to the next
    bucket size as soon as the examples still active fit in it.

    ``attack`` and ``fields`` are the two halves of :func:`~robustjax.attacks.base.split_traceable`:
    the programs are compiled for the static config and take the field values as
    arguments, so that new values do not recompile.
    """
    batch = x.shape[0]
    state = _start(attack, fields, classifier, x, y, key, target)
    rows, count = np.arange(batch), batch  # the working batch: examples at rows, the first count real
    inputs, work, active = (x, y, target), state, np.asarray(_active(attack, fields, state))
    while active[:count].any():
        live = rows[:count][active[:count]]
        if (size := bucket(live.size, batch)) < rows.size:
            state = scatter_examples(state, work, write_back(rows, count, batch))
            rows, count = np.resize(live, size), live.size  # repeats fill the bucket
            inputs, work = take_examples((x, y, target), rows), take_examples(state, rows)
        work, active = _advance(attack, fields, classifier, *inputs, work)
        active = np.asarray(active)
    state = scatter_examples(state, work, write_back(rows, count, batch))
    return _finish(attack, fields, classifier, x, y, target, state)


def write_back(rows: np.ndarray, count: int, batch: int) -> np.ndarray:
    """Where each row of the working batch goes in the whole one: out of range (dropped)
    for the repeats that fill the bucket."""
    return np.where(np.arange(rows.size) < count, rows, batch)


def nested_sweep(attack: Segmented, classifier, x, y, target, key, grid: np.ndarray, restarts: int) -> AttackResult:
    """:meth:`Segmented.sweep` on concrete arrays (``grid`` validated, any order)."""
    static, fields = split_traceable(attack)
    keys = jax.random.split(key, restarts)
    batch = x.shape[0]
    x_adv, success = np.array(x)[None].repeat(len(grid), 0), np.zeros((len(grid), batch), bool)
    margin, queries = np.full((len(grid), batch), np.inf, np.float32), np.zeros((len(grid), batch), np.int32)
    previous = None
    for e in np.argsort(grid, kind="stable"):
        if previous is not None:  # fooled points carry over to the larger ball
            carried = success[previous]
            x_adv[e][carried], margin[e][carried], success[e][carried] = x_adv[previous][carried], margin[previous][carried], True
        for restart_key in keys:
            pending = np.flatnonzero(~success[e])
            if not pending.size:
                break
            rows = np.resize(pending, bucket(pending.size, batch))
            result = run_compacted(static, classifier, x[rows], y[rows], None if target is None else target[rows],
                                   restart_key, fields | {"eps": grid[e]})
            result = jax.tree.map(lambda leaf: np.asarray(leaf)[: pending.size], result)
            better = result.success | (result.margin < margin[e][pending])
            chosen = pending[better]
            x_adv[e][chosen], margin[e][chosen] = result.x_adv[better], result.margin[better]
            success[e][chosen] = result.success[better]
            queries[e][pending] += result.queries
        previous = e
    return AttackResult(x_adv=jnp.asarray(x_adv), success=jnp.asarray(success),
                        queries=jnp.asarray(queries), margin=jnp.asarray(margin))


@jax.jit
def take_examples(tree, rows):
    """The per-example leaves of ``tree`` at ``rows``; shared (rank-0) leaves as they are."""
    return jax.tree.map(lambda leaf: leaf if jnp.ndim(leaf) == 0 else leaf[rows], tree)


@functools.partial(jax.jit, static_argnums=0)
def _start(attack: Segmented, fields, classifier, x, y, key, target) -> State:
    return with_traced_fields(attack, **fields).start(with_fast_convolutions(classifier), x, y, key, target)


@functools.partial(jax.jit, static_argnums=0)
def _active(attack: Segmented, fields, state) -> jax.Array:
    return with_traced_fields(attack, **fields).active(state)


@functools.partial(jax.jit, static_argnums=0)
def _advance(attack: Segmented, fields, classifier, x, y, target, state) -> tuple[State, jax.Array]:
    """One segment, and which examples are still active after it."""
    attack = with_traced_fields(attack, **fields)
    state = attack.advance(with_fast_convolutions(classifier), x, y, target, state)
    return state, attack.active(state)


@jax.jit
def scatter_examples(state, part, rows) -> State:
    """``state`` with the examples of ``part`` written back at ``rows`` (rows out of range
    are dropped)."""
    return jax.tree.map(
        lambda whole, new: new if jnp.ndim(whole) == 0 else whole.at[rows].set(new, mode="drop"), state, part)


@functools.partial(jax.jit, static_argnums=0)
def _finish(attack: Segmented, fields, classifier, x, y, target, state) -> AttackResult:
    return with_traced_fields(attack, **fields).finish(with_fast_convolutions(classifier), x, y, target, state)
