"""HopSkipJump (Chen, Jordan & Wainwright, "HopSkipJumpAttack: A Query-Efficient
Decision-Based Attack", IEEE S&P 2020), in the l2 and linf geometries.

From an adversarial point on the decision boundary, each iteration ``t = 0, 1, ...``

1. estimates the boundary's normal by Monte-Carlo: ``n_t = min(init_eval sqrt(t + 1),
   max_eval)`` label queries at ``x_b + delta u_i`` (``u_i`` random, unit l2 norm,
   Gaussian for l2 and uniform for linf), ``phi_i = +1`` when adversarial else ``-1``,
   ``grad = mean((phi_i - mean(phi)) u_i)`` (plain ``+-mean(u_i)`` when all ``phi`` agree);
   ``delta = 0.1`` at ``t = 0``, then ``sqrt(d) theta dist`` (l2) or ``d theta dist``
   (linf), with ``theta = 0.01 / sqrt(d)`` (l2) or ``0.01 / d`` (linf) as in ART;
2. steps along ``v = grad / ||grad||_2`` (l2) or ``sign(grad)`` (linf) by the geometric
   search ``xi = dist / sqrt(t + 1)``, halved until ``x_b + xi v`` is adversarial;
3. bisects back to the boundary: on the segment to ``x`` (l2), or shrinking the linf ball
   around ``x`` (linf), to the tolerance ``theta`` (relative, for linf).

The start point comes from :func:`~robustjax.attacks.decision.initial_point` and is
bisected to the boundary first. All examples run in lockstep over ``t`` (so they share
``n_t``); the ones out of budget are masked. The gradient samples are queried in chunks of
``init_eval`` per example, so memory stays ``B * init_eval`` images for any ``max_eval``.

Differences from ART's ``HopSkipJump``: the order of the steps is the authors' (ART
bisects at the start of each iteration and returns the last stepped point, which is not
on the boundary); the attack stops at ``max_queries`` per example and returns the closest
boundary point it reached.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from robustjax.attacks import threat
from robustjax.attacks.base import register_attack
from robustjax.attacks.decision import (
    DecisionAttack,
    bisect,
    bisection_steps,
    blend,
    initial_point,
    keep_closer,
    linf_shrink,
    per_example,
    query,
    query_one,
    select,
)
from robustjax.checks import check_choice, check_positive_int
from robustjax.sharding import varying_like

NORMS = ("l2", "linf")


@register_attack("hop_skip_jump")
@dataclasses.dataclass(frozen=True)
class HopSkipJump(DecisionAttack):
    """HopSkipJump, untargeted or targeted, minimising the l2 or linf distance.

    Attributes:
      norm: ``"l2"`` or ``"linf"``.
      max_queries: per-example budget, clean and final checks included.
      max_iter: maximum number of iterations (ART's default 50).
      max_eval: cap on the gradient-estimation queries of one iteration.
      init_eval: gradient-estimation queries at the first iteration; also the chunk size.
      init_size: uniform-noise draws allowed when looking for a starting point.
    """

    norm: str = "l2"
    max_queries: int = 10_000
    max_iter: int = 50
    max_eval: int = 10_000
    init_eval: int = 100
    init_size: int = 100

    def __post_init__(self):
        check_choice(self.norm, NORMS, "norm")
        self.check_budget()
        for name in ("max_iter", "max_eval", "init_eval", "init_size"):
            check_positive_int(getattr(self, name), name)
        if self.init_eval > self.max_eval:
            raise ValueError(f"init_eval ({self.init_eval}) must be <= max_eval ({self.max_eval})")

    def theta(self, dim: int) -> float:
        """ART's bisection tolerance (and ``delta`` scale): ``0.01 / sqrt(d)`` (l2), ``0.01 / d`` (linf)."""
        return 0.01 / (dim ** 0.5 if self.norm == "l2" else dim)

    def to_boundary(self, classifier, x, x_adv, y, target, active, queries, limit):
        """Bisects from the adversarial ``x_adv`` towards ``x`` onto the boundary."""
        steps = bisection_steps(1.0, self.theta(threat.example_size(x)))
        zeros = jnp.zeros(x.shape[0], x.dtype)
        if self.norm == "l2":
            _, x_b, queries = bisect(classifier, lambda a: blend(x, x_adv, a), zeros, zeros + 1.0, x_adv, steps,
                                     y, target, active, queries, limit)
            return x_b, queries
        radius = threat.per_example_norm(x_adv - x, "linf")
        _, x_b, queries = bisect(classifier, lambda r: linf_shrink(x, x_adv, r), zeros, radius, x_adv, steps,
                                 y, target, active, queries, limit)
        return x_b, queries

    def estimate_direction(self, classifier, x_b, y, target, key, delta, num_eval, active, queries, limit):
        """HopSkipJump's step direction at the boundary point ``x_b`` from up to ``num_eval``
        sign queries per ``active`` example (fewer when its budget is short).

        Returns the direction (zero for an example that took no sample) and the query counts.
        """
        chunk, shape = self.init_eval, (x_b.shape[0], self.init_eval) + x_b.shape[1:]
        samples = jnp.where(active, jnp.minimum(num_eval, limit - queries), 0)
        radius = per_example(delta, x_b)[:, None]

        def more(state):
            return state[0] * chunk < samples.max()

        def sample(state):
            c, s_fu, s_u, s_f, n, queries = state
            k = jax.random.fold_in(key, c)
            if self.norm == "l2":
                u = jax.random.normal(k, shape, x_b.dtype)
            else:
                u = jax.random.uniform(k, shape, x_b.dtype, -1.0, 1.0)
            u = u / jnp.sqrt(jnp.sum(u * u, axis=tuple(range(2, u.ndim)), keepdims=True))
            candidates = jnp.clip(x_b[:, None] + radius * u, 0.0, 1.0)
            u = (candidates - x_b[:, None]) / radius  # the displacement actually queried
            allowed = (c * chunk + jnp.arange(chunk))[None, :] < samples[:, None]
            adversarial, cost = query(classifier, candidates, allowed, y, target)
            phi = jnp.where(allowed, 2.0 * adversarial - 1.0, 0.0)
            weight = allowed.astype(u.dtype)
            return (c + 1, s_fu + jnp.einsum("bn,bn...->b...", phi, u),
                    s_u + jnp.einsum("bn,bn...->b...", weight, u), s_f + phi.sum(1), n + cost, queries + cost)

        zeros = jnp.zeros(x_b.shape[0], x_b.dtype)
        init = (jnp.zeros((), jnp.int32), jnp.zeros_like(x_b), jnp.zeros_like(x_b), zeros,
                jnp.zeros(x_b.shape[0], jnp.int32), queries)
        _, s_fu, s_u, s_f, n, queries = jax.lax.while_loop(more, sample, varying_like(init, x_b))
        count = per_example(jnp.maximum(n, 1).astype(x_b.dtype), x_b)
        mean_phi = per_example(s_f, x_b) / count
        unanimous = jnp.abs(mean_phi) == 1.0  # baseline would cancel everything: use +-mean(u)
        grad = jnp.where(unanimous, mean_phi * s_u / count, (s_fu - mean_phi * s_u) / count)
        if self.norm == "l2":
            return threat.ascent_direction(grad, "l2"), queries
        return jnp.sign(grad), queries

    def search(self, classifier, x, y, target, key, active, queries, limit):
        start_key, loop_key = jax.random.split(key)
        start, found, queries = initial_point(classifier, x, y, target, start_key, active, queries, limit,
                                              trials=self.init_size)
        x_b, queries = self.to_boundary(classifier, x, start, y, target, found, queries, limit)
        dim = threat.example_size(x)
        scale = dim ** 0.5 if self.norm == "l2" else dim  # delta = scale * theta * dist

        def running(state):
            t, _, _, _, queries = state
            return (t < self.max_iter) & (found & (queries < limit)).any()

        def iterate(state):
            t, x_b, best, best_distance, queries = state
            key_t = jax.random.fold_in(loop_key, t)
            live = found & (queries < limit)
            dist = threat.per_example_norm(x_b - x, self.norm)
            delta = jnp.where(t == 0, 0.1, scale * self.theta(dim) * dist)
            num_eval = jnp.minimum((self.init_eval * jnp.sqrt(t + 1.0)).astype(jnp.int32), self.max_eval)
            direction, queries = self.estimate_direction(classifier, x_b, y, target, key_t, delta, num_eval,
                                                         live, queries, limit)
            stepped, moved, queries = self.geometric_step(classifier, x_b, direction, dist / jnp.sqrt(t + 1.0),
                                                          y, target, live, queries, limit)
            x_new, queries = self.to_boundary(classifier, x, stepped, y, target, moved, queries, limit)
            x_b = select(moved, x_new, x_b)
            best, best_distance = keep_closer(best, best_distance, x_b, threat.per_example_norm(x_b - x, self.norm))
            return t + 1, x_b, best, best_distance, queries

        distance = jnp.where(found, threat.per_example_norm(x_b - x, self.norm), jnp.inf)
        init = (jnp.zeros((), jnp.int32), x_b, x_b, distance, queries)
        _, _, best, _, queries = jax.lax.while_loop(running, iterate, varying_like(init, x))
        return best, found, queries

    def geometric_step(self, classifier, x_b, direction, step, y, target, active, queries, limit):
        """Halves ``step`` from ``dist / sqrt(t + 1)`` until ``x_b + step * direction`` is
        adversarial (one query each). Returns the new points, which examples moved, and the
        query counts; an example out of budget keeps ``x_b``."""
        active = active & jnp.any(direction != 0, axis=tuple(range(1, x_b.ndim)))

        def candidate(step):
            return jnp.clip(x_b + per_example(step, x_b) * direction, 0.0, 1.0)

        def searching(state):
            _, moved, _, queries = state
            return (active & ~moved & (queries < limit)).any()

        def halve(state):
            step, moved, stepped, queries = state
            allowed = active & ~moved & (queries < limit)
            point = candidate(step)
            adversarial, cost = query_one(classifier, point, allowed, y, target)
            return (jnp.where(allowed & ~adversarial, 0.5 * step, step), moved | adversarial,
                    select(adversarial, point, stepped), queries + cost)

        _, moved, stepped, queries = jax.lax.while_loop(searching, halve, (step, jnp.zeros_like(active), x_b, queries))
        return stepped, moved, queries
