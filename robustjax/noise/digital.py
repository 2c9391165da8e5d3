"""Colour and geometry corruptions of ImageNet-C: contrast, elastic_transform, pixelate (its
"digital" family), brightness (its "weather" family) and saturate (an extra).

Definitions follow Hendrycks & Dietterich (ICLR 2019) as implemented in the
``imagecorruptions`` package (ImageNet-C constants, any image size) and in ``make_cifar_c.py``
(CIFAR-10-C constants). ``imagecorruptions`` always uses the ImageNet-C constants, so on
images of 64 px and below (where ``corrupt`` defaults to ``"cifar"``) agreeing with it needs
``preset="imagenet"``. Colour operations work in skimage's HSV convention. On 1-channel
images brightness adds to the grey level and saturate leaves the image unchanged, which is
what ``imagecorruptions`` computes for greyscale input (it saturates an image with no hue
and returns its red channel, which equals the value channel).

Linear filters whose size depends only on the static image shape (Gaussian smoothing,
PIL's resampling) are built on the host as small matrices from the reference routine itself
(``scipy.ndimage``, PIL) applied to an identity, then applied in jnp as matrix products.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage
from jaxtyping import Array, Float
from PIL import Image

from robustjax.noise.registry import register_corruption

Images = Float[Array, "b h w c"]


# ----------------------------------------------------------------------------- helpers


def rgb_to_hsv(rgb: Float[Array, "... 3"]) -> Float[Array, "... 3"]:
    """RGB in [0, 1] to HSV in [0, 1], as ``skimage.color.rgb2hsv`` (hue 0 for greys)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    value = jnp.max(rgb, axis=-1)
    delta = value - jnp.min(rgb, axis=-1)
    safe_delta = jnp.where(delta == 0, 1.0, delta)
    saturation = jnp.where(delta == 0, 0.0, delta / jnp.where(value == 0, 1.0, value))
    # skimage assigns the red, then green, then blue branch, so blue wins ties, then green.
    hue = jnp.where(
        b == value,
        4.0 + (r - g) / safe_delta,
        jnp.where(g == value, 2.0 + (b - r) / safe_delta, (g - b) / safe_delta),
    )
    hue = jnp.where(delta == 0, 0.0, jnp.mod(hue / 6.0, 1.0))
    return jnp.stack([hue, saturation, value], axis=-1)


