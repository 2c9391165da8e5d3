"""ImageNet-P perturbation sequences (Hendrycks & Dietterich, ICLR 2019).

Each clean image becomes a sequence of frames ``x_1 .. x_T``, and a stable classifier keeps
its prediction along the sequence (see :mod:`robustjax.noise.flip`). The frames follow the
authors' generators (``make_imagenet_p.py`` and ``make_cifar_p.py`` in hendrycks/robustness),
with their constants for ImageNet-size images (``"imagenet"``) and for CIFAR-size images
(``"cifar"``); :func:`frame_parameters` gives the per-frame parameter of each sequence.

- Noise (``gaussian_noise``, ``shot_noise``, ``speckle_noise``): frame 1 is the clean image,
  every later frame an independent draw at one fixed strength; ``difficulty`` 1-3 picks the
  strength (the authors' ``_2`` and ``_3`` sets). Flips are counted against frame 1.
- Blur, weather and digital: a smooth walk of one parameter (motion-blur angle, zoom, blur
  sigma, snow direction, dripping spatter, brightness shift, translation, rotation, tilt,
  scale, shear). Flips are counted against the previous frame; for these ``difficulty`` does
  not change the frames, it is the comparison step of the flip evaluation.

Deviations from the published videos, all deliberate: frames stay float32 (no uint8 PNG
round trip, no H.264 encoding); geometric frames are warped from the given image with zero
fill (ImageNet-P warped the 256-pixel resize before its 224 centre crop, so its borders show
image content where ours are black); spatter's distance transform is the exact Euclidean one,
where OpenCV's ``DIST_L2`` with a 5x5 mask is a chamfer approximation of it. Frames for
``length`` beyond the published count continue the published formula.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.ndimage import map_coordinates
from jaxtyping import Array, ArrayLike, Float

from robustjax.checks import check_choice, check_images, check_key
from robustjax.noise.registry import PRESETS, Preset, default_preset
from robustjax.registry import Registry
from robustjax.sharding import auto_axes_over_batch

DIFFICULTIES: tuple[int, ...] = (1, 2, 3)
FAMILIES: tuple[str, ...] = ("noise", "blur", "weather", "digital")
MIN_SIZE = 8


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """A registered perturbation: its name, its family (one of ``FAMILIES``) and
    ``render(x, key, *, params, preset)``, the (T, H, W, C) frames of one (H, W, C) image
    from the per-frame parameters (:func:`frame_parameters`)."""

    name: str
    family: str
    render: Callable[..., jax.Array]


_PERTURBATIONS: Registry[Perturbation] = Registry("perturbation")  # filled at the end of the module

# Published frame counts; every other sequence has 31 frames.
_LENGTH = {("translate", "imagenet"): 41, ("translate", "cifar"): 16, ("motion_blur", "cifar"): 21}

# Noise strength per difficulty: Gaussian and speckle sigma, shot-noise photon count.
_NOISE_STRENGTH = {
    ("gaussian_noise", "imagenet"): (0.03, 0.05, 0.08), ("gaussian_noise", "cifar"): (0.02, 0.04, 0.06),
    ("shot_noise", "imagenet"): (300.0, 120.0, 60.0), ("shot_noise", "cifar"): (700.0, 400.0, 200.0),
    ("speckle_noise", "imagenet"): (0.05, 0.10, 0.15), ("speckle_noise", "cifar"): (0.05, 0.07, 0.10),
}

# Parameter of frame i (0-based) for the sequences that walk a parameter.
_WALK: dict[tuple[str, str], Callable[[np.ndarray], np.ndarray]] = {
    ("motion_blur", "imagenet"): lambda i: (i - 30) * 4.0,      # blur angle, degrees
    ("motion_blur", "cifar"): lambda i: (i - 20) * 9.0,
    ("zoom_blur", "imagenet"): lambda i: 1 + 0.004 * i,         # zoom of the i-th averaged copy
    ("zoom_blur", "cifar"): lambda i: 1 + 0.004 * i,
    ("gaussian_blur", "imagenet"): lambda i: 0.25 + 0.035 * i,  # sigma, pixels
    ("gaussian_blur", "cifar"): lambda i: 0.3 + 0.015 * i,
    ("snow", "imagenet"): lambda i: i * 4.0 - 150,              # snowfall angle, degrees
    ("snow", "cifar"): lambda i: i * 4.0 - 150,
    ("spatter", "imagenet"): lambda i: i * 1.0,                 # drip steps so far
    ("spatter", "cifar"): lambda i: i * 1.0,
    ("brightness", "imagenet"): lambda i: (i - 15) * 0.02,      # shift of HSV value
    ("brightness", "cifar"): lambda i: (i - 15) * 0.015,
    ("translate", "imagenet"): lambda i: i - 20.0,              # horizontal shift, pixels
    ("translate", "cifar"): lambda i: i - 7.0,
    ("rotate", "imagenet"): lambda i: i - 15.0,                 # degrees
    ("rotate", "cifar"): lambda i: i - 15.0,
    ("tilt", "imagenet"): lambda i: i - 15.0,                   # degrees about both axes
    ("tilt", "cifar"): lambda i: 0.75 * (i - 15),
    ("scale", "imagenet"): lambda i: (i * 2.5 + 40) / 100,
    ("scale", "cifar"): lambda i: (i * 2 + 70) / 100,
    ("shear", "imagenet"): lambda i: i - 15.0,                  # degrees
    ("shear", "cifar"): lambda i: i - 15.0,
}

# Fixed constants: motion blur (radius, sigma); Gaussian blur truncation (in sigmas);
# snow (layer zoom, blur radius, blur sigma); spatter (mean, std, smoothing sigma, threshold,
# drip kernel applied down the columns once per frame).
_MOTION = {"imagenet": (10, 3.0), "cifar": (6, 1.8)}
_TRUNCATE = {"imagenet": 6.0, "cifar": 7.0}
_SNOW = {"imagenet": (3, 14, 4.0), "cifar": (2, 10, 2.0)}
_SPATTER = {
    "imagenet": (0.65, 0.27, 3.7, 0.69, (0.05, 0.1, 0.15, 0.7)),
    "cifar": (0.6, 0.265, 1.75, 0.7, (0.2, 0.8)),
}
_WATER_RGB = np.array([175, 238, 238], np.float32) / 255  # pale turquoise
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)       # OpenCV's RGB -> gray weights


def names(family: str | None = None) -> list[str]:
    """The perturbation names, in registration order, optionally of one family (noise,
    blur, weather, digital)."""
    if family is not None:
        check_choice(family, FAMILIES, "family")
    return [name for name in _PERTURBATIONS if family is None or get(name).family == family]


def get(name: str) -> Perturbation:
    """The perturbation registered as ``name``."""
    return _PERTURBATIONS.get(name)


def is_noise(name: str) -> bool:
    """Whether flips along ``name``'s sequences are counted against the first frame."""
    return get(name).family == "noise"


