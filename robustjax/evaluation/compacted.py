"""An attack on a population that spends compute only on the examples still being attacked.

In one program (``evaluation.items``), every network of a population computes every
iteration of an attack on every example, the ones it has fooled already included (they are
masked). For an attack whose examples finish early (a
:class:`~robustjax.attacks.compaction.Segmented` attack with early stop),
:func:`population_attack` runs the loop segment by segment, as
:func:`~robustjax.attacks.compaction.run_compacted` does for one network: between segments,
each network's examples still active move into a working batch whose size, from the ladder
of :func:`~robustjax.attacks.compaction.bucket`, holds the most any network has left (the
networks share one program, so one size), and a network with none left skips the segment.

Each example keeps its own state and the random start is drawn on the whole batch before any
compaction, so each network gets the result of the one-program run, up to the model's
floating-point rounding on batches of another size.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from robustjax.attacks.base import Attack, AttackResult, split_traceable, with_traced_fields
from robustjax.attacks.compaction import (
    Segmented,
    bucket,
    compacts,
    on_one_device,
    scatter_examples,
    take_examples,
    write_back,
)
from robustjax.classifier import Classifier
from robustjax.fast_conv import with_fast_convolutions
from robustjax.nas.packing import PackedChoices
from robustjax.nas.population import over_networks


def compactable(attack: Attack, classifier: Classifier, x: jax.Array) -> bool:
    """Whether :func:`population_attack` runs ``attack`` on the population ``classifier``: a
    :class:`Segmented` attack that gains from compaction, a batch on one device, and not a
    packed population (whose networks share each op's examples, ``nas.packing``)."""
    packed = any(isinstance(leaf, PackedChoices) for leaf in
                 jax.tree.leaves(classifier.params, is_leaf=lambda leaf: isinstance(leaf, PackedChoices)))
    return isinstance(attack, Segmented) and compacts(attack, classifier) and on_one_device(classifier, x) and not packed


def population_attack(attack: Segmented, axes: Any, sequential: bool, classifier: Classifier, x: jax.Array,
                      y: jax.Array, key: jax.Array) -> AttackResult:
    """``attack`` on every network of the population ``classifier`` (its params' network
    axes ``axes``; ``sequential`` as in ``nas.population.over_networks``), same key, run
    compacted: each leaf of the result has a leading network axis. Refuses a population or
    attack that :func:`compactable` does not accept."""
    if not compactable(attack, classifier, x):
        raise ValueError(f"{type(attack).__name__} on this population cannot run compacted: it needs a Segmented "
                         "attack with early stop, a deterministic classifier, arrays on one device and a population "
                         "that is not packed (run the one program, evaluation.items)")
    static, fields = split_traceable(attack)
    batch = x.shape[0]
    state = _start(static, axes, sequential, fields, classifier, x, y, key)
    active = np.asarray(_active(static, fields, state))
    # The working batch: network n's examples at rows[n], its first count[n] real, the rest repeats.
    rows, count = np.broadcast_to(np.arange(batch), active.shape), np.full(active.shape[0], batch)
    work, inputs = state, _examples((x, y), rows)
    while (running := _live(active, count)).any():
        live = [r[:c][a[:c]] for r, c, a in zip(rows, count, active)]
        if (size := bucket(max(part.size for part in live), batch)) < rows.shape[1]:
            state = _scatter(state, work, _write_back(rows, count, batch))
            rows = np.stack([np.resize(part, size) if part.size else np.zeros(size, int) for part in live])
            count = np.array([part.size for part in live])
            work, inputs = _take(state, rows), _examples((x, y), rows)
        work, active = _advance(static, axes, sequential, fields, classifier, *inputs, work, running)
        active = np.asarray(active)
    state = _scatter(state, work, _write_back(rows, count, batch))
    return _finish(static, axes, sequential, fields, classifier, x, y, state)


def _live(active: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per network, whether any of its real rows is still active."""
    return (active & (np.arange(active.shape[1]) < count[:, None])).any(axis=1)


def _write_back(rows: np.ndarray, count: np.ndarray, batch: int) -> np.ndarray:
    """Per network, where each row of its working batch goes in the whole one (``compaction.write_back``)."""
    return np.stack([write_back(r, c, batch) for r, c in zip(rows, count)])


# Per network: its state's examples at its rows, the evaluated batch's at its rows, and its
# working batch written back into its state (``attacks.compaction``'s, mapped over networks).
_take = jax.jit(jax.vmap(take_examples))
_examples = jax.jit(jax.vmap(take_examples, in_axes=(None, 0)))
_scatter = jax.jit(jax.vmap(scatter_examples))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _start(attack: Segmented, axes, sequential: bool, fields, classifier: Classifier, x, y, key):
    attack = with_traced_fields(attack, **fields)
    return over_networks(lambda p: attack.start(with_fast_convolutions(classifier.replace(params=p)), x, y, key, None),
                         classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=0)
def _active(attack: Segmented, fields, state) -> jax.Array:
    return jax.vmap(with_traced_fields(attack, **fields).active)(state)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _advance(attack: Segmented, axes, sequential: bool, fields, classifier: Classifier, x, y, state, running):
    """One segment for every network that has examples running (the others keep their
    state), and which examples are active after it."""
    attack = with_traced_fields(attack, **fields)

    def one(args):
        params, x, y, state, running = args
        network = with_fast_convolutions(classifier.replace(params=params))
        state = jax.lax.cond(running, lambda s: attack.advance(network, x, y, None, s), lambda s: s, state)
        return state, attack.active(state)

    return over_networks(one, (classifier.params, x, y, state, running), (axes, 0, 0, 0, 0), sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _finish(attack: Segmented, axes, sequential: bool, fields, classifier: Classifier, x, y, state) -> AttackResult:
    attack = with_traced_fields(attack, **fields)

    def one(args):
        params, state = args
        return attack.finish(with_fast_convolutions(classifier.replace(params=params)), x, y, None, state)

    return over_networks(one, (classifier.params, state), (axes, 0), sequential)