def hsv_to_rgb(hsv: Float[Array, "... 3"]) -> Float[Array, "... 3"]:
    """HSV in [0, 1] to RGB, as ``skimage.color.hsv2rgb``."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    sector = jnp.floor(h * 6.0)
    f = h * 6.0 - sector
    sector = jnp.mod(sector, 6).astype(jnp.int32)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    table = jnp.stack(
        [
            jnp.stack([v, t, p], -1),
            jnp.stack([q, v, p], -1),
            jnp.stack([p, v, t], -1),
            jnp.stack([p, q, v], -1),
            jnp.stack([t, p, v], -1),
            jnp.stack([v, p, q], -1),
        ],
        axis=0,
    )
    return jnp.take_along_axis(table, sector[None, ..., None], axis=0)[0]


@functools.lru_cache(maxsize=None)
def linear_operator_matrix(builder, n_in: int, *args) -> np.ndarray:
    """Matrix ``M`` (n_out, n_in) of a linear 1-D operator: ``builder(eye, *args)`` column-wise."""
    return np.ascontiguousarray(builder(np.eye(n_in, dtype=np.float64), *args), dtype=np.float32)


def _gaussian_columns(eye: np.ndarray, sigma: float, mode: str, truncate: float) -> np.ndarray:
    if sigma <= 1e-15:  # scipy.ndimage.gaussian_filter skips such axes
        return eye
    return scipy.ndimage.gaussian_filter1d(eye, sigma, axis=0, mode=mode, truncate=truncate)


def _pil_resize_columns(eye: np.ndarray, n_out: int, resample: int) -> np.ndarray:
    # A float ('F') image whose rows are basis vectors, resampled along its width only.
    n_in = eye.shape[0]
    image = Image.fromarray(eye.astype(np.float32), mode="F")
    return np.asarray(image.resize((n_out, n_in), resample), dtype=np.float64).T


def apply_separable(field: Float[Array, "*b h w"], rows: np.ndarray, cols: np.ndarray) -> Float[Array, "*b p q"]:
    """``rows @ field @ cols.T`` on the last two axes, in full float32 (the default precision
    may run in TF32 on NVIDIA GPUs, about 1e-3 relative error: a quarter grey level)."""
    return jnp.einsum("ph,...hw,qw->...pq", jnp.asarray(rows), field, jnp.asarray(cols),
                      precision=jax.lax.Precision.HIGHEST)


def gaussian_filter_2d(
    field: Float[Array, "*b h w"], sigma: tuple[float, float], *, mode: str, truncate: float
) -> Float[Array, "*b h w"]:
    """``scipy.ndimage.gaussian_filter`` over the last two axes (same kernel radius and border)."""
    h, w = field.shape[-2:]
    rows = linear_operator_matrix(_gaussian_columns, h, float(sigma[0]), mode, float(truncate))
    cols = linear_operator_matrix(_gaussian_columns, w, float(sigma[1]), mode, float(truncate))
    return apply_separable(field, rows, cols)


# ----------------------------------------------------------------------------- colour


@register_corruption(
    "brightness",
    family="weather",  # ImageNet-C groups brightness with the weather corruptions
    imagenet=(0.1, 0.2, 0.3, 0.4, 0.5),
    cifar=(0.05, 0.1, 0.15, 0.2, 0.3),
    stochastic=False,
)
def brightness(x: Images, c: float, key: jax.Array) -> Images:
    """Adds ``c`` to the HSV value channel (clipped to 1); greyscale: ``x + c``."""
    del key
    if x.shape[-1] == 1:
        return x + c
    hsv = rgb_to_hsv(x)
    hsv = hsv.at[..., 2].set(jnp.clip(hsv[..., 2] + c, 0.0, 1.0))
    return hsv_to_rgb(hsv)


@register_corruption(
    "contrast",
    family="digital",
    imagenet=(0.4, 0.3, 0.2, 0.1, 0.05),
    cifar=(0.75, 0.5, 0.4, 0.3, 0.15),
    stochastic=False,
)
def contrast(x: Images, c: float, key: jax.Array) -> Images:
    """Scales each channel's deviation from its per-image mean by ``c``."""
    del key
    means = jnp.mean(x, axis=(1, 2), keepdims=True)
    return (x - means) * c + means


@register_corruption(
    "saturate",
    family="extra",
    imagenet=((0.3, 0.0), (0.1, 0.0), (2.0, 0.0), (5.0, 0.1), (20.0, 0.2)),
    cifar=((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2)),
    stochastic=False,
)
def saturate(x: Images, c: tuple[float, float], key: jax.Array) -> Images:
    """HSV saturation ``s -> clip(s * c[0] + c[1], 0, 1)``; greyscale images are unchanged."""
    del key
    if x.shape[-1] == 1:
        return x
    scale, shift = c
    hsv = rgb_to_hsv(x)
    hsv = hsv.at[..., 1].set(jnp.clip(hsv[..., 1] * scale + shift, 0.0, 1.0))
    return hsv_to_rgb(hsv)


# ----------------------------------------------------------------------------- pixelate


@register_corruption(
    "pixelate",
    family="digital",
    imagenet=(0.6, 0.5, 0.4, 0.3, 0.25),
    cifar=(0.95, 0.9, 0.85, 0.75, 0.65),
    stochastic=False,
)
def pixelate(x: Images, c: float, key: jax.Array) -> Images:
    """PIL box-filter down-scale by ``c`` (sizes truncated to int), then PIL nearest up-scale.

    CIFAR-10-C up-scales with PIL's box filter, which for enlargement selects the same
    source pixel as nearest; one procedure serves both presets.

    Pillow rounds (half up) to 8 bits after each pass of its down-scale; here the image
    stays float. The result is within one grey level of ``imagecorruptions``'; stored as
    8 bits it is one level off on 13-45% of the pixels (two photos, 32-224 px, severities 1-5).
    """
    del key
    h, w = x.shape[1:3]
    small_h, small_w = max(int(h * c), 1), max(int(w * c), 1)
    down_rows = linear_operator_matrix(_pil_resize_columns, h, small_h, Image.BOX)
    down_cols = linear_operator_matrix(_pil_resize_columns, w, small_w, Image.BOX)
    up_rows = linear_operator_matrix(_pil_resize_columns, small_h, h, Image.NEAREST)
    up_cols = linear_operator_matrix(_pil_resize_columns, small_w, w, Image.NEAREST)
    channels_first = jnp.moveaxis(x, -1, 1)
    small = apply_separable(channels_first, down_rows, down_cols)
    return jnp.moveaxis(apply_separable(small, up_rows, up_cols), 1, -1)


