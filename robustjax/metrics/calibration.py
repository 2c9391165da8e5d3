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
AUPR and the FPR use one threshold per distinct score, as sklearn does. Without ties, RMS and
AURRA equal Hendrycks' functions. The sorting metrics need every sample: :class:`CalibrationStats`
and :class:`OODStats` keep them in a fixed-capacity buffer (5 bytes per sample: a float32 and a
bool; 50,000 ImageNet images take 250 kB) and give exact results.

Deviations from ``calibration_tools`` (and RobustART's copy): its RMS loop skips the last,
most confident bin (``range(len(bins) - 1)``) while still dividing by all N; here every bin
counts, and ``skip_last_bin=True`` reproduces the original. It fails for N < beta; here all
samples then form one bin. Its FPR picks the threshold whose recall is *closest* to 95%, which
may be below it; here it is the lowest FPR at a threshold with TPR >= 95%.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from robustjax.checks import check_in_interval, check_positive_int

DIRECTION: dict[str, str] = {
    "rms_calibration_error": "lower",
    "expected_calibration_error": "lower",
    "aurra": "higher",
    "auroc": "higher",
    "aupr": "higher",
    "fpr_at_tpr": "lower",
}
"""Which way each metric is more robust (better calibrated, better OOD detector)."""


# ---------------------------------------------------------------------------------------------
# Host-side validation


def _concrete(a) -> np.ndarray | None:
    return None if isinstance(a, jax.core.Tracer) else np.asarray(a)


def check_flags(flags, name: str, shape: tuple[int, ...] | None = None) -> None:
    """``flags`` must be a boolean (or 0/1 integer) array, of ``shape`` when given, not empty."""
    if not hasattr(flags, "shape") or not hasattr(flags, "dtype"):
        raise TypeError(f"{name} must be a boolean array, got {type(flags).__name__}")
    if flags.dtype != np.bool_ and not np.issubdtype(flags.dtype, np.integer):
        raise TypeError(f"{name} must be boolean (or 0/1 integers), got dtype {flags.dtype}")
    if shape is not None and tuple(flags.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(flags.shape)}")
    if flags.size == 0:
        raise ValueError(f"{name} is empty (shape {tuple(flags.shape)})")
    values = _concrete(flags)
    if values is not None and values.dtype != np.bool_ and not np.isin(values, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0 and 1, got values {np.unique(values)[:5]}")


def _check_scores(scores, name: str, *, unit_interval: bool = False) -> None:
    """``scores`` must be a non-empty 1-D float array of finite values (in [0, 1] if asked)."""
    if not hasattr(scores, "shape") or not hasattr(scores, "dtype"):
        raise TypeError(f"{name} must be a float array, got {type(scores).__name__}")
    if not np.issubdtype(scores.dtype, np.floating):
        raise TypeError(f"{name} must be a float array, got dtype {scores.dtype}")
    if scores.ndim != 1 or scores.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(scores.shape)}")
    values = _concrete(scores)
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
    labels = _concrete(positive)
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
def _ece_core(confidence, correct, n, num_bins: int):
    valid = jnp.arange(confidence.shape[0]) < n
    bins = jnp.clip(jnp.ceil(confidence * num_bins).astype(jnp.int32) - 1, 0, num_bins - 1)
    bins = jnp.where(valid, bins, num_bins)
    gap = jnp.where(valid, confidence - correct.astype(jnp.float32), 0.0)
    per_bin = jax.ops.segment_sum(gap, bins, num_segments=num_bins + 1)
    return jnp.sum(jnp.abs(per_bin)) / n


@jax.jit
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
def _auroc_core(scores, positive, n):
    _, pos, _, cum_neg, start, end, n_pos, n_neg = _detection_counts(scores, positive, n)
    below = n_neg - cum_neg[end]
    tied = cum_neg[end] - cum_neg[start]
    wins = jnp.sum(jnp.where(pos == 1, below + 0.5 * tied, 0.0))
    return wins / (n_pos.astype(jnp.float32) * n_neg.astype(jnp.float32))


@jax.jit
def _average_precision_core(scores, positive, n):
    _, pos, cum_pos, _, _, end, n_pos, _ = _detection_counts(scores, positive, n)
    precision = cum_pos[end] / jnp.maximum(end, 1)
    return jnp.sum(jnp.where(pos == 1, precision, 0.0)) / n_pos


@jax.jit
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
    confidence: Float[Array, " n"], correct: Bool[Array, " n"], *, beta: int = 100, skip_last_bin: bool = False
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
    confidence: Float[Array, " n"], correct: Bool[Array, " n"], *, num_bins: int = 15
) -> Float[Array, ""]:
    """ECE (Guo et al. 2017): ``sum_m n_m / N |mean_m confidence - mean_m correct|`` over
    ``num_bins`` equal-width bins ``((m-1)/M, m/M]`` (confidence 0 falls in the first).
    Lower is better calibrated."""
    _check_pair(confidence, correct)
    check_positive_int(num_bins, "num_bins")
    return _ece_core(confidence, correct, confidence.shape[0], num_bins)


