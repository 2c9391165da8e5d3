"""Weather corruptions of ImageNet-C: snow, frost, fog, and the extra spatter.

Definitions follow Hendrycks & Dietterich (ICLR 2019) as implemented in the
``imagecorruptions`` package (ImageNet-C constants, any image size, its own numpy motion
blur in place of ImageMagick's) and in ``make_cifar_c.py`` (CIFAR-10-C constants). Each
corruption is split into a random draw from the key and a deterministic ``*_from_noise``
function of that draw, so the deterministic part can be checked against the reference fed
with the reference's own draw.

On 1-channel images the colour layers are reduced to grey with the luminance weights
(0.2989, 0.587, 0.114), as ``imagecorruptions`` does.
"""

from __future__ import annotations

import functools
import importlib.resources
import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage
from jaxtyping import Array, Bool, Float, Shaped
from PIL import Image

from robustjax.noise.digital import apply_separable, gaussian_filter_2d, linear_operator_matrix
from robustjax.noise.registry import register_corruption

Images = Float[Array, "b h w c"]
Field = Float[Array, "h w"]

_LUMA_RGB = jnp.array([0.2989, 0.587, 0.114])


def _to_gray(rgb: Float[Array, "... 3"]) -> Float[Array, "... 1"]:
    return (rgb @ _LUMA_RGB)[..., None]


def _colour_layer(rgb: Float[Array, "h w 3"], channels: int) -> Float[Array, "h w c"]:
    return rgb if channels == 3 else _to_gray(rgb)


def _per_image(draw_and_apply, x: Images, key: jax.Array) -> Images:
    return jax.vmap(draw_and_apply)(x, jax.random.split(key, x.shape[0]))


# ----------------------------------------------------------------------------- fog


def plasma_fractal_from_noise(unit_noise: list[Float[Array, "3 _n _n"]], wibbledecay: float) -> Field:
    """Diamond-square height map in [0, 1] (``imagecorruptions.plasma_fractal``).

    ``unit_noise[i]`` holds the uniform(-1, 1) draws of level ``i`` (squares, then the two
    diamond sets), each ``(n, n)`` with ``n = 2**i``; the map is ``2**len(unit_noise)`` square.
    Each new point is the mean of its four neighbours (wrapping around) plus
    ``wibble**2 * u``, with ``wibble = 100 / wibbledecay**i``. Level ``i`` refines the
    ``n x n`` grid of points computed so far to ``2n x 2n`` by interleaving.
    """
    grid, wibble = jnp.zeros((1, 1), jnp.float32), 100.0
    for noise in unit_noise:
        n = grid.shape[0]
        squares = grid + jnp.roll(grid, -1, axis=0)
        squares = squares + jnp.roll(squares, -1, axis=1)
        centres = squares / 4 + wibble**2 * noise[0]
        left = centres + jnp.roll(centres, 1, axis=0) + grid + jnp.roll(grid, -1, axis=1)
        left = left / 4 + wibble**2 * noise[1]
        top = centres + jnp.roll(centres, 1, axis=1) + grid + jnp.roll(grid, -1, axis=0)
        top = top / 4 + wibble**2 * noise[2]
        even_rows = jnp.stack([grid, left], axis=-1).reshape(n, 2 * n)
        odd_rows = jnp.stack([top, centres], axis=-1).reshape(n, 2 * n)
        grid = jnp.stack([even_rows, odd_rows], axis=1).reshape(2 * n, 2 * n)
        wibble /= wibbledecay
    grid = grid - grid.min()
    return grid / grid.max()


def plasma_fractal(key: jax.Array, size: int, wibbledecay: float) -> Field:
    """A random diamond-square height map of side ``size`` (a power of two)."""
    levels = int(math.log2(size))
    # One draw for all levels (one random-bits program compiles much faster than several).
    flat = jax.random.uniform(key, (size * size - 1,), minval=-1.0, maxval=1.0)
    noise, start = [], 0
    for i in range(levels):
        count = 3 * 4**i
        noise.append(flat[start : start + count].reshape(3, 2**i, 2**i))
        start += count
    return plasma_fractal_from_noise(noise, wibbledecay)


def fog_from_field(image: Float[Array, "h w c"], field: Float[Array, "n n"], c: tuple[float, float]) -> Float[Array, "h w c"]:
    """``(x + c0 * field) * max(x) / (max(x) + c0)`` with the field cropped to the image."""
    h, w = image.shape[:2]
    peak = image.max()
    return (image + c[0] * field[:h, :w, None]) * peak / (peak + c[0])


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