# ----------------------------------------------------------------------------- elastic


def _affine_warp(image: Float[Array, "h w c"], unit_shift: Float[Array, "3 2"], amplitude: float):
    """``cv2.warpAffine`` (bilinear, reflect-101 border) by the affine map that moves three
    points around the centre by ``amplitude * unit_shift`` pixels (make_cifar_c.py)."""
    h, w = image.shape[:2]
    # Points in the reference's order: the centre is (h // 2, w // 2) read as (x, y).
    cx, cy = float(h // 2), float(w // 2)
    half = float(min(h, w) // 3)
    source = jnp.array([[cx + half, cy + half], [cx + half, cy - half], [cx - half, cy - half]])
    target = source + amplitude * unit_shift
    homogeneous = jnp.concatenate([source, jnp.ones((3, 1))], axis=1)
    forward = jnp.linalg.solve(homogeneous, target).T  # (2, 3): target = forward @ [x, y, 1]
    inverse = jnp.linalg.inv(jnp.concatenate([forward, jnp.array([[0.0, 0.0, 1.0]])], axis=0))
    rows, cols = _pixel_grid(h, w)
    src_x = inverse[0, 0] * cols + inverse[0, 1] * rows + inverse[0, 2]
    src_y = inverse[1, 0] * cols + inverse[1, 1] * rows + inverse[1, 2]
    return _sample_channels(image, src_y, src_x, mode="mirror")


def _pixel_grid(h: int, w: int) -> list[jax.Array]:
    """Row and column coordinates of every pixel, each (h, w)."""
    return jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")


def _sample_channels(image, rows, cols, *, mode: str):
    sample = lambda channel: jax.scipy.ndimage.map_coordinates(channel, [rows, cols], order=1, mode=mode)
    return jax.vmap(sample, in_axes=-1, out_axes=-1)(image)


def elastic_from_noise(
    image: Float[Array, "h w c"],
    unit_affine: Float[Array, "3 2"],
    unit_dx: Float[Array, "h w"],
    unit_dy: Float[Array, "h w"],
    c: tuple[float, float, float],
) -> Float[Array, "h w c"]:
    """The deterministic part of ``elastic_transform``, given its uniform(-1, 1) draws.

    ``c = (alpha, sigma, affine)`` as fractions of the image height: an optional random
    affine warp (corner shifts up to ``affine * H`` pixels), then a displacement field
    ``alpha * H * gaussian(uniform(-1, 1), sigma * (H, W))`` sampled bilinearly with
    reflected borders.
    """
    alpha, sigma, affine = c
    h, w = image.shape[:2]
    if affine > 0:
        image = _affine_warp(image, unit_affine, affine * h)
    if alpha == 0:
        return image
    smooth = functools.partial(gaussian_filter_2d, sigma=(sigma * h, sigma * w), mode="reflect", truncate=3.0)
    dx, dy = smooth(unit_dx) * (alpha * h), smooth(unit_dy) * (alpha * h)
    rows, cols = _pixel_grid(h, w)
    return _sample_channels(image, rows + dy, cols + dx, mode="reflect")


# imagecorruptions: alpha = 250 * k pixels on a field of amplitude 0.005 * H, sigma 1 % of the
# side, no affine. make_cifar_c.py: (alpha, sigma, affine) in units of the 32-pixel side.
_ELASTIC_IMAGENET = tuple((250 * k * 0.005, 0.01, 0.0) for k in (0.05, 0.065, 0.085, 0.1, 0.12))
_ELASTIC_CIFAR = ((0.0, 0.0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03))


@register_corruption(
    "elastic_transform", family="digital", imagenet=_ELASTIC_IMAGENET, cifar=_ELASTIC_CIFAR, stochastic=True
)
def elastic_transform(x: Images, c: tuple[float, float, float], key: jax.Array) -> Images:
    """Random affine warp and Gaussian-smoothed random displacement (Simard et al., 2003)."""
    h, w = x.shape[1:3]

    def one(image, image_key):
        unit = jax.random.uniform(image_key, (6 + 2 * h * w,), minval=-1.0, maxval=1.0)
        fields = unit[6:].reshape(2, h, w)
        return elastic_from_noise(image, unit[:6].reshape(3, 2), fields[0], fields[1], c)

    return jax.vmap(one)(x, jax.random.split(key, x.shape[0]))
