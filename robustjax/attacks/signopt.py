"""Sign-OPT (Cheng, Singh, Chen, Chen, Liu & Hsieh, "Sign-OPT: A Query-Efficient
Hard-label Adversarial Attack", ICLR 2020), l2.

The attack minimises over unit directions ``theta`` the distance to the decision
boundary along the ray, ``g(theta) = min {lambda > 0 : x + lambda theta is adversarial}``
(points clipped to [0, 1]). Each iteration

1. estimates the sign-gradient ``grad = mean_i sign(g(theta + beta u_i) - g(theta)) u_i``
   over ``k`` Gaussian directions ``u_i`` (unit l2 norm), where each sign costs one
   query: ``x + g(theta) (theta + beta u_i) / ||.||`` adversarial means ``g`` decreased;
2. line-searches the step ``alpha`` as ART does: try ``theta - alpha grad``
   (normalised), doubling ``alpha`` after each try while ``g`` keeps decreasing (at most
   15 tries); if the first try failed, quarter ``alpha`` until a try succeeds (at most 15);
   reset ``alpha`` to 1 when it falls below 1e-4.

A candidate ``theta'`` is evaluated with one query at the current best ``g``: if that point
is not adversarial, ``g(theta') >= g`` and the candidate fails; otherwise ``g(theta')`` is
bisected on ``[0, g]`` to ``tolerance``. (ART computes ``g(theta')`` exactly even when it
is larger, which only costs queries: the decisions are the same.)

The start direction is that of the library's starting point
(:func:`~robustjax.attacks.decision.initial_point`), whose blend search gives its ``g``;
the paper and ART instead bisect 100 random Gaussian directions and keep the best. ART
also shrinks its bisection tolerance when ``alpha`` resets; here it stays fixed. All
examples run their iterations in lockstep; the line search moves each example through
its own tries, one query per loop step.
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
    initial_point,
    per_example,
    query,
    query_one,
    select,
)
from robustjax.checks import check_positive_float, check_positive_int
from robustjax.sharding import varying_like

_GROW, _SHRINK, _FINISHED = 0, 1, 2
_TRIES = 15  # ART's line-search tries in each direction
_MIN_ALPHA = 1e-4


class _LineSearch(NamedTuple):
    mode: jax.Array  # _GROW, _SHRINK or _FINISHED
    tries: jax.Array
    bisecting: jax.Array
    lo: jax.Array
    hi: jax.Array
    alpha: jax.Array
    theta: jax.Array  # the best direction so far
    g: jax.Array  # and its distance
    point: jax.Array  # the image queried at x + g theta
    x_hi: jax.Array  # the image queried at the adversarial end of the bisection
    improved: jax.Array
    queries: jax.Array


def unit(v: jax.Array) -> jax.Array:
    """Each example of ``v`` scaled to unit l2 norm."""
    return threat.ascent_direction(v, "l2")


@register_attack("sign_opt")
@dataclasses.dataclass(frozen=True)
class SignOPT(DecisionAttack):
    """Sign-OPT, untargeted or targeted, minimising the l2 distance.

    Attributes:
      max_queries: per-example budget, clean and final checks included.
      max_iter: maximum number of iterations.
      k: random directions per sign-gradient estimate.
      alpha: initial line-search step.
      beta: smoothing radius of the sign-gradient estimate (ART's ``epsilon``).
      tolerance: bisection tolerance on ``g`` (ART's ``beta / 500``).
      init_size: uniform-noise draws allowed when looking for a starting point.
    """

    max_queries: int = 10_000
    max_iter: int = 1000
    k: int = 200
    alpha: float = 0.2
    beta: float = 0.001
    tolerance: float = 2e-6
    init_size: int = 100

    def __post_init__(self):
        self.check_budget()
        for name in ("max_iter", "k", "init_size"):
            check_positive_int(getattr(self, name), name)
        for name in ("alpha", "beta", "tolerance"):
            check_positive_float(getattr(self, name), name)

    def sign_gradient(self, classifier, x, theta, g, y, target, key, active, queries, limit):
        """The sign-gradient estimate from up to ``k`` queries per ``active`` example."""
        b = x.shape[0]
        u = unit(jax.random.normal(key, (b * self.k,) + x.shape[1:], x.dtype)).reshape((b, self.k) + x.shape[1:])
        directions = unit((theta[:, None] + self.beta * u).reshape((-1,) + x.shape[1:])).reshape(u.shape)
        points = jnp.clip(x[:, None] + per_example(g, x)[:, None] * directions, 0.0, 1.0)
        remaining = jnp.where(active, limit - queries, 0)
        allowed = jnp.arange(self.k)[None, :] < remaining[:, None]
        adversarial, cost = query(classifier, points, allowed, y, target)
        signs = jnp.where(allowed, jnp.where(adversarial, -1.0, 1.0), 0.0)
        grad = jnp.einsum("bk,bk...->b...", signs, u) / per_example(jnp.maximum(cost, 1), x)
        return grad, queries + cost

    def line_search(self, classifier, x, theta, g, point, grad, alpha, y, target, active, queries, limit):
        """ART's line search on the step size; returns the final search state."""

        def ray(direction, radius):
            return jnp.clip(x + per_example(radius, x) * direction, 0.0, 1.0)

        def running(s: _LineSearch):
            return (active & (s.mode != _FINISHED) & (s.queries < limit)).any()

        def step(s: _LineSearch) -> _LineSearch:
            live = active & (s.mode != _FINISHED) & (s.queries < limit)
            candidate = unit(theta - per_example(s.alpha, theta) * grad)
            mid = 0.5 * (s.lo + s.hi)
            queried = ray(candidate, jnp.where(s.bisecting, mid, s.g))
            adversarial, cost = query_one(classifier, queried, live, y, target)
            x_hi = select(adversarial, queried, s.x_hi)
            lo = jnp.where(live, jnp.where(s.bisecting, jnp.where(adversarial, s.lo, mid), 0.0), s.lo)
            hi = jnp.where(live, jnp.where(s.bisecting, jnp.where(adversarial, mid, s.hi), s.g), s.hi)
            bisecting = live & jnp.where(s.bisecting, True, adversarial)
            settled = bisecting & (hi - lo <= self.tolerance)
            success = settled & (hi < s.g)
            failure = live & ((~s.bisecting & ~adversarial) | (settled & ~success))
            grow, shrink = s.mode == _GROW, s.mode == _SHRINK
            tries = s.tries + (success & grow) + (failure & shrink)
            improved = s.improved | success
            alpha = jnp.where(grow & (success | failure), 2.0 * s.alpha, s.alpha)
            finished = (grow & success & (tries >= _TRIES)) | (grow & failure & s.improved) | (shrink & success) | (
                shrink & failure & (tries >= _TRIES))
            to_shrink = grow & failure & ~s.improved
            alpha = jnp.where((to_shrink | (shrink & failure & ~finished)), 0.25 * alpha, alpha)
            return _LineSearch(
                mode=jnp.where(finished, _FINISHED, jnp.where(to_shrink, _SHRINK, s.mode)),
                tries=jnp.where(to_shrink, 0, tries),
                bisecting=jnp.where(live, bisecting & ~settled, s.bisecting),
                lo=lo,
                hi=hi,
                alpha=alpha,
                theta=select(success, candidate, s.theta),
                g=jnp.where(success, hi, s.g),
                point=select(success, x_hi, s.point),
                x_hi=x_hi,
                improved=improved,
                queries=s.queries + cost,
            )

        b = x.shape[0]
        zeros = jnp.zeros(b, x.dtype)
        init = _LineSearch(mode=jnp.full(b, _GROW, jnp.int32), tries=jnp.zeros(b, jnp.int32),
                           bisecting=jnp.zeros(b, bool), lo=zeros, hi=zeros, alpha=alpha, theta=theta, g=g,
                           point=point, x_hi=point,
                           improved=jnp.zeros(b, bool), queries=queries)
        return jax.lax.while_loop(running, step, varying_like(init, x))

    def search(self, classifier, x, y, target, key, active, queries, limit):
        start_key, loop_key = jax.random.split(key)
        start, found, queries = initial_point(classifier, x, y, target, start_key, active, queries, limit,
                                              trials=self.init_size)
        g = threat.per_example_norm(start - x, "l2")
        theta = unit(start - x)

        def running(state):
            t, _, _, _, _, queries = state
            return (t < self.max_iter) & (found & (queries < limit)).any()

        def iterate(state):
            t, theta, g, point, alpha, queries = state
            live = found & (queries < limit)
            grad, queries = self.sign_gradient(classifier, x, theta, g, y, target, jax.random.fold_in(loop_key, t),
                                               live, queries, limit)
            s = self.line_search(classifier, x, theta, g, point, grad, alpha, y, target, live, queries, limit)
            alpha = jnp.where(live & (s.alpha < _MIN_ALPHA), 1.0, s.alpha)
            return t + 1, s.theta, s.g, s.point, alpha, s.queries

        init = (jnp.zeros((), jnp.int32), theta, g, start, jnp.full(x.shape[0], self.alpha, x.dtype), queries)
        _, _, _, point, _, queries = jax.lax.while_loop(running, iterate, varying_like(init, x))
        return point, found, queries
