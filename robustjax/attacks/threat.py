"""Lp threat models: per-example norms, projections, steepest-ascent steps, random starts.

Perturbations ``delta`` are batches (B, H, W, C); every function acts on each example
separately. Projections onto the linf and l2 balls come from ``optax.projections``; the
l1 threat set (the l1 ball intersected with the box) lives in :mod:`robustjax.attacks.l1`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float

from robustjax.attacks.l1 import l1_random_start, project_l1_box, sparse_l1_direction

NORMS = ("linf", "l2", "l1")
_TINY = 1e-12


def per_example_norm(delta: Float[Array, "b ..."], norm: str) -> Float[Array, " b"]:
    """||delta_i||_p for each example (p in linf, l2, l1, l0)."""
    flat = delta.reshape(delta.shape[0], -1)
    if norm == "linf":
        return jnp.abs(flat).max(axis=1)
    if norm == "l2":
        return jnp.sqrt(jnp.sum(flat * flat, axis=1))
    if norm == "l1":
        return jnp.abs(flat).sum(axis=1)
    if norm == "l0":
        return jnp.sum(flat != 0, axis=1).astype(delta.dtype)
    raise ValueError(f"unknown norm {norm!r}")


def project(delta: Float[Array, "b ..."], eps: float | Float[Array, ""], norm: str) -> Float[Array, "b ..."]:
    """Euclidean projection of each example's perturbation onto the eps-ball of ``norm``."""
    if norm == "linf":
        return jax.vmap(optax.projections.projection_linf_ball, in_axes=(0, None))(delta, eps)
    if norm == "l2":
        return jax.vmap(optax.projections.projection_l2_ball, in_axes=(0, None))(delta, eps)
    raise ValueError(f"unknown norm {norm!r}")


def ascent_direction(grad: Float[Array, "b ..."], norm: str) -> Float[Array, "b ..."]:
    """Steepest-ascent direction of unit ``norm``: sign(g) for linf, g / ||g||_2 for l2."""
    if norm == "linf":
        return jnp.sign(grad)
    if norm == "l2":
        scale = per_example_norm(grad, "l2") + _TINY
        return grad / scale.reshape((-1,) + (1,) * (grad.ndim - 1))
    raise ValueError(f"unknown norm {norm!r}")


def into_threat_set(x: Float[Array, "b ..."], point: Float[Array, "b ..."], eps, norm: str) -> Float[Array, "b ..."]:
    """``point`` moved back into the threat set of ``x``: the eps-ball of ``norm`` and [0, 1].

    linf/l2: project onto the ball, then clip to the box. l1: project exactly onto the l1
    ball intersected with the box (Croce & Hein, "Mind the box", ICML 2021).
    """
    if norm == "l1":
        return jnp.clip(x + project_l1_box(x, point - x, eps), 0.0, 1.0)
    return jnp.clip(x + project(point - x, eps, norm), 0.0, 1.0)


def ascent_step(
    x: Float[Array, "b ..."], x_adv: Float[Array, "b ..."], grad: Float[Array, "b ..."],
    step_size, eps, norm: str, l1_k,
) -> Float[Array, "b ..."]:
    """One projected steepest-ascent step from ``x_adv``, back into the threat set of ``x``.

    linf/l2: move along :func:`ascent_direction`. l1: move along the sparse direction on
    the top ``l1_k`` coordinates (a count, scalar or per example) that the box lets move.
    ``step_size`` is a scalar or one value per example.
    """
    direction = sparse_l1_direction(grad, x_adv, l1_k) if norm == "l1" else ascent_direction(grad, norm)
    step_size = jnp.reshape(jnp.asarray(step_size, x.dtype), (-1,) + (1,) * (x.ndim - 1))
    return into_threat_set(x, x_adv + step_size * direction, eps, norm)


def example_size(x: Float[Array, "b ..."]) -> int:
    """The number of coordinates of one example (read from the shape, never the data)."""
    return math.prod(x.shape[1:])


def l1_count(fraction: float, x: Float[Array, "b ..."]) -> int:
    """How many coordinates an l1 step moving ``fraction`` of them changes (at least 1)."""
    return max(1, round(fraction * example_size(x)))


def point_at_distance(key: jax.Array, x: Float[Array, "b ..."], radius, norm: str) -> Float[Array, "b ..."]:
    """``x`` plus random noise (uniform for linf, Gaussian otherwise) scaled to ``norm``
    ``radius``, clipped to [0, 1]: the random start of AutoAttack's APGD and FAB."""
    if norm == "linf":
        noise = jax.random.uniform(key, x.shape, x.dtype, -1.0, 1.0)
    else:
        noise = jax.random.normal(key, x.shape, x.dtype)
    scale = radius / (per_example_norm(noise, norm) + _TINY)
    return jnp.clip(x + noise * scale.reshape((-1,) + (1,) * (x.ndim - 1)), 0.0, 1.0)


def random_start(key: jax.Array, x: Float[Array, "b ..."], eps: float | Float[Array, ""], norm: str) -> Float[Array, "b ..."]:
    """A random point of each threat set around ``x``, inside [0, 1].

    linf: uniform in the ball. l2: radius ``eps * U^(1/d)`` along a Gaussian direction,
    uniform in the ball (a plain ``eps * U`` radius would crowd the centre). l1: a
    Gaussian projected onto the l1 ball intersected with the box.
    """
    if norm == "l1":
        return l1_random_start(key, x, eps)
    if norm == "linf":
        delta = jax.random.uniform(key, x.shape, x.dtype, -eps, eps)
    elif norm == "l2":
        direction_key, radius_key = jax.random.split(key)
        direction = ascent_direction(jax.random.normal(direction_key, x.shape, x.dtype), "l2")
        dim = example_size(x)
        radius = eps * jax.random.uniform(radius_key, (x.shape[0],), x.dtype) ** (1.0 / dim)
        delta = direction * radius.reshape((-1,) + (1,) * (x.ndim - 1))
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return jnp.clip(x + delta, 0.0, 1.0)
