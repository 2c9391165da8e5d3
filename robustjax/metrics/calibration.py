"""Calibration, selective prediction and out-of-distribution detection metrics, as RobustART
reports them for ImageNet-A and ImageNet-O (Hendrycks' ``calibration_tools``).

With confidence c_i (the top softmax probability) and correctness a_i of N predictions:

- RMS calibration error (Hendrycks et al., "Natural Adversarial Examples", CVPR 2021): sort by
  confidence, cut into bins of ``beta`` consecutive samples (the last bin takes the rest) and
  take ``sqrt(sum_b n_b / N * (mean_b c - mean_b a)^2)``;
- ECE (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017): M equal-width bins
  ``((m-1)/M, m/M]`` of confidence, ``sum_m n_m / N * |mean_m c - mean_m a|``;
- AURRA: the area under the response rate - accuracy curve, the mean over k = 1..N of the
  accuracy of the k most confident predictions;
- OOD detection with out-of-distribution as the positive class and an anomaly score (RobustART:
  minus the maximum softmax probability): AUROC, average precision (AUPR, as sklearn's
  ``average_precision_score``) and the false positive rate at 95% true positive rate.

Ties. Samples with equal confidence (or score) have no order; every metric here treats them as
a block, so the result does not depend on the order of the samples (and streaming, merging and
one-shot evaluation agree). For AURRA and the RMS bins each tied sample counts with its tie
block's mean correctness (for AURRA this is the expectation over random tie orders); AUROC,
AUPR and the FPR use one threshold per distinct score, as sklearn does. Without ties, AURRA
equals Hendrycks' ``aurra``, and the RMS error his ``calib_err`` only with ``skip_last_bin=True``
(by default the last bin counts, see below). The sorting metrics need every sample: :class:`CalibrationStats`
and :class:`OODStats` keep them in a buffer of a capacity fixed by ``empty`` (5 bytes per
sample: a float32 and a bool; 50,000 ImageNet images take 250 kB) and give exact results.

Deviations from ``calibration_tools`` (and RobustART's copy): its RMS loop skips the last,
most confident bin (``range(len(bins) - 1)``) while still dividing by all N; here every bin
counts, and ``skip_last_bin=True`` reproduces the original. It fails for N < beta; here all
samples then form one bin. Its FPR picks the threshold whose recall is *closest* to 95%, which
may be below it; here it is the lowest FPR at a threshold with TPR >= 95%.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from robustjax.checks import (
    check_bool,
    check_flags,
    check_in_interval,
    check_positive_int,
    concrete_values,
)
from robustjax.metrics.accumulator import check_mergeable, setting
from robustjax.sharding import with_auto_axes

# ---------------------------------------------------------------------------------------------
# Host-side validation


def _check_scores(scores, name: str, *, unit_interval: bool = False) -> None:
    """``scores`` must be a non-empty 1-D float array of finite values (in [0, 1] if asked)."""
    if not hasattr(scores, "shape") or not hasattr(scores, "dtype"):
        raise TypeError(f"{name} must be a float array, got {type(scores).__name__}")
    if not np.issubdtype(scores.dtype, np.floating):
        raise TypeError(f"{name} must be a float array, got dtype {scores.dtype}")
    if scores.ndim != 1 or scores.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(scores.shape)}")
    values = concrete_values(scores)
    if values is None:
        return
    if not np.isfinite(values).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    if unit_interval and (values.min() < 0 or values.max() > 1):
        raise ValueError(f"{name} must be in [0, 1], got range [{values.min():.4g}, {values.max():.4g}]")


def _check_pair(confidence, correct) -> None:
    _check_scores(confidence, "confidence", unit_interval=True)
    check_flags(correct, "correct", confidence.shape)


def _check_detection(scores, positive, tpr: float | None = None) -> None:
    _check_scores(scores, "scores")
    check_flags(positive, "positive", scores.shape)
    labels = concrete_values(positive)
    if labels is not None and (labels.all() or not labels.any()):
        raise ValueError("OOD detection needs both positive (OOD) and negative (in-distribution) samples")
    if tpr is not None:
        check_in_interval(tpr, "tpr", 0.0, 1.0, closed_high=True)


# ---------------------------------------------------------------------------------------------
# Traced cores. Each works on a buffer whose first ``n`` entries are samples; the rest is
# ignored, so one compiled program serves any number of samples up to the buffer's size.


def _sort_valid(keys: jax.Array, n: jax.Array, *others: jax.Array):
    """Sorts the first ``n`` entries by ``keys`` (ascending); the rest go last with key +inf."""
    valid = jnp.arange(keys.shape[0]) < n
    order = jnp.argsort(jnp.where(valid, keys, jnp.inf), stable=True)
    return (jnp.where(valid, keys, jnp.inf)[order], *(o[order] for o in others))


def _tie_blocks(sorted_keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For each entry of a sorted array, the [start, end) indices of its block of equal keys."""
    start = jnp.searchsorted(sorted_keys, sorted_keys, side="left", method="sort")
    end = jnp.searchsorted(sorted_keys, sorted_keys, side="right", method="sort")
    return start, end


