"""The l1 threat model of images: the l1 ball intersected with the [0, 1] box.

Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks on image classifiers",
ICML 2021: for an image ``x`` the effective threat set is
``S(x) = {d : ||d||_1 <= eps, 0 <= x + d <= 1}``, and attacks that project onto the l1 ball
and then clip to the box (or step along the plain l1 steepest-ascent direction) waste
their budget on coordinates the box does not let move. This module holds the exact
projection onto ``S(x)``, the sparse ascent direction of l1-APGD and a random start in
``S(x)``. Every function acts on each example of a batch separately.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

_TINY = 1e-30


def _flat(a: jax.Array) -> jax.Array:
    return a.reshape(a.shape[0], -1)


def _soft_threshold_level(mag: jax.Array, room: jax.Array, eps: jax.Array) -> jax.Array:
    """The smallest ``lam >= 0`` with ``h(lam) = sum_j clip(mag_j - lam, 0, room_j) <= eps``, per row.

    ``h`` is piecewise linear and non-increasing: coordinate ``j`` grows (as ``lam``
    falls) between its kinks ``mag_j`` and ``mag_j - room_j``. Sorting the kinks in
    decreasing order and accumulating slopes gives ``h`` at every kink, hence the
    segment where ``h`` crosses ``eps`` and ``lam`` on it, exactly.
    """
    kinks = jnp.concatenate([mag, jnp.maximum(mag - room, 0.0)], axis=1)
    slope_steps = jnp.concatenate([jnp.ones_like(mag), -jnp.ones_like(mag)], axis=1)
    order = jnp.argsort(-kinks, axis=1)
    kinks = jnp.take_along_axis(kinks, order, axis=1)
    slope = jnp.cumsum(jnp.take_along_axis(slope_steps, order, axis=1), axis=1)  # -h' below each kink
    rise = slope[:, :-1] * (kinks[:, :-1] - kinks[:, 1:])
    h = jnp.concatenate([jnp.zeros_like(kinks[:, :1]), jnp.cumsum(rise, axis=1)], axis=1)
    last = jnp.sum(h <= eps[:, None], axis=1, keepdims=True) - 1  # h is non-decreasing
    kink, h_kink, rate = (jnp.take_along_axis(a, last, axis=1)[:, 0] for a in (kinks, h, slope))
    return jnp.maximum(kink - (eps - h_kink) / jnp.maximum(rate, 1.0), 0.0)


def project_l1_box(
    x: Float[Array, "b ..."], delta: Float[Array, "b ..."], eps: float | Float[Array, ""] | Float[Array, " b"]
) -> Float[Array, "b ..."]:
    """Euclidean projection of each ``delta_i`` onto ``{d : ||d||_1 <= eps, 0 <= x_i + d <= 1}``.

    The minimiser of ``||d - v||_2`` over that set is a soft threshold clipped to the box,
    ``d_j = sign(v_j) * clip(|v_j| - lam, 0, r_j)`` with ``r_j = 1 - x_j`` where
    ``v_j > 0`` and ``r_j = x_j`` otherwise (the room the box leaves in the direction of
    ``v_j``), and ``lam >= 0`` the smallest threshold that meets the budget (``lam = 0``
    when the box alone does). ``lam`` is found exactly by sorting the kinks of the
    budget as a function of ``lam`` (``L1_projection`` in AutoAttack). ``x`` must lie in
    [0, 1]; ``eps`` is a scalar or one radius per example.
    """
    batch = x.shape[0]
    v, x_flat = _flat(delta), _flat(x)
    mag = jnp.abs(v)
    room = jnp.maximum(jnp.where(v > 0, 1.0 - x_flat, x_flat), 0.0)
    eps = jnp.broadcast_to(jnp.asarray(eps, v.dtype), (batch,))
    level = _soft_threshold_level(mag, room, eps)
    d = jnp.sign(v) * jnp.clip(mag - level[:, None], 0.0, room)
    # The threshold is exact up to float rounding; shrinking towards 0 keeps d in the box.
    total = jnp.abs(d).sum(axis=1)
    d = d * jnp.minimum(1.0, eps / jnp.maximum(total, _TINY))[:, None]
    return d.reshape(delta.shape)


def sparse_l1_direction(
    grad: Float[Array, "b ..."], x_adv: Float[Array, "b ..."], k: int | Int[Array, " b"]
) -> Float[Array, "b ..."]:
    """The sparse ascent direction of l1-APGD (Croce & Hein 2021), with unit l1 norm.

    ``sign(grad_j) / n`` on the ``k`` coordinates with the largest ``|grad_j|`` among those
    that can still move along the gradient inside the box (``x_j < 1`` where
    ``grad_j > 0``, ``x_j > 0`` where ``grad_j < 0``), zero elsewhere; ``n`` is the number
    of chosen coordinates (more than ``k`` only on ties, fewer when fewer can move).
    ``k`` is a count, a scalar or one per example, clipped to [1, dimension].
    """
    batch = grad.shape[0]
    g, x_flat = _flat(grad), _flat(x_adv)
    movable = ((g > 0) & (x_flat < 1.0)) | ((g < 0) & (x_flat > 0.0))
    score = jnp.where(movable, jnp.abs(g), 0.0)
    k = jnp.clip(jnp.broadcast_to(jnp.asarray(k, jnp.int32), (batch,)), 1, g.shape[1])
    ranked = -jnp.sort(-score, axis=1)
    threshold = jnp.take_along_axis(ranked, (k - 1)[:, None], axis=1)
    chosen = (score >= threshold) & (score > 0)
    direction = jnp.where(chosen, jnp.sign(g), 0.0) / jnp.maximum(chosen.sum(axis=1, keepdims=True), 1)
    return direction.reshape(grad.shape)


def l1_random_start(
    key: jax.Array, x: Float[Array, "b ..."], eps: float | Float[Array, ""] | Float[Array, " b"]
) -> Float[Array, "b ..."]:
    """``x`` plus the projection of a standard Gaussian onto ``S(x)``, as AutoAttack's
    l1-APGD starts. The Gaussian's l1 norm is far above ``eps`` in image dimensions, so
    the start lies on the l1 sphere, spread over the coordinates the box lets move."""
    noise = jax.random.normal(key, x.shape, x.dtype)
    return jnp.clip(x + project_l1_box(x, noise, eps), 0.0, 1.0)