def default_length(name: str, preset: Preset) -> int:
    """The published number of frames of a ``name`` sequence."""
    get(name)
    check_choice(preset, PRESETS, "preset")
    return _LENGTH.get((name, preset), 31)


def frame_parameters(name: str, *, preset: Preset, length: int | None = None, difficulty: int = 1) -> np.ndarray:
    """The parameter of each frame of a ``name`` sequence, shape (length,), float64.

    Noise: the strength of each frame (Gaussian or speckle sigma, shot-noise photon count),
    0 for the clean first frame. Others: the walked parameter (see the module docstring).
    """
    get(name)
    check_choice(preset, PRESETS, "preset")
    length = default_length(name, preset) if length is None else length
    check_length(length)
    check_difficulty(difficulty)
    i = np.arange(length, dtype=np.float64)
    if is_noise(name):
        return np.where(i == 0, 0.0, _NOISE_STRENGTH[name, preset][difficulty - 1])
    return _WALK[name, preset](i)


def perturbation_sequence(
    x: Float[ArrayLike, "b h w c"],
    name: str,
    key: jax.Array,
    *,
    length: int | None = None,
    difficulty: int = 1,
    preset: Preset | None = None,
) -> Float[Array, "b t h w c"]:
    """ImageNet-P frames of perturbation ``name`` for each image of a batch.

    Args:
      x: float32 images (B, H, W, C) in [0, 1], C is 1 or 3, H and W at least ``MIN_SIZE``.
      name: one of :func:`names`.
      key: PRNG key; the same key gives the same frames. Each image gets its own draw.
      length: frames per sequence; by default the published count (:func:`default_length`).
      difficulty: 1-3; the noise strength for noise sequences, otherwise unused here (it is
        the comparison step of :func:`robustjax.noise.flip.evaluate_sequences`).
      preset: ``"imagenet"`` or ``"cifar"`` constants; by default chosen from the image size.

    Returns:
      float32 frames (B, T, H, W, C) in [0, 1]. One compiled program per (name, shape,
      length, difficulty, preset); new keys do not recompile.
    """
    preset, length = check_arguments(x, name, key, length, difficulty, preset)
    return sequence_frames(name, preset, length, difficulty, jnp.asarray(x, jnp.float32), key)


