"""The shared driver of iterative gradient attacks (PGD, MI-FGSM, ...).

One ``lax.fori_loop`` over the steps; each step evaluates the objective and its gradient
at the current iterate, then moves every example that is still active. With
``early_stop`` an example freezes at its first successful iterate, which is what it
returns: finished examples are masked, so shapes (and the compiled program) never change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from robustjax.losses import attack_cross_entropy, attack_margin

# update(step_index, x_adv, grad, carry) -> (x_next, carry_next)
Update = Callable[[jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def resolve_unroll(unroll: int | bool | None) -> int | bool:
    """``None`` picks the faster loop for the backend: XLA's CPU backend runs an unrolled
    loop faster than a rolled one (see benchmarks/README.md); accelerators do not need it
    and compile faster rolled."""
    if unroll is None:
        return jax.default_backend() == "cpu"
    return unroll


def _per_example(mask: jax.Array, like: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))


def gradient_ascent(
    classifier, x, y, target, x_start, *, steps: int, update: Update, carry: Any,
    early_stop: bool, unroll: int | bool | None, objective=attack_cross_entropy,
) -> tuple[jax.Array, jax.Array]:
    """Runs ``steps`` masked ascent steps from ``x_start`` on ``objective``.

    Returns the final (or first successful) iterates and the per-example number of
    gradient evaluations spent.
    """

    def loss_and_logits(images):
        logits = classifier(images)
        return objective(logits, y, target).sum(), logits

    def step(i, state):
        x_adv, carry, done, queries = state
        grad, logits = jax.grad(loss_and_logits, has_aux=True)(x_adv)
        queries = queries + (~done).astype(jnp.int32)
        if early_stop:
            done = done | (attack_margin(logits, y, target) < 0)
        x_next, carry_next = update(i, x_adv, grad, carry)
        x_adv = jnp.where(_per_example(done, x_adv), x_adv, x_next)
        carry = jax.tree.map(lambda new, old: jnp.where(_per_example(done, new), old, new), carry_next, carry)
        return x_adv, carry, done, queries

    batch = x.shape[0]
    init = (x_start, carry, jnp.zeros(batch, bool), jnp.zeros(batch, jnp.int32))
    x_adv, _, _, queries = jax.lax.fori_loop(0, steps, step, init, unroll=resolve_unroll(unroll))
    return x_adv, queries
