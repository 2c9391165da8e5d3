"""Model-behaviour metrics of "A Comprehensive Evaluation Framework for Deep Model
Robustness" (Guo, Liu et al., arXiv 2101.09617) and the defence-utility metrics of DEEPSEC
(Ling et al., "DEEPSEC: A Uniform Platform for Security Analysis of Deep Learning Model",
S&P 2019), as pure functions of cached logits.

Notation: p(x) = softmax f(x), yhat(x) = argmax p(x), x' an adversarial example, y the true
label, t an attack target. The success set S holds the examples with yhat(x') != y
(untargeted) or yhat(x') = t (targeted); see :func:`attack_success`.

Every dataset-level metric is a ratio of two sums, so each has a streaming accumulator
(a :class:`~robustjax.metrics.accumulator.Ratio`, see :mod:`robustjax.metrics.accumulator`
for the protocol) whose result equals the one-shot function's. Its ``compute()`` names the
metric in lower case (``"asr"``, ``"acac"``, ...; ``"accuracy"`` for CA, AAW and AAB,
``"transform_survival"`` for RGB and RIC); ``robustjax.metrics.DIRECTIONS`` says whether
a higher or a lower value means the evaluated model (or defence) is more robust.

Where DIG-Beihang/AISafety computes something else, the docstring says so; the toolkit's
bugs (error rate called accuracy, target-class ACTC, defence logits from the wrong model)
are not reproduced.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from robustjax import checks
from robustjax.metrics.accumulator import Ratio, batch_count, setting
from robustjax.ops.blur import gaussian_filter
from robustjax.ops.jpeg import jpeg_round_trip

# Gaussian blur standard deviation (pixels) and JPEG quality of RGB / RIC. AISafety blurs
# with PIL radius 2 and compresses at quality 55; DEEPSEC uses radius 0.5 and Guetzli 90.
RGB_SIGMA = 2.0
RIC_QUALITY = 55


# ----------------------------------------------------------------------------- validation


def _check_logits(logits, name: str, batch_size: int | None = None, num_classes: int | None = None) -> None:
    if not hasattr(logits, "shape") or not hasattr(logits, "dtype"):
        raise TypeError(f"{name} must be an array of logits (B, K), got {type(logits).__name__}")
    if logits.ndim != 2 or logits.shape[0] == 0 or logits.shape[1] < 2:
        raise ValueError(f"{name} must be logits of shape (B, K) with B >= 1 and K >= 2, got {tuple(logits.shape)}")
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"{name} must be floating point, got dtype {logits.dtype}")
    if batch_size is not None and logits.shape[0] != batch_size:
        raise ValueError(f"{name} has {logits.shape[0]} examples, expected {batch_size}")
    if num_classes is not None and logits.shape[1] != num_classes:
        raise ValueError(f"{name} has {logits.shape[1]} classes, expected {num_classes}")
    values = checks.concrete_values(logits)
    if values is not None and not np.isfinite(values).all():
        raise ValueError(f"{name} contains NaN or infinite values")


def check_logits_and_labels(labels, target=None, **logits) -> None:
    """All logits (keyword: name -> array) share one (B, K) shape; labels and the optional
    target are class indices of shape (B,); a target never equals the true label."""
    (first_name, first), *rest = logits.items()
    _check_logits(first, first_name)
    batch_size, num_classes = first.shape
    for name, value in rest:
        _check_logits(value, name, batch_size, num_classes)
    checks.check_labels(labels, num_classes=num_classes, batch_size=batch_size, name="labels")
    if target is not None:
        checks.check_labels(target, num_classes=num_classes, batch_size=batch_size, name="target")
        labels_np, target_np = checks.concrete_values(labels), checks.concrete_values(target)
        if labels_np is not None and target_np is not None and (same := np.flatnonzero(labels_np == target_np)).size:
            raise ValueError(f"target equals the true label for {same.size} example(s), first at index {same[0]}")


# ----------------------------------------------------------------------------- per example


def attack_success(
    logits_adv: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None = None
) -> Bool[Array, " b"]:
    """Membership of the success set S: ``yhat(x') != y``, or ``yhat(x') = t`` when targeted."""
    predictions = jnp.argmax(logits_adv, axis=-1)
    return predictions != labels if target is None else predictions == target


def _confidence(logits: jax.Array) -> jax.Array:
    """Softmax probabilities, in float32."""
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def _probability_of(logits: jax.Array, classes: jax.Array) -> jax.Array:
    return jnp.take_along_axis(_confidence(logits), classes[:, None], axis=-1)[:, 0]


def _correct(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1) == labels


def jensen_shannon_divergence(p: Float[Array, "b k"], q: Float[Array, "b k"]) -> Float[Array, " b"]:
    """JSD(p, q) = KL(p || m) / 2 + KL(q || m) / 2 with m = (p + q) / 2, in nats (the
    divergence itself, not scipy's ``jensenshannon`` distance, its square root)."""
    m = (p + q) / 2
    kl = lambda a: jnp.sum(jax.scipy.special.rel_entr(a, m), axis=-1)
    return (kl(p) + kl(q)) / 2


# ----------------------------------------------------------------------------- sums
# Each returns (total, count) of one batch: int32 totals for counted events, float32 sums
# of per-example values otherwise, int32 counts.


def _counted_terms(events: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.sum(events, dtype=jnp.int32), batch_count(events)


def _masked_terms(values: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.sum(jnp.where(mask, values, 0), dtype=values.dtype), jnp.sum(mask, dtype=jnp.int32)


@jax.jit
def _accuracy_terms(logits, labels):
    return _counted_terms(_correct(logits, labels))


@jax.jit
def _asr_terms(logits_adv, labels, target):
    return _counted_terms(attack_success(logits_adv, labels, target))


@jax.jit
def _acac_terms(logits_adv, labels, target):
    return _masked_terms(jnp.max(_confidence(logits_adv), axis=-1), attack_success(logits_adv, labels, target))


@jax.jit
def _actc_terms(logits_adv, labels, target):
    return _masked_terms(_probability_of(logits_adv, labels), attack_success(logits_adv, labels, target))


@jax.jit
def _nte_terms(logits_adv, labels, target):
    top2, _ = jax.lax.top_k(_confidence(logits_adv), 2)
    return _masked_terms(top2[:, 0] - top2[:, 1], attack_success(logits_adv, labels, target))


@functools.partial(jax.jit, static_argnames="toolkit_compat")
def _survival_terms(logits_adv, logits_transformed, labels, target, toolkit_compat):
    survives = attack_success(logits_transformed, labels, target)
    if toolkit_compat:
        return _counted_terms(survives)
    return _masked_terms(survives.astype(jnp.int32), attack_success(logits_adv, labels, target))


@jax.jit
def _cav_terms(logits_defended, logits_original, labels):
    gained = _correct(logits_defended, labels).astype(jnp.int32) - _correct(logits_original, labels).astype(jnp.int32)
    return jnp.sum(gained), batch_count(gained)


@jax.jit
def _crr_terms(logits_defended, logits_original, labels):
    return _counted_terms(_correct(logits_defended, labels) & ~_correct(logits_original, labels))


@jax.jit
def _csr_terms(logits_defended, logits_original, labels):
    return _counted_terms(~_correct(logits_defended, labels) & _correct(logits_original, labels))


def _comparison_set(logits_defended, logits_original, labels, toolkit_compat):
    """Both models right (DEEPSEC), or both wrong (AISafety's ``toolkit_compat``)."""
    defended, original = _correct(logits_defended, labels), _correct(logits_original, labels)
    return ~(defended | original) if toolkit_compat else defended & original


@functools.partial(jax.jit, static_argnames="toolkit_compat")
def _ccv_terms(logits_defended, logits_original, labels, toolkit_compat):
    gap = jnp.abs(_probability_of(logits_defended, labels) - _probability_of(logits_original, labels))
    return _masked_terms(gap, _comparison_set(logits_defended, logits_original, labels, toolkit_compat))


@functools.partial(jax.jit, static_argnames="toolkit_compat")
def _cos_terms(logits_defended, logits_original, labels, toolkit_compat):
    divergence = jensen_shannon_divergence(_confidence(logits_defended), _confidence(logits_original))
    return _masked_terms(divergence, _comparison_set(logits_defended, logits_original, labels, toolkit_compat))


# ----------------------------------------------------------------------------- accumulators
# Ratio accumulators (robustjax.metrics.accumulator): ``count`` is N, or |S| for the metrics
# over the success set, or the size of the comparison set for CCV and COS.

_NO_SUCCESS = "no successful adversarial examples (the success set S is empty)"
_NO_SHARED = "no example is classified the same way (both right, or both wrong) by the two models"


@struct.dataclass
class Accuracy(Ratio):
    """Streaming top-1 accuracy: CA on clean logits, AAW on white-box adversarial logits,
    AAB on the target model's logits of examples crafted on a surrogate."""

    metric = "accuracy"
    total_dtype = jnp.int32

    def update(self, logits: Float[Array, "b k"], labels: Int[Array, " b"]) -> Accuracy:
        check_logits_and_labels(labels, logits=logits)
        return self.add(*_accuracy_terms(logits, labels))


@struct.dataclass
class AttackSuccessRate(Ratio):
    """Streaming ASR, see :func:`attack_success_rate`."""

    metric = "asr"
    total_dtype = jnp.int32

    def update(self, logits_adv, labels, target=None) -> AttackSuccessRate:
        check_logits_and_labels(labels, target, logits_adv=logits_adv)
        return self.add(*_asr_terms(logits_adv, labels, target))


@struct.dataclass
class AdversarialClassConfidence(Ratio):
    """Streaming ACAC, see :func:`average_confidence_adversarial_class`."""

    metric = "acac"
    empty_reason = _NO_SUCCESS

    def update(self, logits_adv, labels, target=None) -> AdversarialClassConfidence:
        check_logits_and_labels(labels, target, logits_adv=logits_adv)
        return self.add(*_acac_terms(logits_adv, labels, target))


@struct.dataclass
class TrueClassConfidence(Ratio):
    """Streaming ACTC, see :func:`average_confidence_true_class`."""

    metric = "actc"
    empty_reason = _NO_SUCCESS

    def update(self, logits_adv, labels, target=None) -> TrueClassConfidence:
        check_logits_and_labels(labels, target, logits_adv=logits_adv)
        return self.add(*_actc_terms(logits_adv, labels, target))


@struct.dataclass
class NoiseToleranceEstimation(Ratio):
    """Streaming NTE, see :func:`noise_tolerance_estimation`."""

    metric = "nte"
    empty_reason = _NO_SUCCESS

    def update(self, logits_adv, labels, target=None) -> NoiseToleranceEstimation:
        check_logits_and_labels(labels, target, logits_adv=logits_adv)
        return self.add(*_nte_terms(logits_adv, labels, target))


@struct.dataclass
class TransformSurvival(Ratio):
    """Streaming RGB or RIC: ``update`` takes the logits of blurred (:func:`blur_for_rgb`) or
    JPEG-compressed (:func:`compress_for_ric`) adversarial examples, see
    :func:`robustness_to_gaussian_blur`. ``toolkit_compat`` is AISafety's form."""

    toolkit_compat: bool = setting()

    metric = "transform_survival"
    total_dtype = jnp.int32
    empty_reason = _NO_SUCCESS

    @classmethod
    def empty(cls, *, toolkit_compat: bool = False) -> TransformSurvival:
        checks.check_bool(toolkit_compat, "toolkit_compat")
        return super().empty(toolkit_compat=toolkit_compat)

    def update(self, logits_adv, logits_transformed, labels, target=None) -> TransformSurvival:
        check_logits_and_labels(labels, target, logits_adv=logits_adv, logits_transformed=logits_transformed)
        return self.add(*_survival_terms(logits_adv, logits_transformed, labels, target, self.toolkit_compat))


@struct.dataclass
class AccuracyVariation(Ratio):
    """Streaming CAV, see :func:`classification_accuracy_variance`."""

    metric = "cav"
    total_dtype = jnp.int32

    def update(self, logits_defended, logits_original, labels) -> AccuracyVariation:
        check_logits_and_labels(labels, logits_defended=logits_defended, logits_original=logits_original)
        return self.add(*_cav_terms(logits_defended, logits_original, labels))


@struct.dataclass
class RectifyRatio(Ratio):
    """Streaming CRR, see :func:`classification_rectify_ratio`."""

    metric = "crr"
    total_dtype = jnp.int32

    def update(self, logits_defended, logits_original, labels) -> RectifyRatio:
        check_logits_and_labels(labels, logits_defended=logits_defended, logits_original=logits_original)
        return self.add(*_crr_terms(logits_defended, logits_original, labels))


@struct.dataclass
class SacrificeRatio(Ratio):
    """Streaming CSR, see :func:`classification_sacrifice_ratio`."""

    metric = "csr"
    total_dtype = jnp.int32

    def update(self, logits_defended, logits_original, labels) -> SacrificeRatio:
        check_logits_and_labels(labels, logits_defended=logits_defended, logits_original=logits_original)
        return self.add(*_csr_terms(logits_defended, logits_original, labels))


@struct.dataclass
class ConfidenceVariance(Ratio):
    """Streaming CCV, see :func:`classification_confidence_variance`."""

    toolkit_compat: bool = setting()

    metric = "ccv"
    empty_reason = _NO_SHARED

    @classmethod
    def empty(cls, *, toolkit_compat: bool = False) -> ConfidenceVariance:
        checks.check_bool(toolkit_compat, "toolkit_compat")
        return super().empty(toolkit_compat=toolkit_compat)

    def update(self, logits_defended, logits_original, labels) -> ConfidenceVariance:
        check_logits_and_labels(labels, logits_defended=logits_defended, logits_original=logits_original)
        return self.add(*_ccv_terms(logits_defended, logits_original, labels, self.toolkit_compat))


@struct.dataclass
class OutputStability(Ratio):
    """Streaming COS, see :func:`classification_output_stability`."""

    toolkit_compat: bool = setting()

    metric = "cos"
    empty_reason = _NO_SHARED

    @classmethod
    def empty(cls, *, toolkit_compat: bool = False) -> OutputStability:
        checks.check_bool(toolkit_compat, "toolkit_compat")
        return super().empty(toolkit_compat=toolkit_compat)

    def update(self, logits_defended, logits_original, labels) -> OutputStability:
        check_logits_and_labels(labels, logits_defended=logits_defended, logits_original=logits_original)
        return self.add(*_cos_terms(logits_defended, logits_original, labels, self.toolkit_compat))


# ----------------------------------------------------------------------------- one shot


def accuracy(logits: Float[Array, "b k"], labels: Int[Array, " b"]) -> Float[Array, ""]:
    """Top-1 accuracy (1/N) sum_i 1[yhat(x_i) = y_i]; higher is more robust.

    CA (clean accuracy) on clean logits; AAW on logits of white-box adversarial examples;
    AAB on the evaluated model's logits of examples crafted on another (surrogate) model.
    AISafety's ``ACC`` class returns the error rate 1 - accuracy under the name accuracy.
    """
    return Accuracy.empty().update(logits, labels).ratio()


def attack_success_rate(
    logits_adv: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None = None
) -> Float[Array, ""]:
    """ASR = |S| / N, the share of adversarial examples in the success set; lower is more robust."""
    return AttackSuccessRate.empty().update(logits_adv, labels, target).ratio()


def average_confidence_adversarial_class(
    logits_adv: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None = None
) -> Float[Array, ""]:
    """ACAC = (1/|S|) sum_{i in S} max_j p_j(x'_i), the confidence of successful adversarial
    examples in their (wrong or target) class; lower is more robust."""
    return AdversarialClassConfidence.empty().update(logits_adv, labels, target).ratio()


def average_confidence_true_class(
    logits_adv: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None = None
) -> Float[Array, ""]:
    """ACTC = (1/|S|) sum_{i in S} p_{y_i}(x'_i), always of the TRUE class y (as DEEPSEC;
    AISafety uses the target class in targeted mode); higher is more robust."""
    return TrueClassConfidence.empty().update(logits_adv, labels, target).ratio()


def noise_tolerance_estimation(
    logits_adv: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None = None
) -> Float[Array, ""]:
    """NTE = (1/|S|) sum_{i in S} (p_(1)(x'_i) - p_(2)(x'_i)), the gap between the two
    largest probabilities of successful adversarial examples: how much noise they tolerate
    before the prediction changes. Lower is more robust."""
    return NoiseToleranceEstimation.empty().update(logits_adv, labels, target).ratio()


def robustness_to_gaussian_blur(
    logits_adv: Float[Array, "b k"],
    logits_blurred: Float[Array, "b k"],
    labels: Int[Array, " b"],
    target: Int[Array, " b"] | None = None,
    *,
    toolkit_compat: bool = False,
) -> Float[Array, ""]:
    """RGB = |{i in S : GB(x'_i) is still successful}| / |S| (DEEPSEC), the share of
    successful adversarial examples that survive a Gaussian blur (:func:`blur_for_rgb`).
    Lower is more robust (the model's adversarial examples are fragile).

    ``toolkit_compat=True``: AISafety's (1/N) |{i : GB(x'_i) successful}|, over all N
    examples, successful before blurring or not.
    """
    return TransformSurvival.empty(toolkit_compat=toolkit_compat).update(logits_adv, logits_blurred, labels, target).ratio()


def robustness_to_image_compression(
    logits_adv: Float[Array, "b k"],
    logits_compressed: Float[Array, "b k"],
    labels: Int[Array, " b"],
    target: Int[Array, " b"] | None = None,
    *,
    toolkit_compat: bool = False,
) -> Float[Array, ""]:
    """RIC: :func:`robustness_to_gaussian_blur` with a JPEG round trip
    (:func:`compress_for_ric`) in place of the blur. Lower is more robust."""
    return TransformSurvival.empty(toolkit_compat=toolkit_compat).update(logits_adv, logits_compressed, labels, target).ratio()


def classification_accuracy_variance(
    logits_defended: Float[Array, "b k"], logits_original: Float[Array, "b k"], labels: Int[Array, " b"]
) -> Float[Array, ""]:
    """CAV = Acc(defended) - Acc(original) on the same examples (DEEPSEC: the clean test
    set), signed; higher is better. AISafety reports the absolute value, on adversarial
    examples: ``jnp.abs`` of this on adversarial logits."""
    return AccuracyVariation.empty().update(logits_defended, logits_original, labels).ratio()


def classification_rectify_ratio(
    logits_defended: Float[Array, "b k"], logits_original: Float[Array, "b k"], labels: Int[Array, " b"]
) -> Float[Array, ""]:
    """CRR = (1/N) |{i : original wrong and defended right}|; higher is better.
    CRR - CSR = CAV on the same examples."""
    return RectifyRatio.empty().update(logits_defended, logits_original, labels).ratio()


def classification_sacrifice_ratio(
    logits_defended: Float[Array, "b k"], logits_original: Float[Array, "b k"], labels: Int[Array, " b"]
) -> Float[Array, ""]:
    """CSR = (1/N) |{i : original right and defended wrong}|; lower is better."""
    return SacrificeRatio.empty().update(logits_defended, logits_original, labels).ratio()


def classification_confidence_variance(
    logits_defended: Float[Array, "b k"],
    logits_original: Float[Array, "b k"],
    labels: Int[Array, " b"],
    *,
    toolkit_compat: bool = False,
) -> Float[Array, ""]:
    """CCV = (1/n) sum_{i in B} |p^D_{y_i}(x_i) - p_{y_i}(x_i)| over the n examples B that
    both models classify correctly (DEEPSEC); lower is better.

    ``toolkit_compat=True``: AISafety's set B of examples both models get wrong.
    """
    return ConfidenceVariance.empty(toolkit_compat=toolkit_compat).update(logits_defended, logits_original, labels).ratio()


def classification_output_stability(
    logits_defended: Float[Array, "b k"],
    logits_original: Float[Array, "b k"],
    labels: Int[Array, " b"],
    *,
    toolkit_compat: bool = False,
) -> Float[Array, ""]:
    """COS = (1/n) sum_{i in B} JSD(p^D(x_i), p(x_i)) over the examples B that both models
    classify correctly (DEEPSEC), Jensen-Shannon divergence in nats; lower is better.

    ``toolkit_compat=True``: AISafety's set B of examples both models get wrong.
    """
    return OutputStability.empty(toolkit_compat=toolkit_compat).update(logits_defended, logits_original, labels).ratio()


# ----------------------------------------------------------------------------- inputs for RGB, RIC


def blur_for_rgb(x: Float[Array, "b h w c"], sigma: float = RGB_SIGMA) -> Float[Array, "b h w c"]:
    """The images RGB classifies: 8-bit images blurred by a Gaussian of standard deviation
    ``sigma`` pixels (truncated at 4 sigma, edge pixels repeated), stored back as 8 bits.

    AISafety uses ``PIL.ImageFilter.GaussianBlur(radius=2)``, whose radius is this standard
    deviation but which approximates the Gaussian by three box blurs.
    """
    x = checks.as_images(x)
    checks.check_positive_float(sigma, "sigma")
    return _blur_8bit(x, float(sigma))


@functools.partial(jax.jit, static_argnums=1)
def _blur_8bit(x, sigma):
    return jnp.round(gaussian_filter(jnp.round(x * 255) / 255, sigma) * 255) / 255


def compress_for_ric(x: Float[Array, "b h w c"], quality: int = RIC_QUALITY) -> Float[Array, "b h w c"]:
    """The images RIC classifies: a baseline JPEG round trip at ``quality``
    (:func:`robustjax.ops.jpeg.jpeg_round_trip`, bit-exact with Pillow/libjpeg)."""
    return jpeg_round_trip(x, quality)