def create(name: str, *, preset: Preset, length: int | None = None,
           difficulty: int = 1) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The pure ``(x, key) -> frames`` of perturbation ``name``, (B, H, W, C) images to
    (B, T, H, W, C) frames, to compose inside other jitted code (it does not validate ``x``:
    :func:`perturbation_sequence` does). ``length`` and ``difficulty`` as there."""
    params = frame_parameters(name, preset=preset, length=length, difficulty=difficulty)
    render = functools.partial(get(name).render, params=params, preset=preset)

    def frames(x, key):
        return jnp.clip(jax.vmap(render)(x, jax.random.split(key, x.shape[0])), 0.0, 1.0).astype(x.dtype)

    return lambda x, key: auto_axes_over_batch(frames, x)(x, key)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def sequence_frames(name: str, preset: str, length: int, difficulty: int, x: jax.Array, key: jax.Array) -> jax.Array:
    return create(name, preset=preset, length=length, difficulty=difficulty)(x, key)


# ----------------------------------------------------------------------------------- checks

def check_length(length) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an integer >= 2 (frames per sequence), got {length!r}")


def check_difficulty(difficulty) -> None:
    if isinstance(difficulty, bool) or not isinstance(difficulty, int) or difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")


def check_arguments(x, name, key, length, difficulty, preset) -> tuple[str, int]:
    """Validates :func:`perturbation_sequence` arguments on the host; returns the preset and
    the length (defaults filled in) for :func:`sequence_frames`."""
    get(name)
    check_images(x)
    if x.shape[-1] not in (1, 3):
        raise ValueError(f"x must have 1 or 3 channels, got shape {tuple(x.shape)}")
    if min(x.shape[1:3]) < MIN_SIZE:
        raise ValueError(f"x must be at least {MIN_SIZE}x{MIN_SIZE} pixels, got shape {tuple(x.shape)}")
    check_key(key)
    check_difficulty(difficulty)
    preset = default_preset(tuple(x.shape[1:3])) if preset is None else preset
    check_choice(preset, PRESETS, "preset")
    length = default_length(name, preset) if length is None else length
    check_length(length)
    return preset, length


# ----------------------------------------------------------------------- shared image ops

def _gray(img: jax.Array) -> jax.Array:
    """OpenCV's luma of an (H, W, C) image, shape (H, W, 1); a 1-channel image is its own."""
    return img if img.shape[-1] == 1 else (img @ jnp.asarray(_LUMA))[..., None]


def _taps_filter(img: jax.Array, weights: jax.Array, axis: int, pad_mode: str) -> jax.Array:
    """Correlates ``img`` with the centred odd-length ``weights`` along ``axis``."""
    radius = (weights.shape[0] - 1) // 2
    pad = [(0, 0)] * img.ndim
    pad[axis] = (radius, radius)
    padded = jnp.pad(img, pad, mode=pad_mode)
    size = img.shape[axis]
    return sum(weights[k] * jax.lax.slice_in_dim(padded, k, k + size, axis=axis) for k in range(2 * radius + 1))


