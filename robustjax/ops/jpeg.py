"""Baseline JPEG compression (ITU-T T.81) as a jit-able JAX round trip, bit-exact with libjpeg.

``jpeg_round_trip`` encodes and decodes images the way libjpeg(-turbo) does when Pillow
saves with ``quality=q`` and reads the file back (the reference of the ImageNet-C
``jpeg_compression`` corruption), step for step in integer arithmetic:

1. 8-bit samples; RGB -> YCbCr (JFIF) in libjpeg's 16-bit fixed point;
2. 4:2:0 chroma subsampling (2x2 sums with libjpeg's alternating 1, 2 rounding bias),
   every plane padded to whole 8x8 blocks by edge replication as libjpeg pads it;
3. level shift by 128 and libjpeg's "islow" 8x8 DCT-II (the Loeffler-Ligtenberg-Moschytz
   factorisation in 13-bit fixed point, 8 x the orthonormal transform);
4. quantisation by the Annex K luminance / chrominance tables scaled by libjpeg's quality
   formula (clamped to 1..255 as for baseline), rounding half away from zero;
5. dequantisation, islow inverse DCT, clamping to 8 bits;
6. libjpeg's "fancy" (triangular) 2x chroma upsampling and fixed-point YCbCr -> RGB.

One-channel images are coded as luminance only, which is what libjpeg gives, bit for bit,
for a grey image stored as RGB (imagecorruptions' route). The entropy coding stage is
lossless and therefore left out. Quantisation makes the round trip piecewise constant:
its gradient is zero almost everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from robustjax.checks import as_images
from robustjax.sharding import auto_axes_over_batch

# ITU-T T.81 Annex K, tables K.1 and K.2 (natural row-major order).
LUMINANCE_TABLE = np.array([
    16, 11, 10, 16, 24, 40, 51, 61,
    12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77,
    24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101,
    72, 92, 95, 98, 112, 100, 103, 99,
]).reshape(8, 8)
CHROMINANCE_TABLE = np.array([
    17, 18, 24, 47, 99, 99, 99, 99,
    18, 21, 26, 66, 99, 99, 99, 99,
    24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
]).reshape(8, 8)

# libjpeg's fixed-point colour conversion (jccolor.c / jdcolor.c): FIX(v) = round(v * 2**16).
_SCALE_BITS = 16
_HALF = 1 << (_SCALE_BITS - 1)


def _fix(value: float) -> int:
    return int(value * (1 << _SCALE_BITS) + 0.5)


def quantization_tables(quality: int | jax.Array) -> tuple[jax.Array, jax.Array]:
    """libjpeg's ``jpeg_set_quality(quality, force_baseline=TRUE)``: the Annex K tables
    scaled by ``5000 / q`` (q < 50) or ``200 - 2 q`` percent, clamped to 1..255.

    ``quality`` may be traced, so one compiled program serves every quality."""
    quality = jnp.asarray(quality, jnp.int32)
    scale = jnp.where(quality < 50, 5000 // quality, 200 - 2 * quality)

    def scaled(table):
        return jnp.clip((jnp.asarray(table, jnp.int32) * scale + 50) // 100, 1, 255)

    return scaled(LUMINANCE_TABLE), scaled(CHROMINANCE_TABLE)


def _rgb_to_ycbcr(rgb: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    r, g, b = jnp.moveaxis(rgb, -1, 0)
    chroma_offset = (128 << _SCALE_BITS) + _HALF - 1
    y = (_fix(0.299) * r + _fix(0.587) * g + _fix(0.114) * b + _HALF) >> _SCALE_BITS
    cb = (-_fix(0.16874) * r - _fix(0.33126) * g + _fix(0.5) * b + chroma_offset) >> _SCALE_BITS
    cr = (_fix(0.5) * r - _fix(0.41869) * g - _fix(0.08131) * b + chroma_offset) >> _SCALE_BITS
    return y, cb, cr


def _ycbcr_to_rgb(y: jax.Array, cb: jax.Array, cr: jax.Array) -> jax.Array:
    cb, cr = cb - 128, cr - 128
    r = y + ((_fix(1.402) * cr + _HALF) >> _SCALE_BITS)
    g = y + ((-_fix(0.34414) * cb - _fix(0.71414) * cr + _HALF) >> _SCALE_BITS)
    b = y + ((_fix(1.772) * cb + _HALF) >> _SCALE_BITS)
    return jnp.clip(jnp.stack([r, g, b], axis=-1), 0, 255)


def _pad_to(plane: jax.Array, height: int, width: int) -> jax.Array:
    """Pads (B, h, w) at the bottom and right by replicating the last row and column."""
    return jnp.pad(plane, ((0, 0), (0, height - plane.shape[1]), (0, width - plane.shape[2])), mode="edge")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _subsample(plane: jax.Array) -> jax.Array:
    """libjpeg's h2v2 downsampling of a full-resolution chroma plane (B, H, W).

    Like libjpeg, the plane is first padded by edge replication to an even height and to
    16-pixel-wide blocks; each output sample is ``(sum of its 2x2 inputs + bias) >> 2`` with
    the bias alternating 1, 2 along a row; the result is padded to whole 8x8 blocks by
    replicating its last row.
    """
    _, height, width = plane.shape
    blocks_high, blocks_wide = _ceil_div(height, 16), _ceil_div(width, 16)
    plane = _pad_to(plane, 2 * _ceil_div(height, 2), 16 * blocks_wide)
    b, h, w = plane.shape
    sums = plane.reshape(b, h // 2, 2, w // 2, 2).sum(axis=(2, 4))
    bias = jnp.arange(w // 2) % 2 + 1
    return _pad_to((sums + bias) >> 2, 8 * blocks_high, 8 * blocks_wide)


def _upsample(plane: jax.Array) -> jax.Array:
    """libjpeg's "fancy" h2v2 upsampling: a separable triangle filter (weights 3/4, 1/4)
    with the edges replicated, in integer arithmetic with libjpeg's rounding."""
    padded = jnp.pad(plane, ((0, 0), (1, 1), (0, 0)), mode="edge")
    centre = 3 * plane
    upper, lower = centre + padded[:, :-2], centre + padded[:, 2:]  # rows 2i and 2i+1
    cols = jnp.stack([upper, lower], axis=2).reshape(plane.shape[0], -1, plane.shape[2])
    padded = jnp.pad(cols, ((0, 0), (0, 0), (1, 1)), mode="edge")
    centre = 3 * cols
    left = (centre + padded[:, :, :-2] + 8) >> 4
    right = (centre + padded[:, :, 2:] + 7) >> 4
    return jnp.stack([left, right], axis=3).reshape(cols.shape[0], cols.shape[1], -1)


