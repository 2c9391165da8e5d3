"""Per-pixel noise corruptions of ImageNet-C: gaussian, shot (Poisson), impulse (salt and
pepper) and speckle (multiplicative) noise.

Each draws one independent sample per pixel and channel, as the reference does
(Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions
and Perturbations", ICLR 2019; constants from ``imagecorruptions`` and ``make_cifar_c.py``).
``corrupt`` clips the result to [0, 1].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from robustjax.noise.registry import register_corruption
from robustjax.sharding import varying_like


@register_corruption(
    "gaussian_noise",
    family="noise",
    imagenet=(0.08, 0.12, 0.18, 0.26, 0.38),
    cifar=(0.04, 0.06, 0.08, 0.09, 0.10),
    stochastic=True,
)
def gaussian_noise(
    x: Float[Array, "b h w c"], sigma: float, key: jax.Array
) -> Float[Array, "b h w c"]:
    """Additive noise: ``x + sigma * N(0, 1)``."""
    return x + sigma * jax.random.normal(key, x.shape, x.dtype)


# Rates below this use inversion, the rest transformed rejection (the split NumPy uses).
_INVERSION_MAX_RATE = 10.0


def _poisson_by_inversion(u: jax.Array, rate: jax.Array) -> jax.Array:
    """Poisson samples for rates below ``_INVERSION_MAX_RATE`` from uniforms ``u``: the least
    ``k`` with ``F(k) >= u``.

    One uniform per value and a cheap arithmetic loop, where Knuth's method (which
    ``jax.random.poisson`` uses for small rates) draws a fresh uniform array per step.
    """

    def searching(state):
        _, pmf, cdf, _ = state
        # pmf > 1e-9: stop where float32 rounding of the cdf, not u, would decide.
        return (u > cdf) & (pmf > 1e-9)

    def step(state):
        j, pmf, cdf, count = state
        count = count + searching(state)
        pmf = pmf * rate / (j + 1)
        return j + 1, pmf, cdf + pmf, count

    pmf0 = jnp.exp(-rate)
    state = (jnp.zeros((), rate.dtype), pmf0, pmf0, jnp.zeros(rate.shape, jnp.int32))
    return lax.while_loop(lambda s: searching(s).any(), step, varying_like(state, u, rate))[3]


def _ptrs_round(uv: jax.Array, rate: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One round of Hormann's transformed rejection (PTRS, 1993) for rates >= 10.

    ``uv`` holds two uniforms per rate (leading axis). Returns a candidate count and whether
    it was accepted (about 89% are); accepted counts are exact Poisson samples.
    """
    u, v = uv[0] - 0.5, uv[1]
    b = 0.931 + 2.53 * jnp.sqrt(rate)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)
    us = 0.5 - jnp.abs(u)
    k = jnp.floor((2 * a / us + b) * u + rate + 0.43)
    squeeze = (us >= 0.07) & (v <= v_r)
    reject = (k < 0) | ((us < 0.013) & (v > us))
    log_ratio = jnp.log(v * inv_alpha / (a / (us * us) + b))
    exact = log_ratio <= -rate + k * jnp.log(rate) - lax.lgamma(k + 1)
    return k, squeeze | (~reject & exact)


def _poisson_by_rejection(uv: jax.Array, key: jax.Array, rate: jax.Array) -> jax.Array:
    """Poisson samples for rates >= 10 by PTRS: one round on every value (uniforms ``uv``),
    then rounds (uniforms from ``key``) on the still rejected ones only, gathered (up to an
    eighth of the values at a time) into a smaller array. Each value keeps its first
    accepted candidate, so the result is exact.
    """
    flat = rate.reshape(-1)
    counts, accepted = _ptrs_round(uv.reshape(2, -1), flat)
    size = min(flat.size, flat.size // 8 + 64)

    def retry(state):
        i, counts, accepted = state
        (redo,) = jnp.nonzero(~accepted, size=size, fill_value=flat.size)  # flat.size: no value
        rates = flat.at[redo].get(mode="fill", fill_value=_INVERSION_MAX_RATE)
        candidates, ok = _ptrs_round(
            jax.random.uniform(jax.random.fold_in(key, i), (2, size)), rates
        )
        return (
            i + 1,
            counts.at[redo].set(candidates, mode="drop"),
            accepted.at[redo].set(ok, mode="drop"),
        )

    _, counts, _ = lax.while_loop(lambda s: ~s[2].all(), retry, (0, counts, accepted))
    return counts.reshape(rate.shape).astype(jnp.int32)


@register_corruption(
    "shot_noise",
    family="noise",
    imagenet=(60, 25, 12, 5, 3),
    cifar=(500, 250, 100, 75, 50),
    stochastic=True,
)
def shot_noise(
    x: Float[Array, "b h w c"], photons: float, key: jax.Array
) -> Float[Array, "b h w c"]:
    """Photon noise: ``Poisson(photons * x) / photons`` (fewer photons, more noise)."""
    rate = x * photons
    draw_key, retry_key = jax.random.split(key)
    rejection = photons >= _INVERSION_MAX_RATE  # static: whether some rates may need it
    u = jax.random.uniform(draw_key, (3 if rejection else 1,) + x.shape, x.dtype)
    small = rate < _INVERSION_MAX_RATE
    counts = _poisson_by_inversion(u[0], jnp.where(small, rate, 0.0))
    if rejection:
        large = _poisson_by_rejection(u[1:], retry_key, jnp.where(small, _INVERSION_MAX_RATE, rate))
        counts = jnp.where(small, counts, large)
    return counts.astype(x.dtype) / photons


@register_corruption(
    "impulse_noise",
    family="noise",
    imagenet=(0.03, 0.06, 0.09, 0.17, 0.27),
    cifar=(0.01, 0.02, 0.03, 0.05, 0.07),
    stochastic=True,
)
def impulse_noise(
    x: Float[Array, "b h w c"], amount: float, key: jax.Array
) -> Float[Array, "b h w c"]:
    """Salt and pepper: each value becomes 0 or 1, with probability ``amount / 2`` each.

    As ``skimage.util.random_noise(mode="s&p", salt_vs_pepper=0.5)``, which the reference
    calls; values are hit independently per channel.
    """
    u = jax.random.uniform(key, x.shape, x.dtype)
    return jnp.where(u < amount, (u >= amount / 2).astype(x.dtype), x)


@register_corruption(
    "speckle_noise",
    family="extra",
    imagenet=(0.15, 0.2, 0.35, 0.45, 0.6),
    cifar=(0.06, 0.1, 0.12, 0.16, 0.2),
    stochastic=True,
)
def speckle_noise(
    x: Float[Array, "b h w c"], sigma: float, key: jax.Array
) -> Float[Array, "b h w c"]:
    """Multiplicative noise: ``x * (1 + sigma * N(0, 1))``."""
    return x + x * sigma * jax.random.normal(key, x.shape, x.dtype)