def _gaussian_weights(sigma: float, truncate: float, radius: int) -> np.ndarray:
    """scipy.ndimage's Gaussian taps for ``sigma``, zero-padded to ``2 * radius + 1``."""
    own = int(truncate * sigma + 0.5)
    k = np.arange(-radius, radius + 1)
    w = np.where(np.abs(k) <= own, np.exp(-0.5 * (k / sigma) ** 2), 0.0)
    return (w / w.sum()).astype(np.float32)


def _gaussian_filter(img: jax.Array, weights: jax.Array) -> jax.Array:
    """Separable Gaussian over the first two axes, edge-replicated (skimage's ``gaussian``)."""
    return _taps_filter(_taps_filter(img, weights, 0, "edge"), weights, 1, "edge")


def _motion_taps(angle: np.ndarray, radius: int, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ImageMagick's motion blur: tap weights (W,) and per-angle row/col offsets (T, W).

    Tap i, weighted by a one-sided Gaussian exp(-i^2 / 2 sigma^2), samples the pixel
    (round(i sin a), round(i cos a)) away, rounding half down as ImageMagick does.
    """
    i = np.arange(2 * radius + 1)
    weights = np.exp(-(i**2) / (2 * sigma**2))
    theta = np.deg2rad(np.asarray(angle))[:, None]
    rows = np.ceil(i * np.sin(theta) - 0.5).astype(np.int32)
    cols = np.ceil(i * np.cos(theta) - 0.5).astype(np.int32)
    return (weights / weights.sum()).astype(np.float32), rows, cols


def _motion_blur_frame(img: jax.Array, weights: np.ndarray, rows: jax.Array, cols: jax.Array) -> jax.Array:
    """Sum of edge-clamped shifted copies of ``img`` (H, W, ...), one per tap."""
    h, w = img.shape[:2]
    out = jnp.zeros_like(img)
    for k in range(weights.shape[0]):
        r = jnp.clip(jnp.arange(h) + rows[k], 0, h - 1)
        c = jnp.clip(jnp.arange(w) + cols[k], 0, w - 1)
        out = out + weights[k] * img[r][:, c]
    return out


def _warp(img: jax.Array, inverse: jax.Array) -> jax.Array:
    """Bilinear projective warp with zero fill; ``inverse`` maps output (x, y, 1) to input."""
    h, w = img.shape[:2]
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    # The barrier keeps XLA from constant-folding (T, H, W) grids when ``inverse`` is known.
    inverse = jax.lax.optimization_barrier(jnp.asarray(inverse))
    src = jnp.tensordot(inverse, jnp.stack([xs, ys, np.ones_like(xs)]), 1)
    sx, sy = src[0] / src[2], src[1] / src[2]
    sample = lambda channel: map_coordinates(channel, [sy, sx], order=1, mode="constant", cval=0.0)  # noqa: E731
    return jax.vmap(sample, in_axes=2, out_axes=2)(img)


def _affine_inverse(h: int, w: int, *, angle=0.0, translate=0.0, scale=1.0, shear=0.0) -> np.ndarray:
    """torchvision's ``F.affine`` as an output -> input map in pixel-index coordinates.

    Forward: rotate by ``angle`` degrees clockwise, shear along x by ``shear`` degrees and
    scale, all about the image centre, then shift right by ``translate`` pixels.
    """
    rot, sx = math.radians(angle), math.radians(shear)
    a, b = math.cos(rot), -math.cos(rot) * math.tan(sx) - math.sin(rot)
    c, d = math.sin(rot), -math.sin(rot) * math.tan(sx) + math.cos(rot)
    linear = np.array([[d, -b], [-c, a]]) / scale  # inverse of [[a, b], [c, d]], det = 1
    centre = np.array([(w - 1) / 2, (h - 1) / 2])
    offset = centre - linear @ (centre + np.array([translate, 0.0]))
    return np.block([[linear, offset[:, None]], [np.zeros((1, 2)), np.ones((1, 1))]])


def _tilt_inverse(h: int, w: int, degrees: float) -> np.ndarray:
    """ImageNet-P's tilt: a camera rotation by ``degrees`` about both image axes.

    The forward homography is ``P2 @ T @ RX @ RY @ P1`` of ``make_imagenet_p.py`` (focal
    length f = image diagonal), applied as ``cv2.warpPerspective`` applies it. As in the
    reference, 0 degrees is not the identity but a shrink by f / (1 + f) about the centre.
    """
    t = math.radians(degrees)
    f = math.hypot(w, h)
    p1 = np.array([[1, 0, -w / 2], [0, 1, -h / 2], [0, 0, 1], [0, 0, 1]])
    rx = np.array([[1, 0, 0, 0], [0, math.cos(t), -math.sin(t), 0], [0, math.sin(t), math.cos(t), 0], [0, 0, 0, 1]])
    ry = np.array([[math.cos(t), 0, -math.sin(t), 0], [0, 1, 0, 0], [math.sin(t), 0, math.cos(t), 0], [0, 0, 0, 1]])
    shift = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, f], [0, 0, 0, 1]])
    p2 = np.array([[f, 0, w / 2, 0], [0, f, h / 2, 0], [0, 0, 1, 0]])
    return np.linalg.inv(p2 @ shift @ rx @ ry @ p1)


def _box3(img: jax.Array) -> jax.Array:
    """OpenCV's 3x3 ``blur`` (border reflect-101)."""
    ones = jnp.full((3,), 1 / 3, img.dtype)
    return _taps_filter(_taps_filter(img, ones, 0, "reflect"), ones, 1, "reflect")


def _correlate3(img: jax.Array, kernel: np.ndarray, pad_mode: str) -> jax.Array:
    padded = jnp.pad(img, 1, mode=pad_mode)
    h, w = img.shape
    return sum(kernel[i, j] * padded[i:i + h, j:j + w] for i in range(3) for j in range(3) if kernel[i, j])


# ------------------------------------------------------------------------ spatter helpers

_SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
_EMBOSS = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], np.float32)
_NEIGHBOURS = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]


