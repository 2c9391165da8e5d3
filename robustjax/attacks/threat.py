"""Lp threat models: per-example norms, projections, steepest-ascent steps, random starts.

Perturbations ``delta`` are batches (B, H, W, C); every function acts on each example
separately. Projections onto the balls come from ``optax.projections``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float

NORMS = ("linf", "l2")
_TINY = 1e-12


def per_example_norm(delta: Float[Array, "b ..."], norm: str) -> Float[Array, " b"]:
    """||delta_i||_p for each example (p in linf, l2, l0)."""
    flat = delta.reshape(delta.shape[0], -1)
    if norm == "linf":
        return jnp.abs(flat).max(axis=1)
    if norm == "l2":
        return jnp.sqrt(jnp.sum(flat * flat, axis=1))
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


def random_start(key: jax.Array, x: Float[Array, "b ..."], eps: float, norm: str) -> Float[Array, "b ..."]:
    """A point drawn uniformly from each eps-ball around ``x``, clipped to [0, 1].

    For l2 the radius is ``eps * U^(1/d)`` along a Gaussian direction, which is uniform
    in the ball (a plain ``eps * U`` radius would crowd the centre).
    """
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