@register_corruption(
    "fog",
    family="weather",
    imagenet=((1.5, 2.0), (2.0, 2.0), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)),
    cifar=((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)),
    stochastic=True,
)
def fog(x: Images, c: tuple[float, float], key: jax.Array) -> Images:
    """Adds a plasma-fractal haze of strength ``c[0]`` and roughness decay ``c[1]``."""
    size = _next_power_of_two(max(x.shape[1:3]))
    return _per_image(lambda image, k: fog_from_field(image, plasma_fractal(k, size, c[1]), c), x, key)


# ----------------------------------------------------------------------------- frost

# imagecorruptions draws one of the first five files; frost3 is a byte-identical copy of
# frost2, so the bundled set stores four textures and maps the five draws onto them.
_FROST_DRAW_TO_TEXTURE = (0, 1, 1, 2, 3)
_FROST_NAMES = ("frost1", "frost2", "frost4", "frost5")


@functools.lru_cache(maxsize=1)
def _frost_assets() -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    path = importlib.resources.files("robustjax.noise") / "assets" / "frost.npz"
    with path.open("rb") as f, np.load(f, allow_pickle=False) as data:
        return tuple(data[name] for name in _FROST_NAMES), data["native_hw"]


@functools.lru_cache(maxsize=16)
def _frost_textures(h: int, w: int, zoom: float) -> tuple[np.ndarray, np.ndarray]:
    """Textures scaled for an ``h x w`` image, zero-padded to one stack, and their sizes.

    Scale per texture: ``max(zoom, 1.1 * max(h / H0, w / W0))`` of its native size
    ``(H0, W0)``: ImageNet (``zoom`` 1.1) is imagecorruptions' rule, CIFAR (``zoom`` 0.2)
    is make_cifar_c.py's fixed 0.2, enlarged when the image would not fit.
    """
    textures, native = _frost_assets()
    scaled = []
    for texture, (h0, w0) in zip(textures, native):
        scale = max(zoom, 1.1 * max(h / h0, w / w0))
        size = (int(np.ceil(w0 * scale)), int(np.ceil(h0 * scale)))
        scaled.append(np.asarray(Image.fromarray(texture).resize(size, Image.BICUBIC)))
    sizes = np.array([t.shape[:2] for t in scaled], np.int32)
    stack = np.zeros((len(scaled), *sizes.max(axis=0), 3), np.uint8)
    for i, t in enumerate(scaled):
        stack[i, : t.shape[0], : t.shape[1]] = t
    return stack, sizes


def frost_from_crop(image: Float[Array, "h w c"], crop: Float[Array, "h w c"], c) -> Float[Array, "h w c"]:
    """``c0 * x + c1 * frost`` with the frost crop in [0, 1]."""
    return c[0] * image + c[1] * crop


@register_corruption(
    "frost",
    family="weather",
    imagenet=((1.0, 0.4, 1.1), (0.8, 0.6, 1.1), (0.7, 0.7, 1.1), (0.65, 0.7, 1.1), (0.6, 0.75, 1.1)),
    cifar=((1.0, 0.2, 0.2), (1.0, 0.3, 0.2), (0.9, 0.4, 0.2), (0.85, 0.4, 0.2), (0.75, 0.45, 0.2)),
    stochastic=True,
)
def frost(x: Images, c: tuple[float, float, float], key: jax.Array) -> Images:
    """Blends in a random crop of a random frost texture (ImageNet-C's five photographs)."""
    h, w, channels = x.shape[1:]
    stack, sizes = _frost_textures(h, w, float(c[2]))
    stack, sizes = jnp.asarray(stack), jnp.asarray(sizes)
    draw_to_texture = jnp.asarray(_FROST_DRAW_TO_TEXTURE)

    def one(image, k):
        # Uniform integers in [0, n) as floor(u * n): texture draw, then crop row and column.
        u = jax.random.uniform(k, (3,))
        draw = jnp.floor(u[0] * len(_FROST_DRAW_TO_TEXTURE)).astype(jnp.int32)
        texture = draw_to_texture[draw]
        row = jnp.floor(u[1] * (sizes[texture, 0] - h)).astype(jnp.int32)
        col = jnp.floor(u[2] * (sizes[texture, 1] - w)).astype(jnp.int32)
        crop = jax.lax.dynamic_slice(stack, (texture, row, col, 0), (1, h, w, 3))[0]
        return frost_from_crop(image, _colour_layer(crop.astype(jnp.float32) / 255.0, channels), c)

    return _per_image(one, x, key)


