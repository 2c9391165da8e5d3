"""Training-time image augmentation as pure, jit-able functions of a key, one image at a
time (float32 HWC in [0, 1]); :func:`augment` maps one over a batch with a key per image.
Every output has the input's shape.

* ``"standard"``: RobustART's ``STANDARD`` training augmentation (reference/robustart.md,
  section 3), torchvision's ``RandomResizedCrop(size) + RandomHorizontalFlip() +
  ColorJitter(0.2, 0.2, 0.2, 0.1)``: a box of 8-100% of the image's area and aspect ratio
  3/4-4/3 resized back to the input size (bilinear, no antialiasing), a flip with
  probability 0.5, then brightness, contrast, saturation and hue adjusted by random factors
  in a random order.
* ``"pad_crop_flip"``: the CIFAR augmentation (He et al. 2016; torchvision's
  ``RandomCrop(size, padding=4) + RandomHorizontalFlip()``): zero-pad by 4, crop a random
  window of the input size, flip with probability 0.5.
* ``"none"``: the images as they are.

The colour adjustments equal torchvision's ``adjust_*`` on float images, the crop's
resize ``resized_crop(..., BILINEAR, antialias=False)`` (checked against torchvision by
tests/test_training_augment.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from robustjax.registry import unknown_name

AUGMENTATIONS = ("standard", "pad_crop_flip", "none")
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale (ITU-R 601-2 luma)
Image = Float[Array, "h w c"]


def check_augmentation(name: str) -> None:
    if name not in AUGMENTATIONS:
        raise unknown_name("augmentation", name, AUGMENTATIONS)


def _blend(img: Image, other, factor) -> Image:
    """``factor * img + (1 - factor) * other`` clipped to [0, 1] (torchvision's ``_blend``)."""
    return jnp.clip(factor * img + (1.0 - factor) * other, 0.0, 1.0)


def grayscale(img: Image) -> Float[Array, "h w 1"]:
    """Luma ``0.2989 R + 0.587 G + 0.114 B``; a one-channel image as it is."""
    if img.shape[-1] == 1:
        return img
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b)[..., None]


def adjust_brightness(img: Image, factor) -> Image:
    """``factor * img``, clipped."""
    return _blend(img, 0.0, factor)


def adjust_contrast(img: Image, factor) -> Image:
    """Blend with the mean grey level of the image."""
    return _blend(img, jnp.mean(grayscale(img)), factor)


def adjust_saturation(img: Image, factor) -> Image:
    """Blend with the image's grey version (a one-channel image is unchanged)."""
    return img if img.shape[-1] == 1 else _blend(img, grayscale(img), factor)


def _rgb_to_hsv(img: Image) -> Image:
    """torchvision's ``_rgb2hsv`` (after Pillow): hue and saturation 0 where R = G = B."""
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    maxc, minc = img.max(axis=-1), img.min(axis=-1)
    equal = maxc == minc
    chroma = maxc - minc
    s = chroma / jnp.where(equal, 1.0, maxc)
    divisor = jnp.where(equal, 1.0, chroma)
    rc, gc, bc = (maxc - r) / divisor, (maxc - g) / divisor, (maxc - b) / divisor
    h = ((maxc == r) * (bc - gc) + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
         + ((maxc != g) & (maxc != r)) * (4.0 + gc - rc))
    return jnp.stack([jnp.fmod(h / 6.0 + 1.0, 1.0), s, maxc], axis=-1)