# libjpeg's "islow" DCT (jfdctint.c, jidctint.c, after Loeffler, Ligtenberg and Moschytz):
# 13-bit fixed-point constants, 2 extra bits kept between the row and column passes.
_CONST_BITS = 13
_PASS1_BITS = 2


def _c(value: float) -> int:
    return int(value * (1 << _CONST_BITS) + 0.5)


def _descale(value: jax.Array, bits: int) -> jax.Array:
    return (value + (1 << (bits - 1))) >> bits


def _odd_rotations(a, b, c, d):
    """The shared odd-part butterfly of the islow forward and inverse DCT."""
    z1, z2, z3, z4 = a + d, b + c, a + c, b + d
    z5 = (z3 + z4) * _c(1.175875602)
    z1, z2 = z1 * -_c(0.899976223), z2 * -_c(2.562915447)
    z3, z4 = z3 * -_c(1.961570560) + z5, z4 * -_c(0.390180644) + z5
    return (a * _c(0.298631336) + z1 + z3, b * _c(2.053119869) + z2 + z4,
            c * _c(3.072711026) + z2 + z3, d * _c(1.501321110) + z1 + z4)


def _islow_fdct_1d(v: jax.Array, first_pass: bool) -> jax.Array:
    """One pass of libjpeg's integer forward DCT along the first axis (length 8)."""
    d = list(v)
    tmp0, tmp7, tmp1, tmp6 = d[0] + d[7], d[0] - d[7], d[1] + d[6], d[1] - d[6]
    tmp2, tmp5, tmp3, tmp4 = d[2] + d[5], d[2] - d[5], d[3] + d[4], d[3] - d[4]
    tmp10, tmp13, tmp11, tmp12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    bits = _CONST_BITS - _PASS1_BITS if first_pass else _CONST_BITS + _PASS1_BITS
    if first_pass:
        out0, out4 = (tmp10 + tmp11) << _PASS1_BITS, (tmp10 - tmp11) << _PASS1_BITS
    else:
        out0, out4 = _descale(tmp10 + tmp11, _PASS1_BITS), _descale(tmp10 - tmp11, _PASS1_BITS)
    z1 = (tmp12 + tmp13) * _c(0.541196100)
    out2 = _descale(z1 + tmp13 * _c(0.765366865), bits)
    out6 = _descale(z1 - tmp12 * _c(1.847759065), bits)
    out7, out5, out3, out1 = (_descale(t, bits) for t in _odd_rotations(tmp4, tmp5, tmp6, tmp7))
    return jnp.stack([out0, out1, out2, out3, out4, out5, out6, out7])


