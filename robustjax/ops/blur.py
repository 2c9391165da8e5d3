"""Gaussian blur and the FFT filter behind it: the noise's blur corruptions and the
behaviour metrics' RGB both use them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


def filter_valid(x: jax.Array, kernel: np.ndarray) -> jax.Array:
    """Cross-correlates every channel of ``x`` with the 2-D ``kernel``, no padding ("valid").

    By FFT, whose cost does not grow with the kernel (up to 49 x 49 here): on a 2-core CPU
    it ran 12-25x faster than XLA's depthwise convolution at 224 x 224.
    """
    (kh, kw), (height, width) = kernel.shape, x.shape[1:3]
    flipped = jnp.asarray(kernel[::-1, ::-1], x.dtype)
    spectrum = (
        jnp.fft.rfft2(x, axes=(1, 2)) * jnp.fft.rfft2(flipped, s=(height, width))[None, :, :, None]
    )
    full = jnp.fft.irfft2(spectrum, s=(height, width), axes=(1, 2))
    # Circular wrap-around only reaches the first kh - 1 rows and kw - 1 columns.
    return full[:, kh - 1 :, kw - 1 :, :].astype(x.dtype)


def _gaussian_taps(sigma: float, truncate: float = 4.0) -> np.ndarray:
    """The 1-D kernel of ``scipy.ndimage.gaussian_filter``: radius ``int(truncate * sigma + 0.5)``."""
    radius = int(truncate * sigma + 0.5)
    t = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.exp(-0.5 * (t / sigma) ** 2)
    return taps / taps.sum()


def gaussian_filter(x: Float[Array, "b h w c"], sigma: float) -> Float[Array, "b h w c"]:
    """Gaussian blur of each channel, as ``skimage.filters.gaussian(x, sigma, channel_axis=-1)``.

    Separable kernel truncated at 4 sigma; the border repeats the edge pixel (``"nearest"``).
    """
    taps = _gaussian_taps(sigma)
    radius = len(taps) // 2
    if radius == 0:
        return x
    padded = jnp.pad(x, ((0, 0), (radius, radius), (radius, radius), (0, 0)), mode="edge")
    return filter_valid(padded, np.outer(taps, taps))