def _shifted(a: jax.Array, di: int, dj: int, fill) -> jax.Array:
    """``out[r, c] = a[r + di, c + dj]``, ``fill`` outside."""
    padded = jnp.pad(a, 1, constant_values=fill)
    h, w = a.shape
    return padded[1 + di:1 + di + h, 1 + dj:1 + dj + w]


def _canny(img: jax.Array, low: float, high: float) -> jax.Array:
    """OpenCV's ``Canny`` (3x3 Sobel, L1 magnitude) on a uint8-valued (H, W) image; bool edges.

    Non-maximum suppression along the quantised gradient direction (OpenCV's asymmetric
    ``>`` / ``>=`` comparisons), then hysteresis: pixels above ``high`` seed edges that grow
    through 8-connected pixels above ``low``.
    """
    dx = _correlate3(img, _SOBEL_X, "edge")
    dy = _correlate3(img, _SOBEL_X.T, "edge")
    mag = jnp.abs(dx) + jnp.abs(dy)
    at = lambda di, dj: _shifted(mag, di, dj, 0.0)  # noqa: E731
    ax, ay = jnp.abs(dx), jnp.abs(dy)
    tan22 = math.tan(math.radians(22.5))
    horizontal = ay < ax * tan22
    vertical = ay > ax * (tan22 + 2)  # tan(67.5) = tan(22.5) + 2
    s = jnp.where(dx * dy < 0, -1, 1)
    diag_a = jnp.where(s > 0, at(-1, -1), at(-1, 1))
    diag_b = jnp.where(s > 0, at(1, 1), at(1, -1))
    is_max = jnp.where(
        horizontal, (mag > at(0, -1)) & (mag >= at(0, 1)),
        jnp.where(vertical, (mag > at(-1, 0)) & (mag >= at(1, 0)), (mag > diag_a) & (mag > diag_b)),
    )
    candidate = is_max & (mag > low)

    def grow(edges):
        near = functools.reduce(jnp.logical_or, [_shifted(edges, i, j, False) for i, j in _NEIGHBOURS])
        return candidate & near

    edges = jax.lax.while_loop(
        lambda e: jnp.any(e[0] != e[1]), lambda e: (e[1], grow(e[1])), (candidate & False, candidate & (mag > high))
    )[1]
    return edges


