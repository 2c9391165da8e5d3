"""Fast Adaptive Boundary attack (Croce & Hein, "Minimally distorted adversarial examples with
a fast adaptive boundary attack", ICML 2020), in its targeted form FAB-T as used by AutoAttack.

FAB looks for the adversarial example of smallest linf, l2 or l1 norm. At ``x_k`` it
linearises the decision boundary between the true class ``y`` and a class ``t``,
``pi(z) = f_t(x_k) - f_y(x_k) + <grad (f_t - f_y)(x_k), z - x_k> = 0``, projects both ``x_k``
and the original point ``x`` onto ``pi`` intersected with the [0, 1] box (minimal-norm
projections ``d_k`` and ``d_0``), and moves to the biased, extrapolated combination

    x_{k+1} = clip((1 - a)(x_k + eta d_k) + a (x + eta d_0), 0, 1),
    a = min(||d_k|| / (||d_k|| + ||d_0||), alpha_max).

When ``x_{k+1}`` is adversarial it is recorded if it is the closest so far, and pulled back
towards ``x``: ``x_{k+1} = x + beta (x_{k+1} - x)``. The untargeted attack picks ``t`` at each
step as the class whose linearised boundary is closest (which needs the full Jacobian);
FAB-T instead runs once per target among the ``num_target_classes`` highest-scoring
wrong classes at ``x``, one target at a time as in AutoAttack but all targets as one
batch, and keeps each example's closest adversarial example over the targets. With a
requested target ``t`` the boundary is between ``t`` and its strongest rival
``argmax_{j != t} f_j(x_k)``, so that success means ``t`` is predicted.

FAB minimises the norm; an example counts (and ``x_adv`` differs from ``x``) only when the
closest adversarial example found lies within ``eps``, as in AutoAttack.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from robustjax.attacks import threat
from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.attacks.levels import smallest_level
from robustjax.attacks.loop import resolve_unroll
from robustjax.checks import (
    check_choice,
    check_in_interval,
    check_nonnegative_float,
    check_positive_int,
    check_unroll,
)
from robustjax.losses import attack_margin
from robustjax.sharding import varying_like


def _level(slope: jax.Array, full: jax.Array, c: jax.Array) -> jax.Array:
    """Per row, the smallest ``lam >= 0`` with ``G(lam) = sum_i min(lam slope_i, full_i) >= c``
    (``slope, full >= 0``); ``inf`` when even ``sum_i full_i < c``. ``G`` is non-decreasing,
    so a binary search finds it (:func:`~robustjax.attacks.levels.smallest_level`)."""
    lam = smallest_level(lambda t: jnp.sum(jnp.minimum(t[:, None] * slope, full), axis=1) >= c, slope, full, c)
    return lam.astype(slope.dtype)


def _greedy_l1(w_abs: jax.Array, room: jax.Array, c: jax.Array) -> jax.Array:
    """Per row, the smallest l1 movement ``m`` (0 <= m <= room) with ``sum_i w_abs_i m_i = c``:
    coordinates fill up to their room in decreasing order of ``w_abs``, the last one in part.
    When ``c`` is out of reach every coordinate moves to its room."""
    batch, dim = w_abs.shape
    order = jnp.argsort(-w_abs, axis=1)
    rank = jnp.zeros_like(order).at[jnp.arange(batch)[:, None], order].set(jnp.arange(dim)[None, :])
    w_sorted, room_sorted = jnp.take_along_axis(w_abs, order, axis=1), jnp.take_along_axis(room, order, axis=1)
    filled = jnp.cumsum(w_sorted * room_sorted, axis=1)
    last = jnp.sum(filled < c[:, None], axis=1, keepdims=True)  # the coordinate filled in part
    at = jnp.minimum(last, dim - 1)
    before = jnp.where(last > 0, jnp.take_along_axis(filled, jnp.maximum(last - 1, 0), axis=1), 0.0)
    part = (c[:, None] - before) / jnp.maximum(jnp.take_along_axis(w_sorted, at, axis=1), 1e-30)
    part = jnp.clip(part, 0.0, jnp.take_along_axis(room_sorted, at, axis=1))
    return jnp.where(rank < last, room, jnp.where(rank == last, part, 0.0))


def hyperplane_box_projection(
    point: Float[Array, "n d"], w: Float[Array, "n d"], c: Float[Array, " n"], norm: str
) -> Float[Array, "n d"]:
    """FAB's projection: per row, the ``d`` of smallest ``norm`` with ``<w, d> = c`` and
    ``0 <= point + d <= 1`` (Croce & Hein 2020, Sec. 3.1), exactly.

    Every coordinate moves along ``sign(c w_i)`` within the room the box leaves it. For l2
    ``d_i = clip(lam w_i, -point_i, 1 - point_i)``, for linf ``|d_i| = min(lam, room_i)``
    with ``lam`` the smallest level at which ``<w, d(lam)>`` reaches ``c`` (:func:`_level`);
    for l1 the coordinates with the largest ``|w_i|`` move first. If the box keeps ``<w, d>`` from reaching ``c``,
    every coordinate moves to the box in its direction (the closest the box allows).
    """
    sign = jnp.where(c < 0, -1.0, 1.0)
    w = w * sign[:, None]
    c = jnp.abs(c)
    w_abs = jnp.abs(w)
    room = jnp.maximum(jnp.where(w > 0, 1.0 - point, jnp.where(w < 0, point, 0.0)), 0.0)
    if norm == "l1":
        move = _greedy_l1(w_abs, room, c)
    elif norm in ("l2", "linf"):
        lam = _level(w_abs * w_abs if norm == "l2" else w_abs, w_abs * room, c)[:, None]
        move = jnp.minimum(lam * w_abs if norm == "l2" else jnp.broadcast_to(lam, w.shape), room)
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return jnp.sign(w) * jnp.where(w_abs > 0, move, 0.0)


def _closest_boundary(classifier, images, labels, norm):
    """Untargeted FAB's choice at ``images``: ``f_j - f_y`` and its flattened gradient for the
    class ``j != y`` whose linearised boundary is closest, ``|f_j - f_y| / ||grad||_dual``
    (one forward pass and ``num_classes`` backward passes for the Jacobian)."""
    logits, pullback = jax.vjp(classifier, images)
    num_classes = logits.shape[1]
    one_hots = jnp.eye(num_classes, dtype=logits.dtype)[:, None, :]
    jac = jax.vmap(lambda cotangent: pullback(cotangent)[0])(jnp.broadcast_to(one_hots, (num_classes,) + logits.shape))
    jac = jnp.moveaxis(jac.reshape(num_classes, images.shape[0], -1), 0, 1)  # (n, classes, d)
    diff = logits - jnp.take_along_axis(logits, labels[:, None], axis=1)
    jdiff = jac - jnp.take_along_axis(jac, labels[:, None, None], axis=1)
    if norm == "linf":
        dual = jnp.abs(jdiff).sum(-1)
    elif norm == "l2":
        dual = jnp.sqrt((jdiff * jdiff).sum(-1))
    else:
        dual = jnp.abs(jdiff).max(-1)
    distance = jnp.where(jnp.arange(num_classes) == labels[:, None], jnp.inf, jnp.abs(diff) / (dual + 1e-12))
    closest = jnp.argmin(distance, axis=1)
    value = jnp.take_along_axis(diff, closest[:, None], axis=1)[:, 0]
    return value, jnp.take_along_axis(jdiff, closest[:, None, None], axis=1)[:, 0]


class _State(NamedTuple):
    x1: jax.Array  # current iterate, flattened
    best: jax.Array  # closest adversarial point so far, flattened
    best_norm: jax.Array  # its distance to x (inf when none yet)
    queries: jax.Array


@register_attack("fab")
@dataclasses.dataclass(frozen=True)
class FAB(Attack):
    """FAB-T (or untargeted FAB) minimising the linf, l2 or l1 norm; success within ``eps``.

    Attributes:
      eps: an example succeeds when its closest adversarial example is within ``eps``.
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      steps: iterations per target class.
      alpha_max: largest weight of the projection of the original point, in [0, 1].
      eta: extrapolation (overshoot) factor of the projections, >= 1.
      beta: factor, in (0, 1), pulling an adversarial iterate back towards ``x``.
      num_target_classes: FAB-T targets, the highest-scoring wrong classes at ``x``
        (clipped to ``num_classes - 1``; AutoAttack uses 9). ``None``: untargeted FAB,
        which picks the closest linearised boundary at every step from the full Jacobian.
        Ignored when an explicit ``target`` is passed.
      random_start: start each run at a random point at distance ``eps / 2`` (AutoAttack's
        start for restarts after the first) instead of at ``x``.
      unroll: ``lax.fori_loop`` unrolling (``True``, ``False`` or a factor); ``None``
        chooses per backend as PGD does (full unrolling on CPU). Rolled by default, as
        for APGD, whose 100 steps compiled for ~2 minutes fully unrolled on CPU.

    Queries: per step, one gradient (a Jacobian counts ``num_classes``) and one forward
    pass, for every run (target); plus the forward pass at ``x`` that picks the targets.
    """

    traceable = ("eps",)

    eps: float | jax.Array = 8 / 255
    norm: str = "linf"
    steps: int = 100
    alpha_max: float = 0.1
    eta: float = 1.05
    beta: float = 0.9
    num_target_classes: int | None = 9
    random_start: bool = False
    unroll: int | bool | None = False

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)
        check_choice(self.norm, threat.NORMS, "norm")
        check_positive_int(self.steps, "steps")
        check_in_interval(self.alpha_max, "alpha_max", 0.0, 1.0, closed_low=True, closed_high=True)
        check_in_interval(self.eta, "eta", 1.0, float("inf"), closed_low=True)
        check_in_interval(self.beta, "beta", 0.0, 1.0)
        if self.num_target_classes is not None:
            check_positive_int(self.num_target_classes, "num_target_classes")
        check_unroll(self.unroll)

    def start(self, key, x):
        """``x``, or a random point at distance ``eps / 2`` from it, clipped to the box."""
        if not self.random_start:
            return x
        return threat.point_at_distance(key, x, 0.5 * self.eps, self.norm)

    def run(self, classifier, x, y, key, target) -> AttackResult:
        batch, num_classes = x.shape[0], classifier.num_classes
        clean_logits = classifier(x)
        if target is not None:
            goals = target[None]
        elif self.num_target_classes is None:
            goals = None
        else:
            count = min(self.num_target_classes, num_classes - 1)
            wrong = jnp.where(jnp.arange(num_classes) == y[:, None], -jnp.inf, clean_logits)
            goals = jnp.argsort(-wrong, axis=1)[:, :count].T
        runs = 1 if goals is None else goals.shape[0]

        def tile(a):
            return None if a is None else jnp.tile(a, (runs,) + (1,) * (a.ndim - 1))

        x0, labels, success_target = tile(x), tile(y), tile(target)
        towards = None if goals is None else goals.reshape(-1)
        flat0 = x0.reshape(x0.shape[0], -1)
        already = tile(attack_margin(clean_logits, y, target) < 0)

        def linearise(images):
            """Value and flattened gradient of the function whose zero set FAB linearises."""
            if towards is None:
                return _closest_boundary(classifier, images, labels, self.norm)

            def gap(z):
                logits = classifier(z)
                if target is None:  # FAB-T: the boundary between the target and y
                    picked = jnp.take_along_axis(logits, jnp.stack([towards, labels], 1), axis=1)
                    value = picked[:, 0] - picked[:, 1]
                else:  # a requested target must beat every other class
                    value = -attack_margin(logits, labels, success_target)
                return value.sum(), value

            grad, value = jax.grad(gap, has_aux=True)(images)
            return value, grad.reshape(grad.shape[0], -1)

        grad_cost = 1 if towards is not None else num_classes
        active = (~already).astype(jnp.int32)

        def norm_of(d):
            return threat.per_example_norm(d, self.norm)

        def step(_, s: _State) -> _State:
            value, w = linearise(s.x1.reshape(x0.shape))
            # The linearised boundary through x1: value + <w, z - x1> = 0.
            d1 = hyperplane_box_projection(s.x1, w, -value, self.norm)
            d0 = hyperplane_box_projection(flat0, w, -value - ((flat0 - s.x1) * w).sum(1), self.norm)
            a1, a0 = jnp.maximum(norm_of(d1), 1e-8), jnp.maximum(norm_of(d0), 1e-8)
            bias = jnp.clip(a1 / (a1 + a0), 0.0, self.alpha_max)[:, None]
            x1 = jnp.clip((1 - bias) * (s.x1 + self.eta * d1) + bias * (flat0 + self.eta * d0), 0.0, 1.0)
            adversarial = attack_margin(classifier(x1.reshape(x0.shape)), labels, success_target) < 0
            distance = norm_of(x1 - flat0)
            closer = adversarial & (distance < s.best_norm)
            return _State(
                x1=jnp.where(adversarial[:, None], flat0 + self.beta * (x1 - flat0), x1),
                best=jnp.where(closer[:, None], x1, s.best),
                best_norm=jnp.where(closer, distance, s.best_norm),
                queries=s.queries + active * (grad_cost + 1),
            )

        x1 = self.start(key, x0).reshape(flat0.shape)
        init = _State(
            x1=x1,
            best=flat0,
            best_norm=jnp.where(already, 0.0, jnp.inf).astype(x.dtype),
            queries=jnp.zeros(x0.shape[0], jnp.int32),
        )
        s = jax.lax.fori_loop(0, self.steps, step, varying_like(init, x), unroll=resolve_unroll(self.unroll))

        best_norm = s.best_norm.reshape(runs, batch)
        winner = jnp.argmin(best_norm, axis=0)
        best = jnp.take_along_axis(s.best.reshape(runs, batch, -1), winner[None, :, None], axis=0)[0]
        found = jnp.take_along_axis(best_norm, winner[None], axis=0)[0] <= self.eps
        x_adv = jnp.where(found[:, None], best, x.reshape(batch, -1)).reshape(x.shape)
        queries = s.queries.reshape(runs, batch).sum(0) + 1
        return finalize(classifier, x_adv, y, target, queries)
