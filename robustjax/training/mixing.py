"""Batch mixing augmentations as pure, jit-able functions of a key, images and soft labels.

Images are float32 NHWC in [0, 1]; labels are (B, K) probabilities. Each function pairs
example ``i`` with example ``perm[i]`` of a random permutation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def mixup(key: jax.Array, x: Float[Array, "b h w c"], labels: Float[Array, "b k"], *, alpha: float = 0.2
          ) -> tuple[Float[Array, "b h w c"], Float[Array, "b k"]]:
    """Mixup (Zhang et al., ICLR 2018): ``lam * x + (1 - lam) * x[perm]`` and the same
    mixture of labels, one ``lam ~ Beta(alpha, alpha)`` per batch."""
    lam_key, perm_key = jax.random.split(key)
    lam = jax.random.beta(lam_key, alpha, alpha)
    perm = jax.random.permutation(perm_key, x.shape[0])
    return lam * x + (1 - lam) * x[perm], lam * labels + (1 - lam) * labels[perm]


def cutmix_box(key: jax.Array, height: int, width: int, lam: jax.Array) -> Float[Array, "h w"]:
    """CutMix's box (Yun et al., ICCV 2019) as a 0/1 mask of ones inside: side lengths
    ``sqrt(1 - lam)`` of the image's, centre uniform, clipped to the image."""
    cy_key, cx_key = jax.random.split(key)
    cut = jnp.sqrt(1 - lam)
    cut_h, cut_w = jnp.floor(height * cut), jnp.floor(width * cut)
    cy = jax.random.randint(cy_key, (), 0, height)
    cx = jax.random.randint(cx_key, (), 0, width)
    top, bottom = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
    left, right = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
    rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
    return ((rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)).astype(jnp.float32)


def cutmix(key: jax.Array, x: Float[Array, "b h w c"], labels: Float[Array, "b k"], *, alpha: float = 1.0
           ) -> tuple[Float[Array, "b h w c"], Float[Array, "b k"]]:
    """CutMix: one box per batch (:func:`cutmix_box`, ``lam ~ Beta(alpha, alpha)``) holds
    ``x[perm]``; labels mix by the box's exact area: ``(1 - area) * y + area * y[perm]``."""
    lam_key, perm_key, box_key = jax.random.split(key, 3)
    lam = jax.random.beta(lam_key, alpha, alpha)
    perm = jax.random.permutation(perm_key, x.shape[0])
    box = cutmix_box(box_key, x.shape[1], x.shape[2], lam)[None, :, :, None]
    area = box.mean()
    return (1 - box) * x + box * x[perm], (1 - area) * labels + area * labels[perm]


def mixup_or_cutmix(key: jax.Array, x, labels, *, use_mixup: bool, use_cutmix: bool,
                    mixup_alpha: float = 0.2, cutmix_alpha: float = 1.0):
    """Mixup, CutMix, or (both enabled, RobustART's "augmentation") either one with
    probability 0.5 per step."""
    choice_key, key = jax.random.split(key)
    if use_mixup and use_cutmix:
        return jax.lax.cond(jax.random.bernoulli(choice_key),
                            lambda: mixup(key, x, labels, alpha=mixup_alpha),
                            lambda: cutmix(key, x, labels, alpha=cutmix_alpha))
    if use_mixup:
        return mixup(key, x, labels, alpha=mixup_alpha)
    return cutmix(key, x, labels, alpha=cutmix_alpha)


# ---- AugMix ---------------------------------------------------------------------------
# Operations on one image in [0, 1] with a strength in [0, 1]; none of them is one of the
# ImageNet-C corruptions (as in the AugMix paper, which leaves those out to test on them).

def _autocontrast(img, strength):
    low = img.min(axis=(0, 1), keepdims=True)
    high = img.max(axis=(0, 1), keepdims=True)
    return jnp.where(high > low, (img - low) / jnp.maximum(high - low, 1e-6), img)


def _posterize(img, strength):
    levels = 2.0 ** (4 - jnp.floor(strength * 3.99))  # 16 .. 2 grey levels
    return jnp.floor(img * (levels - 1) + 0.5) / (levels - 1)


def _solarize(img, strength):
    threshold = 1.0 - strength
    return jnp.where(img >= threshold, 1.0 - img, img)


