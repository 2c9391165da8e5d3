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

from robustjax.attacks.levels import smallest_level

_TINY = 1e-30


def _flat(a: jax.Array) -> jax.Array:
    return a.reshape(a.shape[0], -1)


def _soft_threshold_level(mag: jax.Array, room: jax.Array, eps: jax.Array) -> jax.Array:
    """The smallest ``lam >= 0`` with ``h(lam) = sum_j clip(mag_j - lam, 0, room_j) <= eps``, per row.

    ``h`` is non-increasing in ``lam``, so a binary search finds it
    (:func:`~robustjax.attacks.levels.smallest_level`).
    """
    level = smallest_level(lambda t: jnp.sum(jnp.clip(mag - t[:, None], 0.0, room), axis=1) <= eps, mag, room, eps)
    return level.astype(mag.dtype)


def project_l1_box(
    x: Float[Array, "b ..."], delta: Float[Array, "b ..."], eps: float | Float[Array, ""] | Float[Array, " b"]
) -> Float[Array, "b ..."]:
    """Euclidean projection of each ``delta_i`` onto ``{d : ||d||_1 <= eps, 0 <= x_i + d <= 1}``.

    The minimiser of ``||d - v||_2`` over that set is a soft threshold clipped to the box,
    ``d_j = sign(v_j) * clip(|v_j| - lam, 0, r_j)`` with ``r_j = 1 - x_j`` where
    ``v_j > 0`` and ``r_j = x_j`` otherwise (the room the box leaves in the direction of
    ``v_j``), and ``lam >= 0`` the smallest threshold that meets the budget (``lam = 0``
    when the box alone does). ``lam`` is found by a binary search on the budget as a
    function of ``lam`` (AutoAttack's ``L1_projection`` sorts its kinks instead). ``x``
    must lie in [0, 1]; ``eps`` is a scalar or one radius per example.
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
    # The k-th largest score: the smallest t with fewer than k scores above it.
    threshold = smallest_level(lambda t: jnp.sum(score > t[:, None], axis=1) < k, score, k)[:, None]
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