def aurra(confidence: Float[Array, " n"], correct: Bool[Array, " n"]) -> Float[Array, ""]:
    """Area under the response rate - accuracy curve: ``mean_k acc(k most confident)``, k = 1..N.
    Higher is better (confidence ranks correct predictions first)."""
    _check_pair(confidence, correct)
    return _aurra_core(confidence, correct, confidence.shape[0])


def auroc(scores: Float[Array, " n"], positive: Bool[Array, " n"]) -> Float[Array, ""]:
    """Area under the ROC curve: ``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` (sklearn's
    ``roc_auc_score``). Higher is better."""
    _check_detection(scores, positive)
    return _auroc_core(scores, positive, scores.shape[0])


def average_precision(scores: Float[Array, " n"], positive: Bool[Array, " n"]) -> Float[Array, ""]:
    """Average precision (AUPR): ``sum_t (R_t - R_{t-1}) P_t`` over the distinct scores t taken
    as thresholds ``score >= t`` (sklearn's ``average_precision_score``). Higher is better."""
    _check_detection(scores, positive)
    return _average_precision_core(scores, positive, scores.shape[0])


def fpr_at_tpr(scores: Float[Array, " n"], positive: Bool[Array, " n"], *, tpr: float = 0.95) -> Float[Array, ""]:
    """The lowest false positive rate among thresholds ``score >= t`` whose true positive rate is
    at least ``tpr``. Lower is better."""
    _check_detection(scores, positive, tpr)
    return _fpr_core(scores, positive, scores.shape[0], tpr)


