"""Imperceptibility of adversarial examples (data-oriented metrics of "A Comprehensive
Evaluation Framework for Deep Model Robustness", arXiv 2101.09617, after DEEPSEC, Ling et
al., S&P 2019): ALD_p, ASS and PSD, each averaged over the success set S of the attack
(the examples whose attack succeeded, from :func:`robustjax.metrics.behaviour.attack_success`).

Per-example values are pure functions of (x, x'); the averages over S stream with
:class:`~robustjax.metrics.accumulator.Ratio` accumulators, whose ``compute()`` gives
``"ald_0"``, ``"ald_2"``, ``"ald_inf"``, ``"ass"`` and ``"psd"``. ``robustjax.metrics.DIRECTIONS``
reads each metric from the model's side: a robust model forces larger, more visible
perturbations, so higher ALD and PSD and lower ASS mean more robust (from the attack's
side, the reverse is "better").

``toolkit_compat=True`` reproduces what DIG-Beihang/AISafety computes where it departs from
the definitions on purpose or by its settings (see each function).

Terms outside S never enter the averages: they are dropped (not multiplied by 0, so an
undefined term there, such as ALD of an all-zero image whose attack failed, cannot leak
in), and the sums are plain float32 additions, not matrix products that an accelerator may
run in reduced precision (TF32).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax
from jaxtyping import Array, ArrayLike, Bool, Float

from robustjax import checks
from robustjax.metrics.accumulator import Ratio, divide, setting

# SSIM of Wang et al. (IEEE TIP 2004): 11 x 11 Gaussian window, sigma 1.5, K1, K2.
SSIM_SIGMA = 1.5
SSIM_RADIUS = 5
SSIM_K1 = 0.01
SSIM_K2 = 0.03
# AISafety: skimage 0.17 defaults, a 7 x 7 uniform window and sample covariance, on 0..255
# values with data_range 2 (the float dtype range skimage assumed).
TOOLKIT_SSIM_WINDOW = 7
TOOLKIT_SSIM_DATA_RANGE = 2.0
# PSD: added to the local standard deviation so that flat regions (std 0) stay finite.
PSD_EPS = 1.0 / 255.0

_NO_SUCCESS = "no successful adversarial examples (the success set S is empty)"

L0Denominator = Literal["nonzero", "size"]
L0_DENOMINATORS: tuple[str, ...] = ("nonzero", "size")


# ----------------------------------------------------------------------------- validation


def _check_pair(x, x_adv, success=None, *, min_size: int = 1) -> tuple[jax.Array, jax.Array]:
    """Validates a pair of image batches; returns them as float32 (``checks.as_images``)."""
    x, x_adv = checks.as_images(x, name="x"), checks.as_images(x_adv, name="x_adv")
    if x.shape != x_adv.shape:
        raise ValueError(f"x and x_adv must have the same shape, got {tuple(x.shape)} and {tuple(x_adv.shape)}")
    if min(x.shape[1:3]) < min_size:
        raise ValueError(f"images must be at least {min_size} x {min_size} pixels, got {tuple(x.shape[1:3])}")
    if success is not None and (not hasattr(success, "shape") or success.shape != (x.shape[0],)
                                or success.dtype != bool):
        got = f"{getattr(success, 'dtype', type(success).__name__)} {tuple(getattr(success, 'shape', ()))}"
        raise ValueError(f"success must be a bool array of shape ({x.shape[0]},), got {got}")
    return x, x_adv


# ----------------------------------------------------------------------------- per example


class Distortion(NamedTuple):
    """Relative perturbation sizes ||x' - x||_p / ||x||_p for p = 0, 2, inf."""

    l0: jax.Array
    l2: jax.Array
    linf: jax.Array


def _flat(x: jax.Array | np.ndarray) -> jax.Array | np.ndarray:
    return x.reshape(x.shape[0], -1)


