"""Boundary Attack (Brendel, Rauber & Bethge, "Decision-Based Adversarial Attacks:
Reliable Attacks Against Black-Box Machine Learning Models", ICLR 2018), with ART's
step-size adaptation.

From an adversarial point ``x_a`` the attack alternates two kinds of trial, each one
batch of label queries:

1. orthogonal step: ``sample_size`` candidates ``x_a + p``, where ``p`` is Gaussian noise
   of l2 norm ``delta ||x - x_a||`` with its component along ``x - x_a`` removed,
   followed by the correction that brings the candidate back onto the sphere around ``x``
   (``p <- ((1 - h)(x_a - x) + p) / h`` with ``h = sqrt(1 + delta^2)``), clipped to [0, 1];
2. source step: every adversarial candidate ``c`` moves to ``c + epsilon (x - c)``; the
   adversarial one closest to ``x`` becomes the new ``x_a`` and an iteration ends.

After each trial the step size of its kind is adapted from the fraction ``r`` of its
candidates that were adversarial: multiplied by ``step_adapt`` when ``r < 0.2``, divided
by it when ``r > 0.5``. A trial with no adversarial candidate is repeated, at most
``num_trial`` times in a row; after that the example stops, as in ART. An example also
stops after ``max_iter`` iterations, when ``epsilon < min_epsilon``, or at ``max_queries``.

The start point comes from :func:`~robustjax.attacks.decision.initial_point` (ART starts
from the uniform noise itself, without the blend search). Each example moves through its
own trials; one loop step runs one trial for every example as one model call of
``B * sample_size`` images for the orthogonal trials and one call of ``B`` images per
candidate position for the source trials (see :func:`~robustjax.attacks.decision.query_rowwise`).
The closest point any source step reached is returned.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from robustjax.attacks import threat
from robustjax.attacks.base import register_attack
from robustjax.attacks.decision import (
    DecisionAttack,
    closest,
    first_allowed,
    initial_point,
    keep_closer,
    per_example,
    query,
    query_rowwise,
    select,
)
from robustjax.checks import (
    check_in_interval,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
)
from robustjax.sharding import varying_like

_ORTHOGONAL, _SOURCE = 0, 1


class _State(NamedTuple):
    x_a: jax.Array  # current adversarial point
    delta: jax.Array  # orthogonal step size
    epsilon: jax.Array  # source step size
    phase: jax.Array  # _ORTHOGONAL or _SOURCE
    trials: jax.Array  # failed trials in a row in this phase
    candidates: jax.Array  # (B, S, ...) orthogonal candidates awaiting a source step
    adversarial: jax.Array  # (B, S) which of them are adversarial
    iterations: jax.Array
    stopped: jax.Array
    best: jax.Array
    best_distance: jax.Array
    queries: jax.Array
    step: jax.Array  # loop counter, for the random keys


def orthogonal_candidates(
    key: jax.Array, x: jax.Array, x_a: jax.Array, delta: jax.Array, sample_size: int,
) -> jax.Array:
    """``sample_size`` orthogonal-step candidates around each ``x_a`` (B, S, H, W, C)."""
    b = x.shape[0]
    noise = jax.random.normal(key, (b, sample_size) + x.shape[1:], x.dtype).reshape(b, sample_size, -1)
    towards = (x - x_a).reshape(b, 1, -1)
    distance = jnp.linalg.norm(towards, axis=-1, keepdims=True)
    unit = towards / (distance + 1e-12)
    delta = delta.reshape(b, 1, 1)
    noise = noise * (delta * distance / jnp.linalg.norm(noise, axis=-1, keepdims=True))
    noise = noise - jnp.sum(noise * unit, axis=-1, keepdims=True) * unit
    hypotenuse = jnp.sqrt(1.0 + delta**2)
    step = ((1.0 - hypotenuse) * -towards + noise) / hypotenuse
    return jnp.clip(x_a[:, None] + step.reshape((b, sample_size) + x.shape[1:]), 0.0, 1.0)


@register_attack("boundary")
@dataclasses.dataclass(frozen=True)
class Boundary(DecisionAttack):
    """The Boundary attack (l2), untargeted or targeted, with ART's defaults.

    Attributes:
      max_queries: per-example budget, clean and final checks included.
      max_iter: maximum number of iterations (source steps taken).
      delta: initial orthogonal step size (relative to the distance to ``x``).
      epsilon: initial source step size (fraction of the distance to ``x``).
      step_adapt: step-size adaptation factor, in (0, 1).
      num_trial: failed trials in a row after which an example stops.
      sample_size: candidates per orthogonal trial.
      init_size: uniform-noise draws allowed when looking for a starting point.
      min_epsilon: an example stops once its source step size falls below this.
    """

    max_queries: int = 10_000
    max_iter: int = 5000
    delta: float = 0.01
    epsilon: float = 0.01
    step_adapt: float = 0.667
    num_trial: int = 25
    sample_size: int = 20
    init_size: int = 100
    min_epsilon: float = 0.0

    def __post_init__(self):
        self.check_budget()
        for name in ("max_iter", "num_trial", "sample_size", "init_size"):
            check_positive_int(getattr(self, name), name)
        check_positive_float(self.delta, "delta")
        check_in_interval(self.epsilon, "epsilon", 0.0, 1.0)
        check_in_interval(self.step_adapt, "step_adapt", 0.0, 1.0)
        check_nonnegative_float(self.min_epsilon, "min_epsilon")

    def adapt(self, size, ratio, tried):
        """ART's rule: shrink below 20% adversarial candidates, grow above 50%."""
        size = jnp.where(tried & (ratio < 0.2), size * self.step_adapt, size)
        return jnp.where(tried & (ratio > 0.5), size / self.step_adapt, size)

    def search(self, classifier, x, y, target, key, active, queries, limit):
        start_key, loop_key = jax.random.split(key)
        x_a, found, queries = initial_point(classifier, x, y, target, start_key, active, queries, limit,
                                            trials=self.init_size)
        b, size = x.shape[0], self.sample_size
        index = jnp.arange(size)[None, :]

        def running(s: _State):
            return (found & ~s.stopped & (s.queries < limit)).any()

        def trial(s: _State) -> _State:
            live = found & ~s.stopped & (s.queries < limit)
            remaining = limit - s.queries
            orthogonal = orthogonal_candidates(jax.random.fold_in(loop_key, s.step), x, s.x_a, s.delta, size)
            in_source = s.phase == _SOURCE
            allowed = first_allowed((index < size) & (live & ~in_source)[:, None], remaining)
            adversarial, cost = query(classifier, orthogonal, allowed, y, target)
            # Source steps: the answers decide the returned point, so they are computed in
            # the final check's layout; the adversarial candidates were put first.
            source = jnp.clip(s.candidates + per_example(s.epsilon, s.candidates) * (x[:, None] - s.candidates), 0, 1)
            allowed_source = first_allowed(s.adversarial & (live & in_source)[:, None], remaining)
            adversarial_source, cost_source = query_rowwise(classifier, source, allowed_source, y, target)
            allowed = allowed | allowed_source
            adversarial = adversarial | adversarial_source
            cost = cost + cost_source
            hits = adversarial.any(axis=1)
            ratio = adversarial.sum(1) / jnp.maximum(allowed.sum(1), 1)
            tried = live & allowed.any(1)
            nearest, distance = closest(x, source, adversarial_source, "l2")
            best, best_distance = keep_closer(s.best, s.best_distance, nearest, distance)

            delta = jnp.where(in_source, s.delta, self.adapt(s.delta, ratio, tried))
            epsilon = jnp.where(in_source, self.adapt(s.epsilon, ratio, tried), s.epsilon)
            failed = tried & ~hits
            trials = jnp.where(failed, s.trials + 1, jnp.where(tried, 0, s.trials))
            advanced = tried & hits & in_source  # an iteration ends
            iterations = s.iterations + advanced
            gave_up = trials >= self.num_trial
            x_a = select(advanced, nearest, s.x_a)
            stopped = s.stopped | gave_up | (iterations >= self.max_iter) | (advanced & (epsilon < self.min_epsilon))
            to_source = tried & hits & ~in_source
            order = jnp.argsort(~adversarial, axis=1, stable=True)  # adversarial candidates first
            return _State(
                x_a=x_a,
                delta=delta,
                epsilon=epsilon,
                phase=jnp.where(to_source, _SOURCE, jnp.where(advanced, _ORTHOGONAL, s.phase)),
                trials=jnp.where(to_source | advanced, 0, trials),
                candidates=select(to_source, jnp.take_along_axis(orthogonal, per_example(order, orthogonal), 1),
                                  s.candidates),
                adversarial=jnp.where(to_source[:, None], jnp.take_along_axis(adversarial, order, 1), s.adversarial),
                iterations=iterations,
                stopped=stopped,
                best=best,
                best_distance=best_distance,
                queries=s.queries + cost,
                step=s.step + 1,
            )

        init = _State(
            x_a=x_a,
            delta=jnp.full(b, self.delta, x.dtype),
            epsilon=jnp.full(b, self.epsilon, x.dtype),
            phase=jnp.full(b, _ORTHOGONAL, jnp.int32),
            trials=jnp.zeros(b, jnp.int32),
            candidates=jnp.broadcast_to(x[:, None], (b, size) + x.shape[1:]),
            adversarial=jnp.zeros((b, size), bool),
            iterations=jnp.zeros(b, jnp.int32),
            stopped=jnp.zeros(b, bool),
            best=x_a,
            best_distance=jnp.where(found, threat.per_example_norm(x_a - x, "l2"), jnp.inf),
            queries=queries,
            step=jnp.zeros((), jnp.int32),
        )
        final = jax.lax.while_loop(running, trial, varying_like(init, x))
        return final.best, found, final.queries
