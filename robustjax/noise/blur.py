"""Blur corruptions of ImageNet-C: defocus, glass, motion and zoom blur, and gaussian blur.

Definitions follow Hendrycks & Dietterich (ICLR 2019) as the ``imagecorruptions`` package
implements them for any image size; the CIFAR-10-C constants are those of the same
authors' ``make_cifar_c.py``. Kernels depend only on a severity's constants, so they are
built on the host (NumPy) while tracing and enter the program as constants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage
from jax import lax
from jaxtyping import Array, Float, Int

from robustjax.noise.registry import register_corruption
from robustjax.ops.blur import filter_valid, gaussian_filter

# ----------------------------------------------------------------------------- filters


def _opencv_gaussian_taps(size: int, sigma: float) -> np.ndarray:
    """``cv2.getGaussianKernel(size, sigma)`` for ``sigma > 0``."""
    t = np.arange(size) - (size - 1) / 2
    taps = np.exp(-(t**2) / (2 * sigma**2))
    return taps / taps.sum()


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """The defocus kernel of ImageNet-C: a normalised disk, anti-aliased by a small Gaussian.

    The disk lives on a 17 x 17 grid (radius <= 8) or a (2r+1)^2 grid, and is smoothed by
    OpenCV's ``GaussianBlur`` (3 x 3, or 5 x 5 for large radii; reflect-101 border).
    """
    half, size = (8, 3) if radius <= 8 else (int(radius), 5)
    t = np.arange(-half, half + 1)
    disk = (t[:, None] ** 2 + t[None, :] ** 2 <= radius**2).astype(np.float32)
    disk /= disk.sum()
    taps = _opencv_gaussian_taps(size, alias_blur).astype(np.float32)
    for axis in (0, 1):
        disk = scipy.ndimage.correlate1d(disk, taps, axis=axis, mode="mirror")
    return disk


# ----------------------------------------------------------------------------- motion blur


def motion_blur_at_angle(
    x: Float[Array, "b h w c"], radius: int, sigma: float, angle: Float[Array, " b"]
) -> Float[Array, "b h w c"]:
    """ImageMagick's ``-motion-blur radius x sigma + angle``, per image of the batch.

    Output pixel ``p`` is ``sum_i k_i x(p + o_i)`` over ``i = 0 .. 2 radius``, with one-sided
    Gaussian weights ``k_i ~ exp(-i^2 / 2 sigma^2)`` and offsets
    ``o_i = (ceil(i sin a - 1/2), ceil(i cos a - 1/2))`` (rows, columns) along the direction
    ``a`` in degrees; outside the image the edge pixel repeats. Taps whose offset reaches
    beyond the image are dropped, as ``imagecorruptions`` does.
    """
    _, height, width, _ = x.shape
    steps = np.arange(2 * radius + 1)
    taps = np.exp(-(steps**2) / (2.0 * sigma**2))
    taps /= taps.sum()
    a = jnp.deg2rad(angle.astype(jnp.float32))[:, None]
    dy = jnp.ceil(steps * jnp.sin(a) - 0.5).astype(jnp.int32)  # (B, taps)
    dx = jnp.ceil(steps * jnp.cos(a) - 0.5).astype(jnp.int32)
    weights = jnp.where(
        (jnp.abs(dy) < height) & (jnp.abs(dx) < width), jnp.asarray(taps, x.dtype), 0
    )
    rows0, cols0 = jnp.arange(height), jnp.arange(width)
    out = jnp.zeros_like(x)
    for i in range(len(steps)):  # static number of taps: one fused gather-and-add each
        rows = jnp.clip(rows0 + dy[:, i, None], 0, height - 1)
        cols = jnp.clip(cols0 + dx[:, i, None], 0, width - 1)
        shifted = jnp.take_along_axis(x, rows[:, :, None, None], axis=1)
        shifted = jnp.take_along_axis(shifted, cols[:, None, :, None], axis=2)
        out = out + weights[:, i, None, None, None] * shifted
    return out


# ----------------------------------------------------------------------------- zoom blur


def _zoom_sample_points(size: int, factor: float) -> np.ndarray:
    """Source coordinates of the first ``size`` outputs of ``clipped_zoom`` along one axis.

    The central ``ceil(size / factor)`` pixels are enlarged by ``scipy.ndimage.zoom(order=1)``
    (whose output ``o`` samples input ``o (n_in - 1) / (n_out - 1)``) and the first ``size``
    outputs kept.
    """
    crop = int(np.ceil(size / float(factor)))
    top = (size - crop) // 2
    zoomed = round(crop * factor)
    step = (crop - 1) / (zoomed - 1) if zoomed > 1 else 0.0
    return top + np.arange(size) * step


def _linear_resample(x: jax.Array, points: np.ndarray, axis: int) -> jax.Array:
    """Linear interpolation of ``x`` at fractional indices ``points`` along ``axis``."""
    lower = np.clip(np.floor(points), 0, x.shape[axis] - 1).astype(np.int32)
    upper = np.minimum(lower + 1, x.shape[axis] - 1)
    frac_shape = [1] * x.ndim
    frac_shape[axis] = len(points)
    frac = jnp.asarray((points - lower).reshape(frac_shape), x.dtype)
    return jnp.take(x, lower, axis=axis) * (1 - frac) + jnp.take(x, upper, axis=axis) * frac


# ----------------------------------------------------------------------------- glass blur


def _shuffle_sources(offsets: Int[Array, "b h w 2"], max_delta: int) -> Int[Array, "b n"]:
    """Flat source index of every pixel after one pass of ImageNet-C's local pixel shuffle."""
    batch, height, width, _ = offsets.shape
    h = np.arange(height)[:, None]
    w = np.arange(width)[None, :]
    visited = (
        (h > max_delta) & (h <= height - max_delta) & (w > max_delta) & (w <= width - max_delta)
    )
    here = np.broadcast_to(h * width + w, (height, width))
    partner_h = jnp.where(visited, h + offsets[..., 0], h)
    partner_w = jnp.where(visited, w + offsets[..., 1], w)
    partner = partner_h * width + partner_w
    # The partner was already overwritten when it lies later in raster order, i.e. earlier in
    # the reference's bottom-up, right-to-left sweep: then this pixel takes its final value.
    follows = jnp.asarray(visited)[partner_h, partner_w] & (partner > here)
    jump = jnp.where(follows, partner, here).reshape(batch, -1)

    # Pointer jumping: double every pointer until each reaches its chain's end (a fixed point).
    # Chains are short (geometric), so a few rounds end them; log2(H W) rounds always do.
    def unfinished(state):
        jump, doubled = state
        return (doubled != jump).any()

    def double(state):
        jump = state[1]
        return jump, jnp.take_along_axis(jump, jump, axis=1)

    jump = lax.while_loop(unfinished, double, (jump, jnp.take_along_axis(jump, jump, axis=1)))[0]
    return jnp.take_along_axis(partner.reshape(batch, -1), jump, axis=1)