def _cumulative(x: jax.Array) -> jax.Array:
    """Cumulative sums with a leading 0: ``c[i] = sum(x[:i])``."""
    return jnp.concatenate([jnp.zeros((1,), x.dtype), jnp.cumsum(x)])


def _tie_averaged(sorted_keys: jax.Array, values: jax.Array) -> jax.Array:
    """Each value replaced by the mean of the values of its tie block."""
    start, end = _tie_blocks(sorted_keys)
    sums = _cumulative(values)
    return (sums[end] - sums[start]) / (end - start)


@functools.partial(jax.jit, static_argnums=(3, 4))
@with_auto_axes
def _rms_core(confidence, correct, n, beta: int, skip_last_bin: bool):
    size = confidence.shape[0]
    conf, acc = _sort_valid(confidence, n, correct.astype(jnp.float32))
    valid = jnp.arange(size) < n
    acc = jnp.where(valid, _tie_averaged(conf, acc), 0.0)
    conf = jnp.where(valid, conf, 0.0)
    num_bins = jnp.maximum(n // beta, 1)
    dummy = size // beta + 1  # a segment for the unused entries
    bins = jnp.where(valid, jnp.minimum(jnp.arange(size) // beta, num_bins - 1), dummy)
    segments = functools.partial(jax.ops.segment_sum, segment_ids=bins, num_segments=dummy + 1)
    counts, conf_sums, acc_sums = segments(valid.astype(jnp.float32)), segments(conf), segments(acc)
    gap = (conf_sums - acc_sums) / jnp.maximum(counts, 1.0)
    kept = jnp.arange(dummy + 1) < (num_bins - 1 if skip_last_bin else num_bins)
    return jnp.sqrt(jnp.sum(jnp.where(kept, counts * gap**2, 0.0)) / n)


@functools.partial(jax.jit, static_argnums=3)
@with_auto_axes
def _ece_core(confidence, correct, n, num_bins: int):
    valid = jnp.arange(confidence.shape[0]) < n
    bins = jnp.clip(jnp.ceil(confidence * num_bins).astype(jnp.int32) - 1, 0, num_bins - 1)
    bins = jnp.where(valid, bins, num_bins)
    gap = jnp.where(valid, confidence - correct.astype(jnp.float32), 0.0)
    per_bin = jax.ops.segment_sum(gap, bins, num_segments=num_bins + 1)
    return jnp.sum(jnp.abs(per_bin)) / n


@functools.partial(jax.jit, static_argnums=2)
@with_auto_axes
def _reliability_core(confidence, correct, num_bins: int):
    bins = jnp.clip(jnp.ceil(confidence * num_bins).astype(jnp.int32) - 1, 0, num_bins - 1)
    sums = functools.partial(jax.ops.segment_sum, segment_ids=bins, num_segments=num_bins)
    return sums(jnp.ones_like(confidence)), sums(confidence), sums(correct.astype(jnp.float32))


@jax.jit
@with_auto_axes
def _aurra_core(confidence, correct, n):
    valid = jnp.arange(confidence.shape[0]) < n
    keys, acc = _sort_valid(-confidence, n, correct.astype(jnp.float32))
    acc = jnp.where(valid, _tie_averaged(keys, acc), 0.0)
    accuracy_at_k = jnp.cumsum(acc) / jnp.arange(1, acc.shape[0] + 1)
    return jnp.sum(jnp.where(valid, accuracy_at_k, 0.0)) / n


def _detection_counts(scores, positive, n):
    """Scores sorted descending; per entry, positives/negatives ranked above its tie block's
    end and its start; totals."""
    valid = jnp.arange(scores.shape[0]) < n
    keys, pos = _sort_valid(-scores, n, positive.astype(jnp.int32))
    pos = jnp.where(valid, pos, 0)
    neg = valid.astype(jnp.int32) - pos
    start, end = _tie_blocks(keys)
    cum_pos, cum_neg = _cumulative(pos), _cumulative(neg)
    return valid, pos, cum_pos, cum_neg, start, end, cum_pos[-1], cum_neg[-1]


@jax.jit
@with_auto_axes
def _auroc_core(scores, positive, n):
    _, pos, _, cum_neg, start, end, n_pos, n_neg = _detection_counts(scores, positive, n)
    below = n_neg - cum_neg[end]
    tied = cum_neg[end] - cum_neg[start]
    wins = jnp.sum(jnp.where(pos == 1, below + 0.5 * tied, 0.0))
    return wins / (n_pos.astype(jnp.float32) * n_neg.astype(jnp.float32))


@jax.jit
@with_auto_axes
def _average_precision_core(scores, positive, n):
    _, pos, cum_pos, _, _, end, n_pos, _ = _detection_counts(scores, positive, n)
    precision = cum_pos[end] / jnp.maximum(end, 1)
    return jnp.sum(jnp.where(pos == 1, precision, 0.0)) / n_pos


@jax.jit
@with_auto_axes
def _fpr_core(scores, positive, n, tpr):
    valid, _, cum_pos, cum_neg, _, end, n_pos, n_neg = _detection_counts(scores, positive, n)
    reached = cum_pos[end] / n_pos >= jnp.asarray(tpr, jnp.float32)
    fpr = cum_neg[end] / n_neg
    return jnp.min(jnp.where(valid & reached, fpr, jnp.inf))


# ---------------------------------------------------------------------------------------------
# Public functions on whole arrays


def max_softmax(logits: Float[Array, "b n"]) -> Float[Array, " b"]:
    """Confidence: the largest softmax probability of each row of logits."""
    return jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)


def anomaly_score(logits: Float[Array, "b n"]) -> Float[Array, " b"]:
    """RobustART's (and Hendrycks' MSP baseline's) OOD score: ``-max softmax``; higher = more anomalous."""
    return -max_softmax(logits)


def rms_calibration_error(
    confidence: Float[ArrayLike, " n"], correct: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"], *, beta: int = 100, skip_last_bin: bool = False
) -> Float[Array, ""]:
    """RMS calibration error over adaptive bins of ``beta`` consecutive samples sorted by confidence.

    ``sqrt(sum_b n_b / N * (mean_b confidence - mean_b correct)^2)`` with bins of ``beta``
    samples, the last one taking the remainder (one bin when N < 2 beta). ``skip_last_bin=True``
    reproduces Hendrycks' ``calib_err`` (and RobustART), which leaves the most confident bin out
    of the sum; it needs at least two bins (N >= 2 beta). Lower is better calibrated.
    """
    _check_pair(confidence, correct)
    check_positive_int(beta, "beta")
    if skip_last_bin and confidence.shape[0] < 2 * beta:
        raise ValueError(f"skip_last_bin needs N >= 2 * beta = {2 * beta} samples, got {confidence.shape[0]}")
    return _rms_core(confidence, correct, confidence.shape[0], beta, skip_last_bin)


def expected_calibration_error(
    confidence: Float[ArrayLike, " n"], correct: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"], *, num_bins: int = 15
) -> Float[Array, ""]:
    """ECE (Guo et al. 2017): ``sum_m n_m / N |mean_m confidence - mean_m correct|`` over
    ``num_bins`` equal-width bins ``((m-1)/M, m/M]`` (confidence 0 falls in the first).
    Lower is better calibrated."""
    _check_pair(confidence, correct)
    check_positive_int(num_bins, "num_bins")
    return _ece_core(confidence, correct, confidence.shape[0], num_bins)


def reliability_bins(
    confidence: Float[ArrayLike, " n"], correct: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"], *, num_bins: int = 15
) -> dict[str, jax.Array]:
    """The reliability diagram (Guo et al. 2017) on ECE's bins ``((m-1)/M, m/M]``: per bin,
    ``count``, ``confidence`` (mean) and ``accuracy`` (mean correctness), NaN for an empty bin.
    ``sum_m count_m / N |confidence_m - accuracy_m|`` is :func:`expected_calibration_error`."""
    _check_pair(confidence, correct)
    check_positive_int(num_bins, "num_bins")
    counts, confidence_sums, correct_sums = _reliability_core(confidence, correct, num_bins)
    means = jnp.clip(jnp.stack([confidence_sums, correct_sums]) / jnp.maximum(counts, 1.0), 0.0, 1.0)  # rounding
    means = jnp.where(counts > 0, means, jnp.nan)
    return {"count": counts.astype(jnp.int32), "confidence": means[0], "accuracy": means[1]}


def aurra(confidence: Float[ArrayLike, " n"], correct: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"]) -> Float[Array, ""]:
    """Area under the response rate - accuracy curve: ``mean_k acc(k most confident)``, k = 1..N.
    Higher is better (confidence ranks correct predictions first)."""
    _check_pair(confidence, correct)
    return _aurra_core(confidence, correct, confidence.shape[0])


def auroc(scores: Float[ArrayLike, " n"], positive: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"]) -> Float[Array, ""]:
    """Area under the ROC curve: ``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` (sklearn's
    ``roc_auc_score``). Higher is better."""
    _check_detection(scores, positive)
    return _auroc_core(scores, positive, scores.shape[0])


def average_precision(scores: Float[ArrayLike, " n"], positive: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"]) -> Float[Array, ""]:
    """Average precision (AUPR): ``sum_t (R_t - R_{t-1}) P_t`` over the distinct scores t taken
    as thresholds ``score >= t`` (sklearn's ``average_precision_score``). Higher is better."""
    _check_detection(scores, positive)
    return _average_precision_core(scores, positive, scores.shape[0])


def fpr_at_tpr(scores: Float[ArrayLike, " n"], positive: Bool[ArrayLike, " n"] | Int[ArrayLike, " n"], *, tpr: float = 0.95) -> Float[Array, ""]:
    """The lowest false positive rate among thresholds ``score >= t`` whose true positive rate is
    at least ``tpr``. Lower is better."""
    _check_detection(scores, positive, tpr)
    return _fpr_core(scores, positive, scores.shape[0], tpr)


def ood_detection(
    in_scores: Float[ArrayLike, " m"], out_scores: Float[ArrayLike, " k"], *, tpr: float = 0.95
) -> dict[str, jax.Array]:
    """AUROC, AUPR and FPR at ``tpr`` of anomaly scores with the out-of-distribution samples as
    the positive class (``calibration_tools.get_measures(out_scores, in_scores)``)."""
    _check_scores(in_scores, "in_scores")
    _check_scores(out_scores, "out_scores")
    check_in_interval(tpr, "tpr", 0.0, 1.0, closed_high=True)
    scores = jnp.concatenate([out_scores, in_scores])
    positive = jnp.arange(scores.shape[0]) < out_scores.shape[0]
    return _detection_all(scores, positive, scores.shape[0], tpr)


@jax.jit
def _detection_all(scores, positive, n, tpr) -> dict[str, jax.Array]:
    return {
        "auroc": _auroc_core(scores, positive, n),
        "aupr": _average_precision_core(scores, positive, n),
        "fpr_at_tpr": _fpr_core(scores, positive, n, tpr),
    }


# ---------------------------------------------------------------------------------------------
# Streaming: a fixed-capacity buffer of (score, flag) samples and how many were seen. The first
# min(count, capacity) entries are samples; a count above the capacity means some were dropped.


def _empty_buffer(capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    check_positive_int(capacity, "capacity")
    return jnp.zeros((capacity,), jnp.float32), jnp.zeros((capacity,), bool), jnp.zeros((), jnp.int32)


def _write(values: jax.Array, flags: jax.Array, count: jax.Array, new_values, new_flags, valid) -> tuple:
    """The buffer with the first ``valid`` of ``new_values``/``new_flags`` written after its
    ``count`` samples; entries beyond the capacity are dropped (and still counted)."""
    capacity, size = values.shape[0], new_values.shape[0]
    slots = jnp.where(jnp.arange(size) < valid, count + jnp.arange(size), capacity)
    return (
        values.at[slots].set(new_values.astype(jnp.float32), mode="drop"),
        flags.at[slots].set(new_flags.astype(bool), mode="drop"),
        count + valid,
    )


def _check_buffer(count, capacity: int, what: str) -> None:
    """On the host: the buffer must hold samples and must not have overflowed."""
    count = concrete_values(count)
    if count is not None and int(count) > capacity:
        raise ValueError(f"{what} overflowed: {int(count)} samples seen, capacity {capacity}; "
                         "create it with a larger capacity")
    if count is not None and int(count) == 0:
        raise ValueError(f"{what} holds no samples; update it first")


def _nan_where(undefined, values: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """NaN (never a silently wrong number) where traced code computed an undefined result."""
    return {k: jnp.where(undefined, jnp.nan, v) for k, v in values.items()}


@struct.dataclass
class CalibrationStats:
    """Streaming RMS calibration error, ECE, AURRA and accuracy over a whole dataset.

    Keeps every (confidence, correct) pair in a buffer of fixed ``capacity`` (5 bytes per
    sample), so shapes stay static under ``jit``/``lax.scan`` and the results are exact.
    ``merge`` writes the other buffer's samples after this one's. ``count`` is the number
    of samples seen; more than ``capacity`` makes ``compute`` raise (NaN when traced).
    """

    confidence: Float[Array, "..."]
    correct: Bool[Array, "..."]
    count: Int[Array, "..."]
    beta: int = setting()
    num_bins: int = setting()
    skip_last_bin: bool = setting()

    @classmethod
    def empty(cls, capacity: int, *, beta: int = 100, num_bins: int = 15, skip_last_bin: bool = False) -> CalibrationStats:
        """Room for ``capacity`` samples; ``beta``, ``skip_last_bin`` of :func:`rms_calibration_error`,
        ``num_bins`` of :func:`expected_calibration_error`."""
        check_positive_int(beta, "beta")
        check_positive_int(num_bins, "num_bins")
        check_bool(skip_last_bin, "skip_last_bin")
        return cls(*_empty_buffer(capacity), beta, num_bins, skip_last_bin)

    def update(self, confidence: Float[ArrayLike, " b"], correct: Bool[ArrayLike, " b"] | Int[ArrayLike, " b"]) -> CalibrationStats:
        """Adds a batch; ``confidence = max_softmax(logits)``, ``correct = argmax(logits) == y``."""
        _check_pair(confidence, correct)
        written = _write(self.confidence, self.correct, self.count, confidence, correct, confidence.shape[0])
        return self.replace(**dict(zip(("confidence", "correct", "count"), written)))

    def merge(self, other: CalibrationStats) -> CalibrationStats:
        check_mergeable(self, other)
        written = _write(self.confidence, self.correct, self.count, other.confidence, other.correct, other.count)
        return self.replace(**dict(zip(("confidence", "correct", "count"), written)))

    def compute(self) -> dict[str, jax.Array]:
        """``{"rms_calibration_error", "expected_calibration_error", "aurra", "accuracy"}``."""
        capacity = self.confidence.shape[0]
        _check_buffer(self.count, capacity, "CalibrationStats")
        count = concrete_values(self.count)
        if self.skip_last_bin and count is not None and int(count) < 2 * self.beta:
            raise ValueError(f"skip_last_bin needs N >= 2 * beta = {2 * self.beta} samples, got {int(count)}")
        undefined = (self.count > capacity) | ((self.count < 2 * self.beta) & self.skip_last_bin)
        return _nan_where(undefined, _calibration_all(self))


@jax.jit
def _calibration_all(stats: CalibrationStats) -> dict[str, jax.Array]:
    conf, correct, n = stats.confidence, stats.correct, stats.count
    valid = jnp.arange(conf.shape[0]) < n
    return {
        "rms_calibration_error": _rms_core(conf, correct, n, stats.beta, stats.skip_last_bin),
        "expected_calibration_error": _ece_core(conf, correct, n, stats.num_bins),
        "aurra": _aurra_core(conf, correct, n),
        "accuracy": jnp.sum(valid & correct) / n,
    }


@struct.dataclass
class OODStats:
    """Streaming AUROC, AUPR and FPR at ``tpr`` for OOD detection (OOD = positive class).

    The buffer of :class:`CalibrationStats`: ``update(anomaly_score(logits), is_ood)`` per
    batch, in-distribution and OOD batches in any order.
    """

    scores: Float[Array, "..."]
    is_ood: Bool[Array, "..."]
    count: Int[Array, "..."]
    tpr: float = setting()

    @classmethod
    def empty(cls, capacity: int, *, tpr: float = 0.95) -> OODStats:
        check_in_interval(tpr, "tpr", 0.0, 1.0, closed_high=True)
        return cls(*_empty_buffer(capacity), float(tpr))

    def update(self, scores: Float[ArrayLike, " b"], is_ood: Bool[ArrayLike, " b"] | Int[ArrayLike, " b"]) -> OODStats:
        _check_scores(scores, "scores")
        check_flags(is_ood, "is_ood", scores.shape)
        written = _write(self.scores, self.is_ood, self.count, scores, is_ood, scores.shape[0])
        return self.replace(**dict(zip(("scores", "is_ood", "count"), written)))

    def merge(self, other: OODStats) -> OODStats:
        check_mergeable(self, other)
        written = _write(self.scores, self.is_ood, self.count, other.scores, other.is_ood, other.count)
        return self.replace(**dict(zip(("scores", "is_ood", "count"), written)))

    def compute(self) -> dict[str, jax.Array]:
        """``{"auroc", "aupr", "fpr_at_tpr"}``."""
        capacity = self.scores.shape[0]
        _check_buffer(self.count, capacity, "OODStats")
        flags, count = concrete_values(self.is_ood), concrete_values(self.count)
        if flags is not None and count is not None:
            ood = flags[: int(count)]
            if ood.all() or not ood.any():
                raise ValueError("OOD detection needs both OOD and in-distribution samples")
        return _nan_where(self.count > capacity, _ood_all(self))


@jax.jit
def _ood_all(stats: OODStats) -> dict[str, jax.Array]:
    return _detection_all(stats.scores, stats.is_ood, stats.count, stats.tpr)
