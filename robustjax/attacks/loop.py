"""The shared loop of iterative gradient attacks (PGD, MI-FGSM, ...).

Each step evaluates the objective and its gradient at the current iterate, then moves every
example that is still active. With ``early_stop`` an example freezes at its first
successful iterate, which is what it returns. :meth:`GradientAscent.run` is one
``lax.fori_loop`` over all steps (finished examples masked, so the compiled program never
changes); on concrete arrays the same steps run in segments on the examples not yet
finished (:mod:`robustjax.attacks.compaction`).
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from robustjax.attacks import eot, threat
from robustjax.attacks.base import AttackResult, finalize
from robustjax.attacks.compaction import Segmented
from robustjax.checks import (
    check_choice,
    check_in_interval,
    check_nonnegative_float,
    check_positive_int,
    check_unroll,
)
from robustjax.losses import attack_cross_entropy, attack_margin
from robustjax.sharding import varying_like

# Number of segments the steps are split into when the loop runs compacted.
SEGMENTS = 10


def resolve_unroll(unroll: int | bool | None) -> int | bool:
    """``None`` picks the faster loop for the backend: XLA's CPU backend runs an unrolled
    loop faster than a rolled one (see benchmarks/README.md); accelerators do not need it
    and compile faster rolled."""
    if unroll is None:
        return jax.default_backend() == "cpu"
    return unroll


def _per_example(mask: jax.Array, like: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))


class AscentState(NamedTuple):
    """The loop state: the next step's index (shared), the iterates, the update's carry,
    which examples succeeded, and the gradient evaluations spent per example."""

    step: jax.Array
    x_adv: jax.Array
    carry: Any
    done: jax.Array
    queries: jax.Array


class GradientAscent(Segmented):
    """Masked ascent on :meth:`objective` from :meth:`x_start`, moved by :meth:`update`.

    Subclasses are dataclasses with the fields ``eps``, ``norm``, ``steps``,
    ``step_size``, ``random_start``, ``early_stop``, ``l1_sparsity``, ``eot_samples`` and
    ``unroll``.
    """

    eps: float | jax.Array
    norm: str
    steps: int
    step_size: float | jax.Array | None
    random_start: bool
    early_stop: bool
    l1_sparsity: float
    eot_samples: int
    unroll: int | bool | None

    def check_fields(self) -> None:
        """Validates the fields every subclass shares."""
        check_nonnegative_float(self.eps, "eps", traceable=True)
        check_choice(self.norm, threat.NORMS, "norm")
        check_positive_int(self.steps, "steps")
        if self.step_size is not None:
            check_nonnegative_float(self.step_size, "step_size", traceable=True)
        check_unroll(self.unroll)
        check_in_interval(self.l1_sparsity, "l1_sparsity", 0, 1, closed_high=True)
        eot.check_eot_samples(self.eot_samples)

    def validate(self, classifier, x, y, key, target) -> None:
        super().validate(classifier, x, y, key, target)
        eot.warn_if_deterministic(classifier, self.eot_samples, self.name)

    def x_start(self, key, x) -> jax.Array:
        """The first iterate: uniform in the threat ball with ``random_start``, else ``x``."""
        return threat.random_start(key, x, self.eps, self.norm) if self.random_start else x

    @abc.abstractmethod
    def initial_carry(self, x) -> Any:
        """The update's carry before the first step (per-example leaves)."""

    @abc.abstractmethod
    def update(self, x, step, x_adv, grad, carry) -> tuple[jax.Array, Any]:
        """The next iterate and carry from the gradient at ``x_adv``."""

    def objective(self, logits, y, target) -> jax.Array:
        """Per-example loss the attack ascends."""
        return attack_cross_entropy(logits, y, target)

    @property
    def compactable(self) -> bool:
        return self.early_stop

    def start(self, classifier, x, y, key, target) -> AscentState:
        batch = x.shape[0]
        state = AscentState(step=jnp.zeros((), jnp.int32), x_adv=self.x_start(key, x), carry=self.initial_carry(x),
                            done=jnp.zeros(batch, bool), queries=jnp.zeros(batch, jnp.int32))
        return varying_like(state, x)

    def active(self, state: AscentState) -> jax.Array:
        return ~state.done & (state.step < self.steps)

    def _step(self, classifier, x, y, target):
        def loss_and_logits(images, model):
            logits = model(images)
            return self.objective(logits, y, target).sum(), logits

        def step(_, s: AscentState) -> AscentState:
            running = self.active(s)
            grad, logits = eot.expected_gradient(loss_and_logits, s.x_adv, classifier, s.step, self.eot_samples)
            done = s.done | (running & (attack_margin(logits, y, target) < 0)) if self.early_stop else s.done
            x_next, carry_next = self.update(x, s.step, s.x_adv, grad, s.carry)
            moving = running & ~done
            return AscentState(
                step=s.step + 1,
                x_adv=jnp.where(_per_example(moving, x_next), x_next, s.x_adv),
                carry=jax.tree.map(lambda new, old: jnp.where(_per_example(moving, new), new, old), carry_next, s.carry),
                done=done,
                queries=s.queries + running.astype(jnp.int32) * self.eot_samples,
            )

        return step

    def advance(self, classifier, x, y, target, state: AscentState) -> AscentState:
        length = -(-self.steps // SEGMENTS)
        return jax.lax.fori_loop(0, length, self._step(classifier, x, y, target), state,
                                 unroll=resolve_unroll(self.unroll))

    def finish(self, classifier, x, y, target, state: AscentState) -> AttackResult:
        return finalize(classifier, state.x_adv, y, target, state.queries)

    def run(self, classifier, x, y, key, target) -> AttackResult:
        state = jax.lax.fori_loop(0, self.steps, self._step(classifier, x, y, target),
                                  self.start(classifier, x, y, key, target), unroll=resolve_unroll(self.unroll))
        return self.finish(classifier, x, y, target, state)