def _hsv_to_rgb(hsv: Image) -> Image:
    """torchvision's ``_hsv2rgb``: the sector ``floor(6 h)`` picks (v, p, q, t) per channel."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    i = jnp.floor(h * 6.0)
    f = h * 6.0 - i
    sector = i.astype(jnp.int32) % 6
    p = jnp.clip(v * (1.0 - s), 0.0, 1.0)
    q = jnp.clip(v * (1.0 - s * f), 0.0, 1.0)
    t = jnp.clip(v * (1.0 - s * (1.0 - f)), 0.0, 1.0)
    table = jnp.stack([jnp.stack(row, axis=-1) for row in
                       ((v, q, p, p, t, v), (t, v, v, q, p, p), (p, p, t, v, v, q))], axis=-1)  # (h, w, 6, 3)
    return jnp.take_along_axis(table, sector[..., None, None], axis=-2)[..., 0, :]


def adjust_hue(img: Image, factor) -> Image:
    """Hue rotated by ``factor`` (a fraction of a turn, in [-0.5, 0.5]) in HSV space; a
    one-channel image is unchanged."""
    if img.shape[-1] == 1:
        return img
    hsv = _rgb_to_hsv(img)
    return _hsv_to_rgb(hsv.at[..., 0].set(jnp.mod(hsv[..., 0] + factor, 1.0)))


def jitter_params(key: jax.Array, *, brightness: float = 0.2, contrast: float = 0.2, saturation: float = 0.2,
                  hue: float = 0.1) -> tuple[Int[Array, "4"], Float[Array, "4"]]:
    """torchvision's ``ColorJitter.get_params``: a random order of the four adjustments
    (0 brightness, 1 contrast, 2 saturation, 3 hue) and their factors, uniform in
    ``[max(0, 1 - a), 1 + a]`` (the hue's in ``[-hue, hue]``)."""
    order_key, factor_key = jax.random.split(key)
    low = jnp.array([max(0.0, 1.0 - brightness), max(0.0, 1.0 - contrast), max(0.0, 1.0 - saturation), -hue])
    high = jnp.array([1.0 + brightness, 1.0 + contrast, 1.0 + saturation, hue])
    return jax.random.permutation(order_key, 4), jax.random.uniform(factor_key, (4,), minval=low, maxval=high)


def apply_jitter(img: Image, order: Int[Array, "4"], factors: Float[Array, "4"]) -> Image:
    """The four colour adjustments with ``factors``, in ``order`` (``ColorJitter.forward``)."""
    adjustments = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    return jax.lax.fori_loop(0, 4, lambda i, x: jax.lax.switch(order[i], adjustments, x, factors[order[i]]), img)


def color_jitter(key: jax.Array, img: Image, **strengths) -> Image:
    """torchvision's ``ColorJitter(**strengths)`` (default 0.2, 0.2, 0.2, 0.1: RobustART's)."""
    return apply_jitter(img, *jitter_params(key, **strengths))


def random_resized_crop_box(key: jax.Array, height: int, width: int, *, scale=(0.08, 1.0),
                            ratio=(3 / 4, 4 / 3), attempts: int = 10) -> Int[Array, "4"]:
    """torchvision's ``RandomResizedCrop.get_params`` as ``(top, left, box_height,
    box_width)``: up to ``attempts`` draws of an area fraction uniform in ``scale`` and a
    log-uniform aspect ratio in ``ratio``; the first box that fits, at a uniform position;
    if none fits, the largest centred box of the nearest allowed ratio."""
    area_key, ratio_key, top_key, left_key = jax.random.split(key, 4)
    area = height * width * jax.random.uniform(area_key, (attempts,), minval=scale[0], maxval=scale[1])
    aspect = jnp.exp(jax.random.uniform(ratio_key, (attempts,), minval=math.log(ratio[0]), maxval=math.log(ratio[1])))
    w = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
    h = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = jnp.argmax(fits)
    fallback = _centre_box(height, width, ratio)
    h = jnp.where(fits[first], h[first], fallback[0])
    w = jnp.where(fits[first], w[first], fallback[1])
    top = jnp.floor(jax.random.uniform(top_key) * (height - h + 1)).astype(jnp.int32)
    left = jnp.floor(jax.random.uniform(left_key) * (width - w + 1)).astype(jnp.int32)
    top = jnp.where(fits[first], jnp.minimum(top, height - h), (height - h) // 2)
    left = jnp.where(fits[first], jnp.minimum(left, width - w), (width - w) // 2)
    return jnp.stack([top, left, h, w])


def _centre_box(height: int, width: int, ratio) -> tuple[int, int]:
    """torchvision's fallback box size: the whole image, cut to the nearest allowed ratio."""
    if width / height < min(ratio):
        return round(width / min(ratio)), width
    if width / height > max(ratio):
        return height, round(height * max(ratio))
    return height, width


def _linear_taps(out_size: int, box_start, box_size) -> tuple[jax.Array, jax.Array, jax.Array]:
    """PyTorch's bilinear source taps (``align_corners=False``) of ``out_size`` outputs over
    a box of ``box_size`` pixels from ``box_start``: the two rows and the second's weight."""
    src = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) * (box_size / out_size) - 0.5
    src = jnp.maximum(src, 0.0)
    first = jnp.minimum(jnp.floor(src).astype(jnp.int32), box_size - 1)
    second = jnp.minimum(first + 1, box_size - 1)
    weight = jnp.clip(src - first, 0.0, 1.0)
    return box_start + first, box_start + second, weight


def resized_crop(img: Image, box: Int[Array, "4"]) -> Image:
    """The ``(top, left, height, width)`` box of ``img`` resized to the image's own size,
    bilinear without antialiasing (torchvision's ``resized_crop(..., BILINEAR,
    antialias=False)``, i.e. ``interpolate(mode="bilinear", align_corners=False)``)."""
    out_h, out_w = img.shape[:2]
    top, left, box_h, box_w = box[0], box[1], box[2], box[3]
    r0, r1, wy = _linear_taps(out_h, top, box_h)
    c0, c1, wx = _linear_taps(out_w, left, box_w)
    wy, wx = wy[:, None, None], wx[None, :, None]

    def along_columns(rows):
        return (1.0 - wx) * jnp.take(rows, c0, axis=1) + wx * jnp.take(rows, c1, axis=1)

    return (1.0 - wy) * along_columns(jnp.take(img, r0, axis=0)) + wy * along_columns(jnp.take(img, r1, axis=0))


def random_flip(key: jax.Array, img: Image) -> Image:
    """The image mirrored left-right with probability 0.5."""
    return jnp.where(jax.random.bernoulli(key), img[:, ::-1], img)


def standard(key: jax.Array, img: Image) -> Image:
    """RobustART's ``STANDARD``: random resized crop, flip, colour jitter."""
    box_key, flip_key, jitter_key = jax.random.split(key, 3)
    img = resized_crop(img, random_resized_crop_box(box_key, img.shape[0], img.shape[1]))
    return color_jitter(jitter_key, random_flip(flip_key, img))


def pad_crop_flip(key: jax.Array, img: Image, *, padding: int = 4) -> Image:
    """A window of the image zero-padded by ``padding``, at a uniform offset, then a flip."""
    offset_key, flip_key = jax.random.split(key)
    height, width, channels = img.shape
    padded = jnp.pad(img, ((padding, padding), (padding, padding), (0, 0)))
    top, left = jax.random.randint(offset_key, (2,), 0, 2 * padding + 1)
    return random_flip(flip_key, jax.lax.dynamic_slice(padded, (top, left, 0), (height, width, channels)))


def augment(name: str, key: jax.Array, x: Float[Array, "b h w c"]) -> Float[Array, "b h w c"]:
    """The augmentation ``name`` (one of :data:`AUGMENTATIONS`) of every image, each with
    its own key."""
    check_augmentation(name)
    if name == "none":
        return x
    one = standard if name == "standard" else pad_crop_flip
    return jax.vmap(one)(jax.random.split(key, x.shape[0]), x)
