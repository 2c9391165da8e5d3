"""Shared pieces of the decision-based black-box attacks (Boundary, HopSkipJump, Sign-OPT, RayS).

These attacks read only the classifier's predicted label (the argmax of its output),
never scores or gradients. Each runs over a batch inside one jitted ``lax.while_loop``
with a per-example query budget ``max_queries`` that counts every model evaluation of the
example: the clean check that opens the attack, the attack's own queries, and the final
check of :func:`~robustjax.attacks.base.finalize`. An example whose clean image is already
misclassified (untargeted) or already classified as the target (targeted) is not
attacked: it costs the clean and the final check only (2 queries) and is reported as a
success with ``x_adv = x``.

Decision-based attacks start from an adversarial point and walk along the decision
boundary towards ``x``, keeping the closest adversarial point seen. The starting point is
found here (:func:`initial_point`): uniform noise images are drawn until one is
adversarial, then the blend ``(1 - a) x + a noise`` is bisected for the smallest
adversarial ``a``, as in the Boundary attack and HopSkipJump. An example whose budget (or
noise trials) runs out before any adversarial point is found returns ``x`` unsuccessful.

Query accounting (:func:`query`): the model sees fixed-shape batches of ``(B, n)``
candidate images; only the candidates an example pays for are real queries. The others
are replaced by :data:`PLACEHOLDER` images, with every pixel at -1, outside the [0, 1]
box, so that a wrapped external oracle (or a counting test) can skip them, and the model
is not called at all when no example needs it.
"""

from __future__ import annotations

import abc
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from robustjax.attacks import threat
from robustjax.attacks.base import Attack, AttackResult, finalize
from robustjax.attacks.score import PLACEHOLDER, per_example, select, warn_if_probabilities
from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.losses import attack_margin
from robustjax.sharding import skip_unless, varying_like

_TINY = 1e-12


def query(
    classifier: Classifier, points: Float[Array, "b n h w c"], allowed: Bool[Array, "b n"],
    y: Int[Array, " b"], target: Int[Array, " b"] | None,
) -> tuple[Bool[Array, "b n"], Int[Array, " b"]]:
    """Asks the label-only oracle about the ``allowed`` candidates of each example.

    A candidate is adversarial when its predicted label is not ``y`` (untargeted) or is
    ``target`` (targeted), a tie with ``y`` (or a tie for the target) counting as no
    success, exactly as the final check decides. Returns which allowed candidates are
    adversarial (never a candidate that was not allowed) and the queries each example is charged (its allowed count). Candidates not
    allowed are sent as :data:`PLACEHOLDER` images; with none allowed the model is skipped.
    """
    b, n = allowed.shape
    images = jnp.where(per_example(allowed, points), points, PLACEHOLDER).reshape((b * n,) + points.shape[2:])
    labels, targets = jnp.repeat(y, n), None if target is None else jnp.repeat(target, n)

    def decide(batch):
        return attack_margin(classifier(batch), labels, targets) < 0

    decided = skip_unless(allowed.any(), decide, lambda batch: jnp.zeros(b * n, bool), images)
    adversarial = decided.reshape(b, n) & allowed
    return adversarial, allowed.sum(axis=1, dtype=jnp.int32)


def query_one(
    classifier: Classifier, points: Float[Array, "b h w c"], allowed: Bool[Array, " b"],
    y: Int[Array, " b"], target: Int[Array, " b"] | None,
) -> tuple[Bool[Array, " b"], Int[Array, " b"]]:
    """:func:`query` with one candidate per example."""
    adversarial, cost = query(classifier, points[:, None], allowed[:, None], y, target)
    return adversarial[:, 0], cost


def query_rowwise(
    classifier: Classifier, points: Float[Array, "b n h w c"], allowed: Bool[Array, "b n"],
    y: Int[Array, " b"], target: Int[Array, " b"] | None,
) -> tuple[Bool[Array, "b n"], Int[Array, " b"]]:
    """:func:`query` as one model call of B images per candidate position (skipped when no
    example needs it), the layout of the final check.

    Convolutions compute a row's logits slightly differently in batches of different sizes
    (by ~1e-6 on XLA's CPU backend), which can flip the label of a point that sits on the
    boundary; an attack that returns a candidate found adversarial here has the final
    check agree with it. Put the needed candidates first to save calls.
    """
    adversarial, costs = jax.lax.map(
        lambda args: query_one(classifier, args[0], args[1], y, target),
        (jnp.moveaxis(points, 1, 0), allowed.T))
    return adversarial.T, costs.sum(axis=0)


def first_allowed(wanted: Bool[Array, "b n"], remaining: Int[Array, " b"]) -> Bool[Array, "b n"]:
    """The first ``remaining`` wanted candidates of each example (what its budget pays for)."""
    return wanted & (jnp.cumsum(wanted, axis=1) <= remaining[:, None])


def blend(x: Float[Array, "b h w c"], x_adv: Float[Array, "b h w c"], a: Float[Array, " b"]) -> Float[Array, "b h w c"]:
    """The point ``(1 - a) x + a x_adv`` of the segment from ``x`` to ``x_adv`` (l2 geometry)."""
    a = per_example(a, x)
    return (1.0 - a) * x + a * x_adv


def linf_shrink(x: Float[Array, "b h w c"], x_adv: Float[Array, "b h w c"], r: Float[Array, " b"]) -> Float[Array, "b h w c"]:
    """``x_adv`` clipped to the linf ball of radius ``r`` around ``x`` (HopSkipJump's linf
    interpolation)."""
    r = per_example(r, x)
    return jnp.clip(x_adv, x - r, x + r)


