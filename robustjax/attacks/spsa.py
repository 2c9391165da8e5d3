"""SPSA attack (Uesato, O'Donoghue, van den Oord & Kohli, "Adversarial Risk and the Dangers
of Evaluating Against Weak Attacks", ICML 2018), linf.

Minimises the margin ``attack_margin`` (``z_y - max_{j != y} z_j`` untargeted,
``max_{j != t} z_j - z_t`` targeted) over the linf ball with Adam, on the simultaneous
perturbation estimate of its gradient at the current point ``x'``:

    g = 1 / (2 n delta) * sum_{k=1}^{n} (f(x' + delta v_k) - f(x' - delta v_k)) v_k,

with ``v_k`` Rademacher vectors (``2 n`` queries; each example draws its ``v_k`` from a
key of its own). The perturbation starts uniform in the ball; after each Adam step it is
projected onto the ball and the [0, 1] box, and the new point is queried once: an
example stops at its first successful point. The result is the queried point of lowest
margin. As in the reference code, the probe points ``x' +- delta v`` are not clipped to
[0, 1].

Defaults are CleverHans' (``learning_rate = delta = 0.01``, 128 samples). Unlike
CleverHans' PyTorch version, which estimates every gradient at the clean image, the
estimate is taken at the current point, as in the paper and CleverHans' TensorFlow code.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Key

from robustjax.attacks import threat
from robustjax.attacks.base import AttackResult, finalize, register_attack
from robustjax.attacks.score import (
    EstimatedGradientAttack,
    antithetic_gradient,
    per_candidate,
    query,
    select,
)
from robustjax.checks import check_nonnegative_float, check_positive_float, check_positive_int
from robustjax.losses import attack_margin

# Adam with optax's defaults (beta1 0.9, beta2 0.999, epsilon 1e-8); its step count is
# shared by the examples still searching, as the iteration.
ADAM = optax.scale_by_adam()


def spsa_gradient(
    f, keys: Key[Array, " b"], x: Float[Array, "b h w c"], delta, samples: int
) -> Float[Array, "b h w c"]:
    """The SPSA estimate of the gradient of ``f`` at ``x`` from ``samples`` antithetic
    Rademacher pairs per example, drawn from that example's key of ``keys`` (B,); ``f``
    maps candidates (B, m, H, W, C) to values (B, m)."""
    v = jax.vmap(lambda key: jax.random.rademacher(key, (samples,) + x.shape[1:], x.dtype))(keys)
    return antithetic_gradient(f, x, v, delta)


class _State(NamedTuple):
    iteration: jax.Array  # shared by the examples still searching
    keys: jax.Array  # per example: its estimates' randomness
    delta: jax.Array
    optimizer: optax.OptState
    x_best: jax.Array
    margin: jax.Array
    done: jax.Array
    queries: jax.Array


@register_attack("spsa")
@dataclasses.dataclass(frozen=True)
class SPSA(EstimatedGradientAttack):
    """SPSA with Adam in the linf ball of radius ``eps``.

    Attributes:
      eps: radius of the linf ball.
      max_queries: per-example budget, the clean and final checks included. An
        iteration costs ``2 * samples * sample_batches + 1`` queries.
      learning_rate: Adam learning rate.
      delta: finite-difference step of the estimate.
      samples: Rademacher pairs per model call (``samples * batch`` pairs are evaluated
        at once: lower it to save memory).
      sample_batches: model calls averaged per gradient estimate (CleverHans'
        ``spsa_iters``).
    """

    traceable = ("eps", "learning_rate")

    eps: float | jax.Array = 8 / 255
    max_queries: int = 10_000
    learning_rate: float | jax.Array = 0.01
    delta: float = 0.01
    samples: int = 128
    sample_batches: int = 1

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)
        check_positive_float(self.learning_rate, "learning_rate", traceable=True)
        check_positive_float(self.delta, "delta")
        check_positive_int(self.samples, "samples")
        check_positive_int(self.sample_batches, "sample_batches")
        self.check_budget()

    @property
    def queries_per_iteration(self) -> int:
        return 2 * self.samples * self.sample_batches + 1


    def start(self, classifier, x, y, key, target) -> _State:
        start_key, loop_key = jax.random.split(key)
        delta = threat.random_start(start_key, x, self.eps, "linf") - x
        return _State(iteration=jnp.zeros((), jnp.int32), keys=jax.random.split(loop_key, x.shape[0]), delta=delta,
                      optimizer=ADAM.init(delta), x_best=x, **self.clean_check(classifier, x, y, target))

    def advance(self, classifier, x, y, target, state: _State) -> _State:
        end = state.iteration + self.segment_length

        def step(s: _State) -> _State:
            moving = self.active(s)

            def margins(probes):
                return per_candidate(attack_margin, query(classifier, probes, moving), y, target)

            def batch_keys(key):  # an example's keys of this iteration, one per model call
                return jax.random.split(jax.random.fold_in(key, s.iteration), self.sample_batches)

            keys = jax.vmap(batch_keys, out_axes=1)(s.keys)  # (sample_batches, B)
            estimate = jax.lax.map(
                lambda k: spsa_gradient(margins, k, x + s.delta, self.delta, self.samples), keys)
            direction, optimizer = ADAM.update(estimate.mean(axis=0), s.optimizer)
            moved = x + s.delta - self.learning_rate * direction
            delta = threat.into_threat_set(x, moved, self.eps, "linf") - x
            margin = attack_margin(query(classifier, x + delta, moving), y, target)
            better = moving & (margin < s.margin)
            return s._replace(
                iteration=s.iteration + 1,
                delta=select(moving, delta, s.delta),
                optimizer=optimizer._replace(mu=select(moving, optimizer.mu, s.optimizer.mu),
                                             nu=select(moving, optimizer.nu, s.optimizer.nu)),
                x_best=select(better, x + delta, s.x_best),
                margin=jnp.where(better, margin, s.margin),
                done=s.done | (moving & (margin < 0)),
                queries=s.queries + moving * self.queries_per_iteration,
            )

        return jax.lax.while_loop(lambda s: (s.iteration < end) & self.active(s).any(), step, state)

    def finish(self, classifier, x, y, target, state: _State) -> AttackResult:
        return finalize(classifier, state.x_best, y, target, state.queries)