def glass_shuffle(
    x: Float[Array, "b h w c"], offsets: Int[Array, "b h w 2"], max_delta: int
) -> Float[Array, "b h w c"]:
    """One pass of ImageNet-C's local pixel shuffle, computed in parallel.

    The reference visits the pixels ``p = (h, w)`` with ``max_delta < h <= H - max_delta``
    (same for ``w``) from the bottom-right corner up, and "swaps" each with ``p + o_p``,
    ``o_p = offsets[p]`` (``(dy, dx)``, uniform in ``[-max_delta, max_delta)``). On an
    H x W x 3 NumPy array that swap is, through view aliasing, the copy
    ``x[p] <- x[p + o_p]``, and ImageNet-C and CIFAR-10-C were generated that way; this
    function reproduces it exactly. Since each pixel is written once, at its visit,
    ``out[p] = out[p + o_p]`` when ``p + o_p`` was visited before ``p`` and
    ``x[p + o_p]`` otherwise: source indices follow pointer chains, which pointer jumping
    resolves in ``log2(H W)`` parallel gathers instead of ``H W`` sequential steps, with the
    same output as the sequential loop for the same offsets.
    """
    batch, height, width, channels = x.shape
    sources = _shuffle_sources(offsets, max_delta)
    flat = x.reshape(batch, height * width, channels)
    return jnp.take_along_axis(flat, sources[..., None], axis=1).reshape(x.shape)