def bisection_steps(width: float, tolerance: float) -> int:
    """Halvings that shrink an interval of ``width`` to at most ``tolerance``."""
    return max(0, math.ceil(math.log2(width / tolerance)))


def bisect(
    classifier: Classifier, point_at, lo: Float[Array, " b"], hi: Float[Array, " b"], x_hi: Float[Array, "b h w c"],
    steps: int, y, target, active: Bool[Array, " b"], queries: Int[Array, " b"], limit: int,
) -> tuple[Float[Array, " b"], Float[Array, "b h w c"], Int[Array, " b"]]:
    """Binary search for the boundary on a path ``point_at(r)`` (B images for (B,) radii)
    from ``lo`` (not adversarial) to ``hi``, whose point ``x_hi`` is adversarial.

    Runs ``steps`` halvings, each one query per ``active`` example with budget left.
    Returns the adversarial end ``hi``, the image queried there (bit for bit the one the
    oracle labelled: a point on the boundary must not be recomputed, rounding could move
    it across), and the updated query counts.
    """

    def halve(_, state):
        lo, hi, x_hi, queries = state
        mid = 0.5 * (lo + hi)
        point = point_at(mid)
        allowed = active & (queries < limit)
        adversarial, cost = query_one(classifier, point, allowed, y, target)
        return (jnp.where(allowed & ~adversarial, mid, lo), jnp.where(adversarial, mid, hi),
                select(adversarial, point, x_hi), queries + cost)

    _, hi, x_hi, queries = jax.lax.fori_loop(0, steps, halve, varying_like((lo, hi, x_hi, queries), x_hi))
    return hi, x_hi, queries


def initial_point(
    classifier: Classifier, x: Float[Array, "b h w c"], y, target, key: jax.Array,
    active: Bool[Array, " b"], queries: Int[Array, " b"], limit: int, *, trials: int, tolerance: float = 1e-3,
) -> tuple[Float[Array, "b h w c"], Bool[Array, " b"], Int[Array, " b"]]:
    """An adversarial starting point for each ``active`` example.

    Draws uniform noise images in [0, 1] (one query each, at most ``trials`` per example)
    until one is adversarial, then bisects the blend ``(1 - a) x + a noise`` to within
    ``tolerance`` of the smallest adversarial ``a``. Returns the starting points (``x``
    where none was found), which examples have one, and the query counts.
    """

    def searching(state):
        trial, found, _, queries = state
        return (trial < trials) & (active & ~found & (queries < limit)).any()

    def draw(state):
        trial, found, noise, queries = state
        candidate = jax.random.uniform(jax.random.fold_in(key, trial), x.shape, x.dtype)
        allowed = active & ~found & (queries < limit)
        adversarial, cost = query_one(classifier, candidate, allowed, y, target)
        return trial + 1, found | adversarial, select(adversarial, candidate, noise), queries + cost

    init = (jnp.zeros((), jnp.int32), jnp.zeros(x.shape[0], bool), x, queries)
    _, found, noise, queries = jax.lax.while_loop(searching, draw, varying_like(init, x))
    zeros = jnp.zeros(x.shape[0], x.dtype)
    _, start, queries = bisect(classifier, lambda a: blend(x, noise, a), zeros, zeros + 1.0, noise,
                               bisection_steps(1.0, tolerance), y, target, found, queries, limit)
    return start, found, queries


def closest(
    x: Float[Array, "b h w c"], points: Float[Array, "b n h w c"], adversarial: Bool[Array, "b n"], norm: str,
) -> tuple[Float[Array, "b h w c"], Float[Array, " b"]]:
    """Per example, the adversarial candidate closest to ``x`` and its distance (inf if none)."""
    b, n = adversarial.shape
    distances = threat.per_example_norm((points - x[:, None]).reshape((b * n,) + x.shape[1:]), norm).reshape(b, n)
    distances = jnp.where(adversarial, distances, jnp.inf)
    index = jnp.argmin(distances, axis=1)
    point = points[jnp.arange(b), index]
    return point, distances[jnp.arange(b), index]


def keep_closer(best, best_distance, candidate, distance):
    """The closer of two adversarial points per example (``inf`` distance: none)."""
    closer = distance < best_distance
    return select(closer, candidate, best), jnp.where(closer, distance, best_distance)


class DecisionAttack(Attack):
    """Base of decision-based attacks: the ``max_queries`` budget, the clean check, the
    probability warning and the final check.

    Subclasses implement :meth:`search`, which gets the examples to attack and the
    budget left for the attack itself (``max_queries`` less the final check).
    """

    #: clean check, one attack query, final check
    min_queries = 3

    def check_budget(self) -> None:
        check_positive_int(self.max_queries, "max_queries")
        if self.max_queries < self.min_queries:
            raise ValueError(
                f"max_queries must be >= {self.min_queries} for {self.name!r} (the clean check, at "
                f"least one attack query and the final check), got {self.max_queries}"
            )

    def validate(self, classifier, x, y, key, target) -> None:
        super().validate(classifier, x, y, key, target)
        warn_if_probabilities(classifier, x, "the attack's labels are unaffected, but the reported margins "
                              "are differences of probabilities")

    @abc.abstractmethod
    def search(self, classifier, x, y, target, key, active, queries, limit) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Attacks the ``active`` examples within ``limit`` queries each (counted in
        ``queries``). Returns the closest adversarial points, whether one was found, and
        the query counts."""

    def run(self, classifier, x, y, key, target) -> AttackResult:
        done = attack_margin(classifier(x), y, target) < 0
        queries = jnp.ones(x.shape[0], jnp.int32)
        best, found, queries = self.search(classifier, x, y, target, key, ~done, queries, self.max_queries - 1)
        return finalize(classifier, select(found & ~done, best, x), y, target, queries)