def ood_detection(
    in_scores: Float[Array, " m"], out_scores: Float[Array, " k"], *, tpr: float = 0.95
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
# Streaming: a fixed-capacity buffer of (score, flag) samples


def _empty_buffer(capacity: int):
    check_positive_int(capacity, "capacity")
    zeros = jnp.zeros((), jnp.int32)
    return jnp.zeros((capacity,), jnp.float32), jnp.zeros((capacity,), bool), zeros, zeros


def _append(buffer, values: jax.Array, flags: jax.Array):
    """Writes a batch after the stored samples; what does not fit is dropped and counted."""
    stored, kept_flags, count, dropped = buffer
    capacity, batch = stored.shape[0], values.shape[0]
    slots = count + jnp.arange(batch)
    new_count = jnp.minimum(count + batch, capacity)
    return (
        stored.at[slots].set(values.astype(jnp.float32), mode="drop"),
        kept_flags.at[slots].set(flags.astype(bool), mode="drop"),
        new_count,
        dropped + count + batch - new_count,
    )


def _concatenate(a, b):
    """A buffer with capacity a + b holding a's samples, then b's."""
    (a_values, a_flags, a_count, a_dropped), (b_values, b_flags, b_count, b_dropped) = a, b
    pad = b_values.shape[0]
    beyond = a_values.shape[0] + pad  # an index past the end: dropped
    slots = jnp.where(jnp.arange(pad) < b_count, a_count + jnp.arange(pad), beyond)
    return (
        jnp.pad(a_values, (0, pad)).at[slots].set(b_values, mode="drop"),
        jnp.pad(a_flags, (0, pad)).at[slots].set(b_flags, mode="drop"),
        a_count + b_count,
        a_dropped + b_dropped,
    )


def _check_complete(count, dropped, what: str) -> None:
    """On the host: the buffer must hold samples and must not have dropped any."""
    count, dropped = _concrete(count), _concrete(dropped)
    if dropped is not None and int(dropped) > 0:
        raise ValueError(f"{what} overflowed: {int(dropped)} samples did not fit; create it with a larger capacity")
    if count is not None and int(count) == 0:
        raise ValueError(f"{what} holds no samples; update it first")


def _unless_dropped(dropped, values: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """NaN (never a silently wrong number) when traced code computed a buffer that overflowed."""
    return {k: jnp.where(dropped > 0, jnp.nan, v) for k, v in values.items()}


class CalibrationStats(NamedTuple):
    """Streaming RMS calibration error, ECE, AURRA and accuracy over a whole dataset.

    Keeps every (confidence, correct) pair in a buffer of fixed ``capacity`` (5 bytes per
    sample), so shapes stay static under ``jit``/``lax.scan`` and the results are exact.
    ``merge`` concatenates (capacity a + b), so per-device buffers gather into one; samples
    beyond the capacity are counted as dropped and ``compute`` then raises (NaN when traced).
    """

    confidence: jax.Array
    correct: jax.Array
    count: jax.Array
    dropped: jax.Array

    @classmethod
    def empty(cls, capacity: int) -> CalibrationStats:
        return cls(*_empty_buffer(capacity))

    def update(self, confidence: Float[Array, " b"], correct: Bool[Array, " b"]) -> CalibrationStats:
        """Adds a batch; ``confidence = max_softmax(logits)``, ``correct = argmax(logits) == y``."""
        _check_pair(confidence, correct)
        return CalibrationStats(*_append(self, confidence, correct))

    def merge(self, other: CalibrationStats) -> CalibrationStats:
        return CalibrationStats(*_concatenate(self, other))

    def compute(self, *, beta: int = 100, num_bins: int = 15, skip_last_bin: bool = False) -> dict[str, jax.Array]:
        """``{"rms_calibration_error", "expected_calibration_error", "aurra", "accuracy"}``."""
        _check_complete(self.count, self.dropped, "CalibrationStats")
        check_positive_int(beta, "beta")
        check_positive_int(num_bins, "num_bins")
        count = _concrete(self.count)
        if skip_last_bin and count is not None and int(count) < 2 * beta:
            raise ValueError(f"skip_last_bin needs N >= 2 * beta = {2 * beta} samples, got {int(count)}")
        return _unless_dropped(self.dropped, _calibration_all(self, beta, num_bins, skip_last_bin))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _calibration_all(stats: CalibrationStats, beta, num_bins, skip_last_bin) -> dict[str, jax.Array]:
    conf, correct, n = stats.confidence, stats.correct, stats.count
    valid = jnp.arange(conf.shape[0]) < n
    return {
        "rms_calibration_error": _rms_core(conf, correct, n, beta, skip_last_bin),
        "expected_calibration_error": _ece_core(conf, correct, n, num_bins),
        "aurra": _aurra_core(conf, correct, n),
        "accuracy": jnp.sum(valid & correct) / n,
    }


class OODStats(NamedTuple):
    """Streaming AUROC, AUPR and FPR at a TPR for OOD detection (OOD = positive class).

    Same buffer as :class:`CalibrationStats`: ``update(anomaly_score(logits), is_ood)`` per batch,
    in-distribution and OOD batches in any order.
    """

    scores: jax.Array
    is_ood: jax.Array
    count: jax.Array
    dropped: jax.Array

    @classmethod
    def empty(cls, capacity: int) -> OODStats:
        return cls(*_empty_buffer(capacity))

    def update(self, scores: Float[Array, " b"], is_ood: Bool[Array, " b"]) -> OODStats:
        _check_scores(scores, "scores")
        check_flags(is_ood, "is_ood", scores.shape)
        return OODStats(*_append(self, scores, is_ood))

    def merge(self, other: OODStats) -> OODStats:
        return OODStats(*_concatenate(self, other))

    def compute(self, *, tpr: float = 0.95) -> dict[str, jax.Array]:
        """``{"auroc", "aupr", "fpr_at_tpr"}``."""
        _check_complete(self.count, self.dropped, "OODStats")
        check_in_interval(tpr, "tpr", 0.0, 1.0, closed_high=True)
        flags, count = _concrete(self.is_ood), _concrete(self.count)
        if flags is not None and count is not None:
            ood = flags[: int(count)]
            if ood.all() or not ood.any():
                raise ValueError("OOD detection needs both OOD and in-distribution samples")
        return _unless_dropped(self.dropped, _ood_all(self, tpr))


@jax.jit
def _ood_all(stats: OODStats, tpr) -> dict[str, jax.Array]:
    return _detection_all(stats.scores, stats.is_ood, stats.count, tpr)