def _distance_to(edges: jax.Array, cap: int) -> jax.Array:
    """Euclidean distance to the nearest ``True`` pixel, capped at ``cap`` (separable, exact)."""
    far = float(cap + 1) ** 2

    def along(sq: jax.Array, axis: int) -> jax.Array:
        padded = jnp.pad(sq, [(cap, cap) if a == axis else (0, 0) for a in range(2)], constant_values=far)
        n = sq.shape[axis]
        return functools.reduce(jnp.minimum, [
            jax.lax.slice_in_dim(padded, cap + d, cap + d + n, axis=axis) + d * d for d in range(-cap, cap + 1)
        ])

    sq = along(jnp.where(edges, 0.0, far), 1)
    return jnp.minimum(jnp.sqrt(along(jnp.minimum(sq, far), 0)), float(cap))


def _equalize_hist(img: jax.Array) -> jax.Array:
    """OpenCV's ``equalizeHist`` on a uint8-valued (H, W) image."""
    levels = img.astype(jnp.int32)
    hist = jnp.bincount(levels.ravel(), length=256)
    cdf = jnp.cumsum(hist)
    first = jnp.argmax(hist > 0)
    total, base = levels.size, hist[first]
    lut = jnp.round((cdf - base) * (255.0 / jnp.maximum(total - base, 1)))
    lut = jnp.where(jnp.arange(256) <= first, 0.0, lut)
    return jnp.where(base == total, img, lut[levels])


def _spatter_mask(layer: jax.Array) -> jax.Array:
    """The water highlight of one liquid layer, ImageNet-C/-P's ``spatter`` (water branch)."""
    levels = jnp.floor(layer * 255)
    dist = _distance_to(_canny(levels, 50.0, 150.0), 20)
    dist = _equalize_hist(jnp.floor(_box3(dist)))
    dist = jnp.clip(jnp.round(_correlate3(dist, _EMBOSS, "reflect")), 0, 255)
    mask = levels * jnp.round(_box3(dist))
    peak = jnp.max(mask)
    return 0.6 * jnp.where(peak > 0, mask / jnp.where(peak > 0, peak, 1.0), 0.0)


# --------------------------------------------------------------------------- renderers
# Each renders the (T, H, W, C) frames of one image from the per-frame parameters.

def _gaussian_noise(x, key, *, params, preset):
    noise = jax.random.normal(key, (len(params), *x.shape))
    return x + params.reshape(-1, 1, 1, 1).astype(np.float32) * noise


def _speckle_noise(x, key, *, params, preset):
    noise = jax.random.normal(key, (len(params), *x.shape))
    return x + x * params.reshape(-1, 1, 1, 1).astype(np.float32) * noise


def _shot_noise(x, key, *, params, preset):
    photons = np.where(params > 0, params, 1.0).reshape(-1, 1, 1, 1).astype(np.float32)
    counts = jax.random.poisson(key, x * photons, (len(params), *x.shape))
    return jnp.where(params.reshape(-1, 1, 1, 1) > 0, counts / photons, x)


def _motion_blur(x, key, *, params, preset):
    weights, rows, cols = _motion_taps(params, *_MOTION[preset])
    return jax.vmap(lambda r, c: _motion_blur_frame(x, weights, r, c))(rows, cols)


def _zoom_blur(x, key, *, params, preset):
    h, w = x.shape[:2]
    inverses = np.stack([_affine_inverse(h, w, scale=s) for s in params]).astype(np.float32)
    zooms = jax.vmap(lambda m: _warp(x, m))(inverses)
    return jnp.cumsum(zooms, axis=0) / np.arange(1, len(params) + 1, dtype=np.float32).reshape(-1, 1, 1, 1)


def _gaussian_blur(x, key, *, params, preset):
    truncate = _TRUNCATE[preset]
    radius = int(truncate * params.max() + 0.5)
    weights = np.stack([_gaussian_weights(s, truncate, radius) for s in params])
    return jax.vmap(lambda wt: _gaussian_filter(x, wt))(weights)