# ----------------------------------------------------------------------------- snow


def _zoom_columns(eye: np.ndarray, factor: float) -> np.ndarray:
    return scipy.ndimage.zoom(eye, (factor, 1.0), order=1)


def clipped_zoom_2d(field: Field, factor: float) -> Float[Array, "p q"]:
    """imagecorruptions' ``clipped_zoom``: centre crop of ``ceil(n / factor)`` per side, then
    ``scipy.ndimage.zoom(order=1)``; the result may be slightly larger than ``field``."""
    crops = []
    for n in field.shape:
        length = int(np.ceil(n / factor))
        crops.append(((n - length) // 2, length))
    (top, ch), (left, cw) = crops
    rows = linear_operator_matrix(_zoom_columns, ch, float(factor))
    cols = linear_operator_matrix(_zoom_columns, cw, float(factor))
    return apply_separable(field[top : top + ch, left : left + cw], rows, cols)


def motion_blur_2d(field: Float[Array, "h w"], radius: int, sigma: float, angle: jax.Array) -> Float[Array, "h w"]:
    """imagecorruptions' ``_motion_blur``: a one-sided Gaussian-weighted sum of copies of
    ``field`` shifted along ``angle`` (degrees), with edge replication; taps that would
    shift by the full image size or more are dropped (the kernel is not renormalised)."""
    h, w = field.shape
    width = 2 * radius + 1
    taps = np.arange(width)
    weights = np.exp(-(taps**2) / (2 * sigma**2))
    weights = jnp.asarray(weights / weights.sum(), jnp.float32)
    radians = jnp.deg2rad(angle)
    dy = -jnp.ceil(taps * jnp.sin(radians) - 0.5).astype(jnp.int32)
    dx = -jnp.ceil(taps * jnp.cos(radians) - 0.5).astype(jnp.int32)
    inside = jnp.cumprod((jnp.abs(dy) < h) & (jnp.abs(dx) < w))
    rows, cols = jnp.arange(h), jnp.arange(w)

    def add_tap(i, total):
        shifted = field[jnp.clip(rows - dy[i], 0, h - 1)][:, jnp.clip(cols - dx[i], 0, w - 1)]
        return total + (weights[i] * inside[i]) * shifted

    return jax.lax.fori_loop(0, width, add_tap, jnp.zeros_like(field))


def snow_from_noise(image: Float[Array, "h w c"], normal: Field, angle: jax.Array, c) -> Float[Array, "h w c"]:
    """Snow given a standard-normal field and the motion angle in degrees.

    ``c = (mean, std, zoom, threshold, blur radius, blur sigma, image weight)``: flakes are
    ``mean + std * normal``, zoomed, thresholded, motion-blurred and quantised to 8 bits;
    the image is brightened towards ``1.5 * grey + 0.5`` and the flakes are added twice
    (once rotated by 180 degrees).
    """
    mean, std, zoom, threshold, radius, sigma, weight = c
    h, w, channels = image.shape
    flakes = clipped_zoom_2d(mean + std * normal, zoom)
    flakes = jnp.clip(jnp.where(flakes < threshold, 0.0, flakes), 0.0, 1.0)
    flakes = motion_blur_2d(flakes, int(radius), float(sigma), angle)
    flakes = (jnp.round(flakes * 255.0) / 255.0)[:h, :w, None]
    gray = image if channels == 1 else (image @ jnp.array([0.299, 0.587, 0.114]))[..., None]
    image = weight * image + (1 - weight) * jnp.maximum(image, gray * 1.5 + 0.5)
    return image + flakes + flakes[::-1, ::-1]


@register_corruption(
    "snow",
    family="weather",
    imagenet=(
        (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    ),
    cifar=(
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ),
    stochastic=True,
)
def snow(x: Images, c: tuple, key: jax.Array) -> Images:
    """Falling snow: zoomed, thresholded Gaussian noise, motion-blurred at an angle in
    [-135, -45) degrees."""
    h, w = x.shape[1:3]

    def one(image, k):
        # One normal draw; its last value, through the normal CDF, gives a uniform angle.
        normal = jax.random.normal(k, (h * w + 1,))
        angle = -135.0 + 90.0 * jax.scipy.special.ndtr(normal[-1])
        return snow_from_noise(image, normal[:-1].reshape(h, w), angle, c)

    return _per_image(one, x, key)


# ----------------------------------------------------------------------------- spatter


def _shifts(field: Shaped[Array, "h w"], radius: int, pad_mode: str, **pad_kwargs):
    """``{(dy, dx): field[y + dy, x + dx]}`` for ``|dy|, |dx| <= radius`` with the given border."""
    h, w = field.shape
    padded = jnp.pad(field, radius, mode=pad_mode, **pad_kwargs)
    return {
        (dy, dx): padded[radius + dy : radius + dy + h, radius + dx : radius + dx + w]
        for dy in range(-radius, radius + 1)
        for dx in range(-radius, radius + 1)
    }


def _correlate3x3(field: Field, kernel: np.ndarray, pad_mode: str) -> Field:
    shifted = _shifts(field, 1, pad_mode)
    return sum(float(kernel[dy + 1, dx + 1]) * shifted[dy, dx] for dy, dx in shifted if kernel[dy + 1, dx + 1])


def _box3(field: Field) -> Field:
    """``cv2.blur(field, (3, 3))`` (reflect-101 border), before any 8-bit rounding: the sum
    of the nine values, then divided (as OpenCV does, so exact means stay exact)."""
    return _correlate3x3(field, np.ones((3, 3)), "reflect") / 9.0


def canny_edges(image: Float[Array, "h w"], low: float, high: float) -> Bool[Array, "h w"]:
    """``cv2.Canny(image, low, high)`` on 8-bit values: 3x3 Sobel (replicated border), L1
    magnitude, non-maximum suppression in four directions, 8-connected hysteresis."""
    shifted = _shifts(image, 1, "edge")
    gx = (shifted[-1, 1] + 2 * shifted[0, 1] + shifted[1, 1]) - (shifted[-1, -1] + 2 * shifted[0, -1] + shifted[1, -1])
    gy = (shifted[1, -1] + 2 * shifted[1, 0] + shifted[1, 1]) - (shifted[-1, -1] + 2 * shifted[-1, 0] + shifted[-1, 1])
    magnitude = jnp.abs(gx) + jnp.abs(gy)
    around = _shifts(magnitude, 1, "constant")  # outside the image the magnitude is 0
    # OpenCV's integer tests for |gy| / |gx| < tan(22.5 deg) and > tan(67.5 deg).
    tan22 = round(0.4142135623730950488 * 2**15)
    ax, ay = jnp.abs(gx) * tan22, jnp.abs(gy) * 2**15
    horizontal = ay < ax
    vertical = ay > ax + jnp.abs(gx) * 2**16
    same_sign = (gx * gy) >= 0
    keep_h = (magnitude > around[0, -1]) & (magnitude >= around[0, 1])
    keep_v = (magnitude > around[-1, 0]) & (magnitude >= around[1, 0])
    keep_d = jnp.where(
        same_sign,
        (magnitude > around[-1, -1]) & (magnitude > around[1, 1]),
        (magnitude > around[-1, 1]) & (magnitude > around[1, -1]),
    )
    maximum = jnp.where(horizontal, keep_h, jnp.where(vertical, keep_v, keep_d))
    weak = maximum & (magnitude > low)
    strong = weak & (magnitude > high)

    def grow(state):
        edges, _ = state
        neighbours = _shifts(edges, 1, "constant")
        grown = edges | (weak & functools.reduce(jnp.logical_or, neighbours.values()))
        return grown, jnp.any(grown != edges)

    edges, _ = jax.lax.while_loop(lambda s: s[1], grow, (strong, jnp.array(True)))
    return edges


def chamfer_distance(edges: Bool[Array, "h w"], cap: float) -> Float[Array, "h w"]:
    """``min(cv2.distanceTransform(~edges, DIST_L2, 5), cap)``: the 5x5 chamfer distance
    (steps 1, 1.4 and 2.1969) to the nearest edge pixel, capped at ``cap``.

    Parallel relaxation: after ``k`` rounds every path of at most ``k`` steps has been
    tried, and a path shorter than ``cap`` has fewer than ``cap`` steps of length >= 1.
    """
    cost_by_offset = {(0, 1): 1.0, (1, 1): 1.4, (1, 2): 2.1969}  # sorted |offsets| -> step cost
    steps = {
        (dy, dx): cost_by_offset[tuple(sorted((abs(dy), abs(dx))))]
        for dy in range(-2, 3)
        for dx in range(-2, 3)
        if tuple(sorted((abs(dy), abs(dx)))) in cost_by_offset
    }
    far = 2.0 * cap

    def relax(_, dist):
        around = _shifts(dist, 2, "constant", constant_values=far)
        return functools.reduce(jnp.minimum, [around[s] + d for s, d in steps.items()], dist)

    dist = jax.lax.fori_loop(0, int(np.ceil(cap)), relax, jnp.where(edges, 0.0, far))
    return jnp.minimum(dist, cap)


def equalize_hist(image: Float[Array, "h w"]) -> Float[Array, "h w"]:
    """``cv2.equalizeHist`` on 8-bit values (given as floats)."""
    levels = image.astype(jnp.int32)
    hist = jnp.zeros(256, jnp.int32).at[levels.ravel()].add(1)
    first = jnp.argmax(hist > 0)
    total = image.size
    below_first = hist[first]
    scale = 255.0 / jnp.maximum(total - below_first, 1)
    lut = jnp.round((jnp.cumsum(hist) - below_first).astype(jnp.float32) * scale)
    lut = jnp.where(below_first == total, first.astype(jnp.float32), lut)
    return lut[levels]


def spatter_from_noise(image: Float[Array, "h w c"], normal: Field, c) -> Float[Array, "h w c"]:
    """Spatter given a standard-normal field.

    ``c = (mean, std, sigma, threshold, strength, mud)``: a liquid layer
    ``gaussian(mean + std * normal, sigma)`` cut below ``threshold``. Water (``mud == 0``)
    adds pale turquoise where the layer is, shaded by an embossed, histogram-equalised
    distance to the layer's Canny edges; mud (``mud == 1``) blends in brown where the
    blurred (``strength``) layer mask exceeds 0.8.
    """
    mean, std, sigma, threshold, strength, mud = c
    channels = image.shape[-1]
    liquid = gaussian_filter_2d(mean + std * normal, (sigma, sigma), mode="nearest", truncate=4.0)
    liquid = jnp.where(liquid < threshold, 0.0, liquid)
    if mud:
        mask = gaussian_filter_2d((liquid > threshold).astype(jnp.float32), (strength, strength),
                                  mode="nearest", truncate=4.0)
        mask = jnp.where(mask < 0.8, 0.0, mask)[..., None]
        brown = mask * jnp.array([63.0, 42.0, 20.0]) / 255.0
        return image * (1 - mask) + _colour_layer(brown, channels)
    liquid8 = jnp.floor(jnp.clip(liquid * 255.0, 0.0, 255.0))
    dist = chamfer_distance(canny_edges(liquid8, 50.0, 150.0), 20.0)
    dist = equalize_hist(jnp.floor(_box3(dist)))
    emboss = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]])
    dist = jnp.clip(jnp.round(_correlate3x3(dist, emboss, "reflect")), 0.0, 255.0)
    dist = jnp.round(_box3(dist))
    shade = liquid8 * dist
    shade = (shade / jnp.maximum(shade.max(), 1e-12) * strength)[..., None]
    water = shade * jnp.array([175.0, 238.0, 238.0]) / 255.0
    if channels == 1:
        water = jnp.clip(water, 0.0, 1.0)
    return image + _colour_layer(water, channels)


@register_corruption(
    "spatter",
    family="extra",
    imagenet=(
        (0.65, 0.3, 4, 0.69, 0.6, 0),
        (0.65, 0.3, 3, 0.68, 0.6, 0),
        (0.65, 0.3, 2, 0.68, 0.5, 0),
        (0.65, 0.3, 1, 0.65, 1.5, 1),
        (0.67, 0.4, 1, 0.65, 1.5, 1),
    ),
    cifar=(
        (0.62, 0.1, 0.7, 0.7, 0.5, 0),
        (0.65, 0.1, 0.8, 0.7, 0.5, 0),
        (0.65, 0.3, 1, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1),
    ),
    stochastic=True,
)
def spatter(x: Images, c: tuple, key: jax.Array) -> Images:
    """Water drops (severities 1-3) or mud splashes (4-5) from thresholded smooth noise."""
    h, w = x.shape[1:3]
    return _per_image(lambda image, k: spatter_from_noise(image, jax.random.normal(k, (h, w)), c), x, key)
