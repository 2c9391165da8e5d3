"""Lp threat models: per-example norms, projections, steepest-ascent steps, random starts.

Perturbations ``delta`` are batches (B, H, W, C); every function acts on each example
separately. Projections onto the linf and l2 balls come from ``optax.projections``; the
l1 threat set (the l1 ball intersected with the box) lives in :mod:`robustjax.attacks.l1`.
"""

from __future__ import annotations

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


def project(delta: Float[Array, "b ..."], eps: float, norm: str) -> Float[Array, "b ..."]:
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


def ascent_step(
    x: Float[Array, "b ..."], x_adv: Float[Array, "b ..."], grad: Float[Array, "b ..."],
    step_size: float, eps: float, norm: str, l1_sparsity: float,
) -> Float[Array, "b ..."]:
    """One projected steepest-ascent step from ``x_adv``, back into the threat set of ``x``.

    linf/l2: move along :func:`ascent_direction`, project onto the ball, clip to [0, 1].
    l1: move along the sparse direction on the top ``l1_sparsity`` fraction of the
    coordinates the box lets move, then project exactly onto the l1 ball intersected with
    the box (Croce & Hein, "Mind the box", ICML 2021).
    """
    if norm == "l1":
        k = max(1, round(l1_sparsity * x[0].size))
        moved = x_adv + step_size * sparse_l1_direction(grad, x_adv, k)
        return jnp.clip(x + project_l1_box(x, moved - x, eps), 0.0, 1.0)
    moved = x_adv + step_size * ascent_direction(grad, norm)
    return jnp.clip(x + project(moved - x, eps, norm), 0.0, 1.0)


def random_start(key: jax.Array, x: Float[Array, "b ..."], eps: float, norm: str) -> Float[Array, "b ..."]:
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
        dim = x[0].size
        radius = eps * jax.random.uniform(radius_key, (x.shape[0],), x.dtype) ** (1.0 / dim)
        delta = direction * radius.reshape((-1,) + (1,) * (x.ndim - 1))
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return jnp.clip(x + delta, 0.0, 1.0)