def _islow_idct_1d(v: jax.Array, first_pass: bool) -> jax.Array:
    """One pass of libjpeg's integer inverse DCT along the first axis (length 8)."""
    d = list(v)
    z1 = (d[2] + d[6]) * _c(0.541196100)
    tmp2, tmp3 = z1 - d[6] * _c(1.847759065), z1 + d[2] * _c(0.765366865)
    tmp0, tmp1 = (d[0] + d[4]) << _CONST_BITS, (d[0] - d[4]) << _CONST_BITS
    tmp10, tmp13, tmp11, tmp12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    odd0, odd1, odd2, odd3 = _odd_rotations(d[7], d[5], d[3], d[1])
    bits = _CONST_BITS - _PASS1_BITS if first_pass else _CONST_BITS + _PASS1_BITS + 3
    out = [tmp10 + odd3, tmp11 + odd2, tmp12 + odd1, tmp13 + odd0,
           tmp13 - odd0, tmp12 - odd1, tmp11 - odd2, tmp10 - odd3]
    return jnp.stack([_descale(t, bits) for t in out])


def _islow_fdct(blocks: jax.Array) -> jax.Array:
    """libjpeg's forward DCT of blocks (8 rows, 8 columns, ...): rows, then columns."""
    rows = jnp.swapaxes(_islow_fdct_1d(jnp.swapaxes(blocks, 0, 1), first_pass=True), 0, 1)
    return _islow_fdct_1d(rows, first_pass=False)


def _islow_idct(coefficients: jax.Array) -> jax.Array:
    """libjpeg's inverse DCT of blocks (8 rows, 8 columns, ...): columns, then rows."""
    columns = _islow_idct_1d(coefficients, first_pass=True)
    return jnp.swapaxes(_islow_idct_1d(jnp.swapaxes(columns, 0, 1), first_pass=False), 0, 1)


