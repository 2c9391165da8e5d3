"""RayS (Chen & Gu, "RayS: A Ray Searching Method for Hard-label Adversarial Attack",
KDD 2020), untargeted, linf.

RayS searches over ray directions ``d`` in ``{-1, +1}^D``: the distance to the decision
boundary along a ray, ``g(d) = min {r : f(clip(x + r d)) != y}``, is the linf norm of
the adversarial example it gives. Starting from ``d = (1, ..., 1)`` it flips the sign of
one block of coordinates at a time, hierarchically: at level ``s`` the flattened image
is cut into ``2^s`` blocks of ``ceil(D / 2^s)`` coordinates, visited in order, then the
next level starts. A flipped direction ``d'`` is kept when ``g(d') < g(d)``, found
with the early-stopping check of the paper: one query at the current best radius
``r*`` tells whether ``g(d') < r*`` at all; only then is ``g(d')`` bisected on
``[0, r*]`` to the authors' tolerance (``tolerance`` on the l2 length of the step along
``d / ||d||_2``, i.e. ``tolerance / sqrt(D)`` in linf). An example stops when its radius
reaches ``eps`` (if given) or its budget is spent.

Before any adversarial ray is known (``r* = inf``) the check is made at radius 1, the
corner of the box the ray points to (the authors' code also tries radii 2 to 10, which
clip to the same image). Each example moves through its own checks and bisections; one
loop step is one query for every example still running.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from robustjax.attacks import threat
from robustjax.attacks.base import register_attack
from robustjax.attacks.decision import DecisionAttack, per_example, query_one, select
from robustjax.checks import check_nonnegative_float, check_positive_float
from robustjax.sharding import varying_like

_CHECK, _BISECT = 0, 1


class _State(NamedTuple):
    signs: jax.Array  # (B, D) the best direction
    radius: jax.Array  # its g, inf until a ray is adversarial
    level: jax.Array
    block: jax.Array
    phase: jax.Array  # _CHECK or _BISECT
    lo: jax.Array
    hi: jax.Array
    x_hi: jax.Array  # the image queried at the adversarial end of the current search
    best: jax.Array  # the image queried at the best radius
    stopped: jax.Array
    queries: jax.Array


def flipped_block(signs, level, block):
    """``signs`` (B, D) with block ``block`` of level ``level`` negated, and whether that
    block is the last of its level."""
    dim = signs.shape[1]
    size = -(-dim // (2**level))  # ceil(D / 2^level)
    start = block * size
    end = jnp.minimum(start + size, dim)
    coordinates = jnp.arange(dim)[None, :]
    inside = (coordinates >= start[:, None]) & (coordinates < end[:, None])
    last = (block + 1 == 2**level) | (end == dim)
    return jnp.where(inside, -signs, signs), last


@register_attack("rays")
@dataclasses.dataclass(frozen=True)
class RayS(DecisionAttack):
    """RayS, untargeted, minimising the linf distance.

    Attributes:
      max_queries: per-example budget, clean and final checks included.
      eps: stop an example once its linf distance is at most ``eps``; ``None``: never
        (minimise until the budget is spent).
      tolerance: bisection tolerance on the l2-normalised ray (the authors' 1e-3).
    """

    max_queries: int = 10_000
    eps: float | jax.Array | None = None
    tolerance: float = 1e-3

    supports_targeted = False
    traceable = ("eps",)

    def __post_init__(self):
        self.check_budget()
        if self.eps is not None:
            check_nonnegative_float(self.eps, "eps", traceable=True)
        check_positive_float(self.tolerance, "tolerance")

    def search(self, classifier, x, y, target, key, active, queries, limit):
        del key, target  # deterministic, untargeted
        b, dim = x.shape[0], threat.example_size(x)
        tolerance = self.tolerance / math.sqrt(dim)
        top_level = math.ceil(math.log2(dim))  # blocks of one coordinate from here on
        eps = -1.0 if self.eps is None else self.eps

        def point(signs, radius):
            return jnp.clip(x + per_example(radius, x) * signs.reshape(x.shape), 0.0, 1.0)

        def running(s: _State):
            return (active & ~s.stopped & (s.queries < limit)).any()

        def step(s: _State) -> _State:
            live = active & ~s.stopped & (s.queries < limit)
            candidate, last = flipped_block(s.signs, s.level, s.block)
            checking = s.phase == _CHECK
            ceiling = jnp.minimum(s.radius, 1.0)
            mid = 0.5 * (s.lo + s.hi)
            radius = jnp.where(checking, ceiling, mid)
            queried = point(candidate, radius)
            adversarial, cost = query_one(classifier, queried, live, y, None)
            x_hi = select(adversarial, queried, s.x_hi)

            hi = jnp.where(checking, ceiling, jnp.where(adversarial, mid, s.hi))
            lo = jnp.where(checking, 0.0, jnp.where(live & ~adversarial, mid, s.lo))
            bisecting = live & jnp.where(checking, adversarial, True)
            finished = bisecting & (hi - lo <= tolerance)
            improved = finished & (hi < s.radius)
            radius_best = jnp.where(improved, hi, s.radius)
            next_block = (live & checking & ~adversarial) | finished  # this candidate is settled
            level = jnp.where(next_block & last, jnp.minimum(s.level + 1, top_level), s.level)
            block = jnp.where(next_block, jnp.where(last, 0, s.block + 1), s.block)
            return _State(
                signs=jnp.where(improved[:, None], candidate, s.signs),
                radius=radius_best,
                level=level,
                block=block,
                phase=jnp.where(live, jnp.where(bisecting & ~finished, _BISECT, _CHECK), s.phase),
                lo=lo,
                hi=hi,
                x_hi=x_hi,
                best=select(improved, x_hi, s.best),
                stopped=s.stopped | (radius_best <= eps),
                queries=s.queries + cost,
            )

        zeros = jnp.zeros(b, x.dtype)
        init = _State(
            signs=jnp.ones((b, dim), x.dtype),
            radius=jnp.full(b, jnp.inf, x.dtype),
            level=jnp.zeros(b, jnp.int32),
            block=jnp.zeros(b, jnp.int32),
            phase=jnp.full(b, _CHECK, jnp.int32),
            lo=zeros,
            hi=zeros,
            x_hi=x,
            best=x,
            stopped=jnp.zeros(b, bool),
            queries=queries,
        )
        final = jax.lax.while_loop(running, step, varying_like(init, x))
        return final.best, jnp.isfinite(final.radius), final.queries