def glass_blur_with_offsets(
    x: Float[Array, "b h w c"], sigma: float, max_delta: int, offsets: Int[Array, "k b h w 2"]
) -> Float[Array, "b h w c"]:
    """Glass blur given the shuffle offsets of each of its ``k`` passes.

    Gaussian blur, truncation to 8 bits (the reference stores the blurred image as uint8),
    ``k`` passes of ``glass_shuffle``, Gaussian blur again.
    """
    y = jnp.floor(gaussian_filter(x, sigma) * 255) / 255
    for step_offsets in offsets:  # 1 to 3 passes, a static count
        y = glass_shuffle(y, step_offsets, max_delta)
    return gaussian_filter(y, sigma)


# ----------------------------------------------------------------------------- corruptions


@register_corruption(
    "defocus_blur",
    family="blur",
    imagenet=((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
    cifar=((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
    stochastic=False,
)
def defocus_blur(x: Float[Array, "b h w c"], c: tuple, key: jax.Array) -> Float[Array, "b h w c"]:
    """Convolution with ``disk_kernel(radius, alias_blur)``, reflect-101 border (OpenCV's)."""
    del key
    kernel = disk_kernel(*c)
    pad = kernel.shape[0] // 2
    return filter_valid(
        jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect"), kernel
    )


@register_corruption(
    "glass_blur",
    family="blur",
    imagenet=((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
    cifar=((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    stochastic=True,
)
def glass_blur(x: Float[Array, "b h w c"], c: tuple, key: jax.Array) -> Float[Array, "b h w c"]:
    """``glass_blur_with_offsets`` with ``(sigma, max_delta, passes)`` and offsets drawn from ``key``."""
    sigma, max_delta, passes = c
    # (dy, dx) uniform on [-max_delta, max_delta)^2, from one draw per pixel instead of two.
    span = 2 * max_delta
    pair = jax.random.randint(key, (passes,) + x.shape[:3], 0, span * span)
    offsets = jnp.stack([pair // span, pair % span], axis=-1) - max_delta
    return glass_blur_with_offsets(x, sigma, max_delta, offsets)


@register_corruption(
    "motion_blur",
    family="blur",
    imagenet=((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
    cifar=((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
    stochastic=True,
)
def motion_blur(x: Float[Array, "b h w c"], c: tuple, key: jax.Array) -> Float[Array, "b h w c"]:
    """``motion_blur_at_angle(radius, sigma)`` at an angle uniform in [-45, 45) degrees per image."""
    angle = jax.random.uniform(key, x.shape[:1], minval=-45.0, maxval=45.0)
    return motion_blur_at_angle(x, *c, angle)


def _zoom_factors(stop: float, step: float) -> tuple[float, ...]:
    # np.arange, float quirks included: the reference loops over exactly these factors.
    return tuple(np.arange(1, stop, step).tolist())


@register_corruption(
    "zoom_blur",
    family="blur",
    imagenet=tuple(
        _zoom_factors(*a)
        for a in ((1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03))
    ),
    cifar=tuple(
        _zoom_factors(*a)
        for a in ((1.06, 0.01), (1.11, 0.01), (1.16, 0.01), (1.21, 0.01), (1.26, 0.01))
    ),
    stochastic=False,
)
def zoom_blur(
    x: Float[Array, "b h w c"], factors: tuple, key: jax.Array
) -> Float[Array, "b h w c"]:
    """Mean of the image and its central zooms by each factor (bilinear, top-left aligned).

    Each zoom is ``imagecorruptions``' ``clipped_zoom``: the central ``ceil(n / z)`` pixels
    of each axis enlarged by ``z`` and cut to the first ``n``. (``make_cifar_c.py`` cuts
    the centre instead, a shift of at most a pixel; we follow ``imagecorruptions`` for
    both presets.)
    """
    del key
    _, height, width, _ = x.shape
    out = x
    for factor in factors:  # a static list of 6 to 16 factors
        zoomed = _linear_resample(x, _zoom_sample_points(height, factor), axis=1)
        out = out + _linear_resample(zoomed, _zoom_sample_points(width, factor), axis=2)
    return out / (len(factors) + 1)


@register_corruption(
    "gaussian_blur",
    family="extra",
    imagenet=(1, 2, 3, 4, 6),
    cifar=(0.4, 0.6, 0.7, 0.8, 1),
    stochastic=False,
)
def gaussian_blur(
    x: Float[Array, "b h w c"], sigma: float, key: jax.Array
) -> Float[Array, "b h w c"]:
    """``gaussian_filter(x, sigma)``."""
    del key
    return gaussian_filter(x, sigma)