def _code_blocks(plane: jax.Array, table: jax.Array) -> jax.Array:
    """Codes an int32 plane (B, 8m, 8n) block by block as libjpeg does: level shift,
    islow DCT (scaled by 8), quantisation with ``table`` rounding half away from zero,
    dequantisation, islow inverse DCT, clamping to 8 bits."""
    b, h, w = plane.shape
    # Blocks as (8 rows, 8 columns, B, m, n): each DCT input is then one contiguous slab.
    blocks = plane.reshape(b, h // 8, 8, w // 8, 8).transpose(2, 4, 0, 1, 3) - 128
    coefficients = _islow_fdct(blocks)  # 8 x the orthonormal DCT
    # libjpeg's rounded integer division n // d with n = |c| + d // 2, computed as
    # floor((n + 0.5) * (1 / d)) in float32 (much faster than integer division on CPU):
    # (n + 0.5) / d lies at least 0.5 / d from any integer, a relative margin >= 0.5 / n
    # > 3e-5 for n < 2**14, far above float32 rounding, so the floor is exact.
    table = table[:, :, None, None, None]
    divisor = 8 * table
    numerator = (jnp.abs(coefficients) + divisor // 2).astype(jnp.float32) + 0.5
    magnitude = jnp.floor(numerator * (1.0 / divisor.astype(jnp.float32)))
    levels = jnp.sign(coefficients) * magnitude.astype(jnp.int32)
    decoded = _islow_idct(levels * table)
    samples = jnp.clip(decoded + 128, 0, 255)
    return samples.transpose(2, 3, 0, 4, 1).reshape(b, h, w)


def _code_luminance(y: jax.Array, table: jax.Array) -> jax.Array:
    _, height, width = y.shape
    padded = _pad_to(y, 8 * _ceil_div(height, 8), 8 * _ceil_div(width, 8))
    return _code_blocks(padded, table)[:, :height, :width]


def _code_chrominance(plane: jax.Array, table: jax.Array) -> jax.Array:
    _, height, width = plane.shape
    coded = _code_blocks(_subsample(plane), table)[:, : _ceil_div(height, 2), : _ceil_div(width, 2)]
    return _upsample(coded)[:, :height, :width]


def round_trip(x: Float[Array, "b h w c"], quality: int | jax.Array) -> Float[Array, "b h w c"]:
    """The unchecked, traceable round trip behind :func:`jpeg_round_trip`."""
    luminance, chrominance = quantization_tables(quality)
    samples = jnp.round(x * 255.0).astype(jnp.int32)
    if x.shape[-1] == 1:
        out = _code_luminance(samples[..., 0], luminance)[..., None]
    else:
        y, cb, cr = _rgb_to_ycbcr(samples)
        out = _ycbcr_to_rgb(_code_luminance(y, luminance), _code_chrominance(cb, chrominance),
                            _code_chrominance(cr, chrominance))
    return (out.astype(jnp.float32) / 255.0).astype(x.dtype)


_round_trip_jit = jax.jit(lambda x, quality: auto_axes_over_batch(round_trip, x)(x, quality))


def jpeg_round_trip(x: Float[Array, "b h w c"], quality: int | jax.Array) -> Float[Array, "b h w c"]:
    """Baseline JPEG encode + decode at libjpeg ``quality`` (1-100), 4:2:0 chroma.

    Gives, bit for bit, what Pillow's ``save(..., "JPEG", quality=quality)`` followed by
    ``Image.open`` gives (libjpeg-turbo's defaults: islow DCT, fancy upsampling). Inputs
    are rounded to 8 bits first; outputs are multiples of 1/255. ``quality`` is a traced
    argument: one compiled program per image shape serves every quality, and it can be
    vmapped or used inside ``jax.jit``.

    Args:
      x: float32 images (B, H, W, C) in [0, 1], C = 1 (luminance only) or 3 (RGB).
      quality: integer JPEG quality, 1 (worst) to 100.
    """
    x = as_images(x)
    if x.shape[-1] not in (1, 3):
        raise ValueError(f"x must have 1 or 3 channels, got shape {tuple(x.shape)}")
    if isinstance(quality, bool) or not jnp.issubdtype(jnp.result_type(quality), jnp.integer):
        raise TypeError(f"quality must be an integer, got {quality!r}")
    if not isinstance(quality, jax.core.Tracer) and not 1 <= int(quality) <= 100:
        raise ValueError(f"quality must be from 1 to 100, got {quality!r}")
    return _round_trip_jit(x, jnp.asarray(quality, jnp.int32))