def _norms(v: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.linalg.norm(v, axis=-1), jnp.max(jnp.abs(v), axis=-1)


def resolve_l0_denominator(l0_denominator: L0Denominator | None, toolkit_compat: bool) -> str:
    """The checked ALD_0 denominator; None gives ``"size"`` under ``toolkit_compat`` (the
    toolkit's), else ``"nonzero"`` (the definition)."""
    checks.check_bool(toolkit_compat, "toolkit_compat")
    if l0_denominator is None:
        return "size" if toolkit_compat else "nonzero"
    checks.check_choice(l0_denominator, L0_DENOMINATORS, "l0_denominator")
    return l0_denominator


@functools.partial(jax.jit, static_argnames=("toolkit_compat", "l0_denominator"))
def _distortion(x, x_adv, toolkit_compat, l0_denominator):
    x, x_adv = _flat(x), _flat(x_adv)
    delta = x_adv - x
    l2, linf = _norms(delta)
    clean_l2, clean_linf = _norms(x)
    if toolkit_compat:
        changed, entries = delta != 0, x != 0
    else:
        pixels = jnp.round(255 * x)
        changed, entries = jnp.round(255 * x_adv) != pixels, pixels != 0
    l0_norm = entries.shape[-1] if l0_denominator == "size" else jnp.sum(entries, axis=-1)
    l0 = (jnp.sum(changed, axis=-1) / l0_norm).astype(jnp.float32)
    return Distortion(l0, l2 / clean_l2, linf if toolkit_compat else linf / clean_linf)


def _check_defined(x, success, toolkit_compat: bool, l0_denominator: str) -> None:
    """On the host: every x_i in S (all of x when ``success`` is None) has nonzero norms."""
    values, mask = checks.concrete_values(x), None if success is None else checks.concrete_values(success)
    if values is None or (success is not None and mask is None):
        return
    at_8_bits = not toolkit_compat and l0_denominator == "nonzero"  # ||x||_0 of the 8-bit image
    entries = np.round(255 * _flat(values)) if at_8_bits else _flat(values)
    blank = ~entries.any(axis=-1)
    if mask is not None:
        blank &= mask
    if (index := np.flatnonzero(blank)).size:
        raise ValueError(f"ALD is relative to ||x||_p, undefined for x[{index[0]}]"
                         + ("" if mask is None else " (in the success set)") + ": its entries are all 0"
                         + (" at 8 bits" if at_8_bits else ""))


def lp_distortion(
    x: Float[ArrayLike, "b h w c"],
    x_adv: Float[ArrayLike, "b h w c"],
    *,
    toolkit_compat: bool = False,
    l0_denominator: L0Denominator | None = None,
) -> Distortion:
    """Per-example ||x' - x||_p / ||x||_p for p in {0, 2, inf} (DEEPSEC's ALD_p terms).

    L0 counts the entries (over H, W and C) that differ once both images are stored as
    8-bit values (DEEPSEC rounds the same way) and divides them by ``l0_denominator``:

    - ``"nonzero"`` (the default): ||x||_0, the nonzero 8-bit entries of x. This is the
      definition (DEEPSEC's paper, AISafety's docs), relative to x as the L2 and Linf terms are.
    - ``"size"``: H W C, what the DEEPSEC and AISafety code divide by; smaller by the share
      of nonzero entries (2-3x on the digits), and comparable with their published numbers.

    ``toolkit_compat=True`` (AISafety): L0 counts every nonzero float difference, over H W C
    by default (``"nonzero"``: over the nonzero float entries of x); L2 as above; Linf is not
    normalised (the [0, 1] scale).
    """
    x, x_adv = _check_pair(x, x_adv)
    l0_denominator = resolve_l0_denominator(l0_denominator, toolkit_compat)
    _check_defined(x, None, toolkit_compat, l0_denominator)
    return _distortion(x, x_adv, toolkit_compat, l0_denominator)


def _taps(radius: int, sigma: float | None) -> np.ndarray:
    """Normalised 1-D window of 2 radius + 1 taps: Gaussian, or uniform when sigma is None."""
    t = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.ones_like(t) if sigma is None else np.exp(-0.5 * (t / sigma) ** 2)
    return (taps / taps.sum()).astype(np.float32)


def _filter_valid(planes: jax.Array, taps: np.ndarray) -> jax.Array:
    """Separable correlation of (N, H, W) planes with ``taps`` x ``taps``, no padding."""
    out = planes[..., None]  # NHWC with one channel
    for kernel_shape in ((len(taps), 1, 1, 1), (1, len(taps), 1, 1)):
        out = lax.conv_general_dilated(
            out,
            jnp.asarray(taps).reshape(kernel_shape),
            window_strides=(1, 1),
            padding="VALID",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=lax.Precision.HIGHEST,
        )
    return out[..., 0]


@functools.partial(jax.jit, static_argnames=("window", "toolkit_compat"))
def _ssim(x, x_adv, window, toolkit_compat):
    if toolkit_compat:
        taps = _taps(TOOLKIT_SSIM_WINDOW // 2, None)
        x, x_adv = jnp.round(255 * x), jnp.round(255 * x_adv)
        data_range, covariance_norm = TOOLKIT_SSIM_DATA_RANGE, taps.size**2 / (taps.size**2 - 1)
    else:
        taps, data_range, covariance_norm = _taps(SSIM_RADIUS, SSIM_SIGMA), 1.0, 1.0
    b, h, w, c = x.shape
    planes = lambda v: jnp.moveaxis(v, -1, 1).reshape(b * c, h, w)
    a, d = planes(x), planes(x_adv)
    if (pad := len(taps) // 2 - window // 2) > 0:  # a window smaller than the filter: mirror the border
        a, d = (jnp.pad(v, ((0, 0), (pad, pad), (pad, pad)), mode="symmetric") for v in (a, d))
    # Second moments of planes centred on their global means: (co)variances do not change,
    # and float32 cancellation in E[a^2] - E[a]^2 shrinks (flat regions give exactly 0).
    a0, d0 = a - jnp.mean(a, axis=(1, 2), keepdims=True), d - jnp.mean(d, axis=(1, 2), keepdims=True)
    mean_a, mean_d, mean_a0, mean_d0, mean_aa, mean_dd, mean_ad = jnp.split(
        _filter_valid(jnp.concatenate([a, d, a0, d0, a0 * a0, d0 * d0, a0 * d0]), taps), 7
    )
    var_a = covariance_norm * (mean_aa - mean_a0**2)
    var_d = covariance_norm * (mean_dd - mean_d0**2)
    cov = covariance_norm * (mean_ad - mean_a0 * mean_d0)
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    ssim_map = ((2 * mean_a * mean_d + c1) * (2 * cov + c2)) / (
        (mean_a**2 + mean_d**2 + c1) * (var_a + var_d + c2)
    )
    return jnp.mean(ssim_map.reshape(b, -1), axis=-1)


def _check_window(window) -> None:
    checks.check_positive_int(window, "window")
    if window % 2 == 0 or window > 2 * SSIM_RADIUS + 1:
        raise ValueError(f"window must be odd and at most {2 * SSIM_RADIUS + 1}, got {window}")


def structural_similarity(
    x: Float[ArrayLike, "b h w c"],
    x_adv: Float[ArrayLike, "b h w c"],
    *,
    window: int = 2 * SSIM_RADIUS + 1,
    toolkit_compat: bool = False,
) -> Float[Array, " b"]:
    """Per-example SSIM (Wang, Bovik, Sheikh & Simoncelli, IEEE TIP 2004).

    SSIM = mean over channels and window positions of
    (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2)),
    with local statistics from an 11 x 11 Gaussian window (sigma 1.5), C1 = (0.01 L)^2,
    C2 = (0.03 L)^2, data range L = 1, over window positions inside the image. Equals
    ``skimage.metrics.structural_similarity(..., gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1, channel_axis=-1)``.

    For images smaller than 11 x 11, a smaller odd ``window`` averages over the positions
    at least (window - 1) / 2 pixels from the border, the local statistics still from the
    11-tap Gaussian with mirrored borders: skimage's ``win_size=window``.

    ``toolkit_compat=True`` (AISafety): 8-bit values 0..255, a 7 x 7 uniform window, sample
    covariance and data range 2, which makes C1 and C2 negligible (``window`` is ignored).
    """
    if toolkit_compat:
        window = TOOLKIT_SSIM_WINDOW
    _check_window(window)
    x, x_adv = _check_pair(x, x_adv, min_size=window)
    return _ssim(x, x_adv, int(window), toolkit_compat)


@functools.partial(jax.jit, static_argnames=("eps", "toolkit_compat"))
def _psd(x, x_adv, eps, toolkit_compat):
    _, h, w, _ = x.shape
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect")
    neighbourhood = jnp.stack([padded[:, i : i + h, j : j + w] for i in range(3) for j in range(3)])
    local_std = jnp.std(neighbourhood, axis=0)
    weight = local_std if toolkit_compat else 1 / (local_std + eps)
    return jnp.sum(_flat(jnp.abs(x_adv - x) * weight), axis=-1)


def perturbation_sensitivity_distance(
    x: Float[ArrayLike, "b h w c"],
    x_adv: Float[ArrayLike, "b h w c"],
    *,
    eps: float = PSD_EPS,
    toolkit_compat: bool = False,
) -> Float[Array, " b"]:
    """Per-example PSD term sum_j |x'_j - x_j| / (std(R(x_j)) + eps) over all H W C entries
    (DEEPSEC; the framework's definition Sen = 1 / std), R(x_j) the 3 x 3 neighbourhood of
    entry j in its channel (borders reflected, population std). A change in a flat region,
    where the eye sees it most, weighs most; ``eps`` keeps flat regions finite.

    ``toolkit_compat=True`` (AISafety's code): sum_j |x'_j - x_j| * std(R(x_j)), which weighs
    flat regions least; ``eps`` is then unused.
    """
    x, x_adv = _check_pair(x, x_adv, min_size=2)
    checks.check_positive_float(eps, "eps")
    return _psd(x, x_adv, float(eps), toolkit_compat)


# ----------------------------------------------------------------------------- over S


def _masked_sums(values: jax.Array, success: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sums over the success set of per-example values (B,) or (B, m), and its size."""
    mask = success.reshape(success.shape + (1,) * (values.ndim - 1))
    return jnp.sum(jnp.where(mask, values, 0.0), axis=0), jnp.sum(success, dtype=jnp.int32)


@struct.dataclass
class AverageLpDistortion(Ratio):
    """Streaming ALD_p: ``total`` (3,) holds the L0, L2, Linf sums over S (settings of
    :func:`lp_distortion`; ``l0_denominator`` is stored resolved)."""

    toolkit_compat: bool = setting()
    l0_denominator: str = setting()

    total_shape = (3,)
    empty_reason = _NO_SUCCESS

    @classmethod
    def empty(cls, *, toolkit_compat: bool = False, l0_denominator: L0Denominator | None = None) -> AverageLpDistortion:
        l0_denominator = resolve_l0_denominator(l0_denominator, toolkit_compat)
        return super().empty(toolkit_compat=toolkit_compat, l0_denominator=l0_denominator)

    def update(self, x, x_adv, success) -> AverageLpDistortion:
        """Adds a batch; only x_i in S must have nonzero norms."""
        x, x_adv = _check_pair(x, x_adv, success)
        _check_defined(x, success, self.toolkit_compat, self.l0_denominator)
        distortion = jnp.stack(_distortion(x, x_adv, self.toolkit_compat, self.l0_denominator), axis=-1)
        return self.add(*_masked_sums(distortion, success))

    def compute(self) -> dict[str, jax.Array]:
        """``{"ald_0", "ald_2", "ald_inf"}``."""
        l0, l2, linf = divide(self.total, self.count, "ALD", self.empty_reason)
        return {"ald_0": l0, "ald_2": l2, "ald_inf": linf}


@struct.dataclass
class AverageStructuralSimilarity(Ratio):
    """Streaming ASS, see :func:`average_structural_similarity`."""

    window: int = setting()
    toolkit_compat: bool = setting()

    metric = "ass"
    empty_reason = _NO_SUCCESS

    @classmethod
    def empty(cls, *, window: int = 2 * SSIM_RADIUS + 1, toolkit_compat: bool = False) -> AverageStructuralSimilarity:
        _check_window(window)
        checks.check_bool(toolkit_compat, "toolkit_compat")
        return super().empty(window=window, toolkit_compat=toolkit_compat)

    def update(self, x, x_adv, success) -> AverageStructuralSimilarity:
        x, x_adv = _check_pair(x, x_adv, success)
        ssim = structural_similarity(x, x_adv, window=self.window, toolkit_compat=self.toolkit_compat)
        return self.add(*_masked_sums(ssim, success))


@struct.dataclass
class PerturbationSensitivityDistance(Ratio):
    """Streaming PSD, see :func:`average_perturbation_sensitivity_distance`."""

    eps: float = setting()
    toolkit_compat: bool = setting()

    metric = "psd"
    empty_reason = _NO_SUCCESS

    @classmethod
    def empty(cls, *, eps: float = PSD_EPS, toolkit_compat: bool = False) -> PerturbationSensitivityDistance:
        checks.check_positive_float(eps, "eps")
        checks.check_bool(toolkit_compat, "toolkit_compat")
        return super().empty(eps=float(eps), toolkit_compat=toolkit_compat)

    def update(self, x, x_adv, success) -> PerturbationSensitivityDistance:
        x, x_adv = _check_pair(x, x_adv, success)
        values = perturbation_sensitivity_distance(x, x_adv, eps=self.eps, toolkit_compat=self.toolkit_compat)
        return self.add(*_masked_sums(values, success))


def average_lp_distortion(
    x: Float[ArrayLike, "b h w c"],
    x_adv: Float[ArrayLike, "b h w c"],
    success: Bool[ArrayLike, " b"],
    *,
    toolkit_compat: bool = False,
    l0_denominator: L0Denominator | None = None,
) -> Distortion:
    """ALD_p = (1/|S|) sum_{i in S} ||x'_i - x_i||_p / ||x_i||_p, p in {0, 2, inf}
    (see :func:`lp_distortion`); higher means the model forced larger perturbations."""
    ald = AverageLpDistortion.empty(toolkit_compat=toolkit_compat, l0_denominator=l0_denominator)
    ald = ald.update(x, x_adv, success).compute()
    return Distortion(ald["ald_0"], ald["ald_2"], ald["ald_inf"])


def average_structural_similarity(
    x: Float[ArrayLike, "b h w c"],
    x_adv: Float[ArrayLike, "b h w c"],
    success: Bool[ArrayLike, " b"],
    *,
    window: int = 2 * SSIM_RADIUS + 1,
    toolkit_compat: bool = False,
) -> Float[Array, ""]:
    """ASS = (1/|S|) sum_{i in S} SSIM(x'_i, x_i) (see :func:`structural_similarity`);
    lower means the model forced more visible perturbations."""
    return AverageStructuralSimilarity.empty(window=window, toolkit_compat=toolkit_compat).update(x, x_adv, success).ratio()


def average_perturbation_sensitivity_distance(
    x: Float[ArrayLike, "b h w c"],
    x_adv: Float[ArrayLike, "b h w c"],
    success: Bool[ArrayLike, " b"],
    *,
    eps: float = PSD_EPS,
    toolkit_compat: bool = False,
) -> Float[Array, ""]:
    """PSD = (1/|S|) sum_{i in S} sum_j |x'_ij - x_ij| / (std(R(x_ij)) + eps) (see
    :func:`perturbation_sensitivity_distance`); higher means more visible perturbations."""
    return PerturbationSensitivityDistance.empty(eps=eps, toolkit_compat=toolkit_compat).update(x, x_adv, success).ratio()