def _snow(x, key, *, params, preset):
    zoom, radius, sigma = _SNOW[preset]
    h, w = x.shape[:2]
    layer = 0.05 + 0.3 * jax.random.normal(key, (h, w))
    rows, cols = _clipped_zoom_coordinates(h, zoom), _clipped_zoom_coordinates(w, zoom)
    layer = map_coordinates(layer, list(np.meshgrid(rows, cols, indexing="ij")), order=1, mode="nearest")
    layer = jnp.clip(jnp.where(layer < 0.5, 0.0, layer), 0.0, 1.0)
    base = 0.85 * x + 0.15 * jnp.maximum(x, _gray(x) * 1.5 + 0.5)
    weights, offset_rows, offset_cols = _motion_taps(params, radius, sigma)

    def frame(r, c):
        flakes = _motion_blur_frame(layer, weights, r, c)[..., None]
        return base + flakes + flakes[::-1, ::-1]

    return jax.vmap(frame)(offset_rows, offset_cols)


def _clipped_zoom_coordinates(n: int, zoom: int) -> np.ndarray:
    """Source coordinates of ImageNet-C's ``clipped_zoom``: centre crop, scipy zoom, trim."""
    crop = int(np.ceil(n / zoom))
    top = (n - crop) // 2
    out = int(round(crop * zoom))
    trim = (out - n) // 2
    return top + np.arange(trim, trim + n) * (crop - 1) / (out - 1)


def _spatter(x, key, *, params, preset):
    loc, scale, sigma, threshold, drip = _SPATTER[preset]
    h, w = x.shape[:2]
    layer = loc + scale * jax.random.normal(key, (h, w))
    radius = int(4.0 * sigma + 0.5)  # skimage's default truncate = 4
    layer = _gaussian_filter(layer, jnp.asarray(_gaussian_weights(sigma, 4.0, radius)))
    layer = jnp.where(layer < threshold, 0.0, layer)
    drip_down = jax.vmap(lambda col: jnp.convolve(col, jnp.asarray(drip, layer.dtype), mode="same"), 1, 1)

    def step(current, _):
        return drip_down(current), current

    _, layers = jax.lax.scan(step, layer, None, length=len(params))
    colour = jnp.asarray(_WATER_RGB if x.shape[-1] == 3 else _WATER_RGB @ _LUMA)
    return x + jax.vmap(_spatter_mask)(layers)[..., None] * colour


def _brightness(x, key, *, params, preset):
    """Adds ``c`` to the HSV value channel: hue and saturation fixed, so RGB scales with V."""
    value = jnp.max(x, axis=-1, keepdims=True)
    shift = params.reshape(-1, 1, 1, 1).astype(np.float32)
    new_value = jnp.clip(value + shift, 0.0, 1.0)
    return jnp.where(value > 0, x * (new_value / jnp.where(value > 0, value, 1.0)), new_value)


def _geometric(inverse: Callable[..., np.ndarray]):
    def render(x, key, *, params, preset):
        h, w = x.shape[:2]
        inverses = np.stack([inverse(h, w, p) for p in params]).astype(np.float32)
        return jax.vmap(lambda m: _warp(x, m))(inverses)

    return render


for _name, _family, _render in (
    ("gaussian_noise", "noise", _gaussian_noise),
    ("shot_noise", "noise", _shot_noise),
    ("speckle_noise", "noise", _speckle_noise),
    ("motion_blur", "blur", _motion_blur),
    ("zoom_blur", "blur", _zoom_blur),
    ("gaussian_blur", "blur", _gaussian_blur),
    ("snow", "weather", _snow),
    ("spatter", "weather", _spatter),
    ("brightness", "digital", _brightness),
    ("translate", "digital", _geometric(lambda h, w, p: _affine_inverse(h, w, translate=p))),
    ("rotate", "digital", _geometric(lambda h, w, p: _affine_inverse(h, w, angle=p))),
    ("tilt", "digital", _geometric(_tilt_inverse)),
    ("scale", "digital", _geometric(lambda h, w, p: _affine_inverse(h, w, scale=p))),
    ("shear", "digital", _geometric(lambda h, w, p: _affine_inverse(h, w, shear=p))),
):
    _PERTURBATIONS.register(_name, Perturbation(_name, _family, _render))