def _affine(img, matrix):
    """``img`` resampled at ``matrix @ (row, col)`` about the centre (bilinear, zeros outside)."""
    h, w = img.shape[:2]
    rows, cols = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")
    centre = jnp.array([(h - 1) / 2, (w - 1) / 2])
    coords = jnp.stack([rows - centre[0], cols - centre[1]])
    source = jnp.tensordot(matrix[:, :2], coords, axes=1) + matrix[:, 2][:, None, None] + centre[:, None, None]
    channels = [jax.scipy.ndimage.map_coordinates(img[..., c], list(source), order=1, mode="constant", cval=0.0)
                for c in range(img.shape[-1])]
    return jnp.stack(channels, axis=-1)


def _shear(img, strength, axis):
    s = 0.3 * strength
    matrix = jnp.array([[1.0, s, 0.0], [0.0, 1.0, 0.0]]) if axis else jnp.array([[1.0, 0.0, 0.0], [s, 1.0, 0.0]])
    return _affine(img, matrix)


def _translate(img, strength, axis):
    shift = strength * img.shape[axis] / 3
    offset = jnp.array([shift, 0.0]) if axis == 0 else jnp.array([0.0, shift])
    return _affine(img, jnp.concatenate([jnp.eye(2), offset[:, None]], axis=1))


def _rotate(img, strength):
    angle = jnp.deg2rad(30.0 * strength)
    c, s = jnp.cos(angle), jnp.sin(angle)
    return _affine(img, jnp.array([[c, -s, 0.0], [s, c, 0.0]]))


AUGMIX_OPS = (
    _autocontrast, _posterize, _solarize, _rotate,
    lambda img, s: _shear(img, s, 0), lambda img, s: _shear(img, s, 1),
    lambda img, s: _translate(img, s, 0), lambda img, s: _translate(img, s, 1),
)


def _random_op(key, img, severity):
    op_key, strength_key, sign_key = jax.random.split(key, 3)
    strength = jax.random.uniform(strength_key, minval=0.1, maxval=1.0) * severity / 10
    strength = jnp.where(jax.random.bernoulli(sign_key), strength, -strength)
    index = jax.random.randint(op_key, (), 0, len(AUGMIX_OPS))
    # Colour operations take a non-negative strength; geometric ones use the sign as direction.
    branches = [lambda img, s, op=op: jnp.clip(op(img, jnp.abs(s) if i < 3 else s), 0.0, 1.0)
                for i, op in enumerate(AUGMIX_OPS)]
    return jax.lax.switch(index, branches, img, strength)


def augmix_chain(key: jax.Array, img: Float[Array, "h w c"], *, severity: int = 3, max_depth: int = 3
                 ) -> Float[Array, "h w c"]:
    """One AugMix chain on one image: 1 to ``max_depth`` random operations in sequence."""
    depth_key, key = jax.random.split(key)
    depth = jax.random.randint(depth_key, (), 1, max_depth + 1)
    keys = jax.random.split(key, max_depth)

    def body(i, image):
        return jnp.where(i < depth, _random_op(keys[i], image, severity), image)

    return jax.lax.fori_loop(0, max_depth, body, img)


def augmix_weights(key: jax.Array, width: int = 3, alpha: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """AugMix's mixing weights for one image: chain weights ``w ~ Dirichlet(alpha)`` and the
    skip weight ``m ~ Beta(alpha, alpha)``."""
    w_key, m_key = jax.random.split(key)
    return jax.random.dirichlet(w_key, jnp.full((width,), alpha)), jax.random.beta(m_key, alpha, alpha)


def augmix_one(key: jax.Array, img: Float[Array, "h w c"], *, width: int = 3, severity: int = 3,
               alpha: float = 1.0) -> Float[Array, "h w c"]:
    """AugMix of one image (Hendrycks et al., ICLR 2020, Algorithm 1):
    ``m * img + (1 - m) * sum_i w_i * chain_i(img)`` with :func:`augmix_weights`."""
    weights_key, chains_key = jax.random.split(key)
    w, m = augmix_weights(weights_key, width, alpha)
    chains = jax.vmap(lambda k: augmix_chain(k, img, severity=severity))(jax.random.split(chains_key, width))
    return m * img + (1 - m) * jnp.tensordot(w, chains, axes=1)


def augmix(key: jax.Array, x: Float[Array, "b h w c"], **options) -> Float[Array, "b h w c"]:
    """:func:`augmix_one` of every image, each with its own key."""
    return jax.vmap(lambda k, img: augmix_one(k, img, **options))(jax.random.split(key, x.shape[0]), x)
