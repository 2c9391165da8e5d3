"""Calibration (RMS, ECE, AURRA) and OOD detection (AUROC, AUPR, FPR@TPR) metrics: hand-computed
values, sklearn, a NumPy transcription of Hendrycks' calibration_tools, streaming and jit."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as sk

from robustjax.metrics import calibration as cal

# float32 sums of at most a few thousand terms against float64 references: 1e-5 relative.
TOL = {"rtol": 1e-5, "atol": 1e-6}


def hendrycks_calib_err(confidence, correct, beta=100, skip_last_bin=False):
    """Transcription of calibration_tools.calib_err (p='2'); the original always skips the last
    bin and fails for N < beta, here both are options/handled for comparison."""
    order = np.argsort(confidence)
    confidence, correct = confidence[order], correct[order].astype(np.float64)
    bins = [[i * beta, (i + 1) * beta] for i in range(max(len(confidence) // beta, 1))]
    bins[-1] = [bins[-1][0], len(confidence)]
    err = 0.0
    for lo, hi in bins[:-1] if skip_last_bin else bins:
        err += (hi - lo) / len(confidence) * (confidence[lo:hi].mean() - correct[lo:hi].mean()) ** 2
    return np.sqrt(err)


def hendrycks_aurra(confidence, correct):
    ranks = np.argsort(confidence)[::-1]
    curve = np.cumsum(correct[ranks]) / np.arange(1, len(correct) + 1)
    return curve.mean()


def sklearn_fpr_at_tpr(positive, scores, tpr=0.95):
    fpr, tprs, _ = sk.roc_curve(positive, scores, drop_intermediate=False)
    return fpr[tprs >= tpr].min()


@pytest.fixture(scope="module")
def predictions():
    """1,050 distinct confidences (no ties) and correctness drawn with P(correct) = confidence ** 2."""
    rng = np.random.default_rng(0)
    confidence = rng.permutation(np.linspace(0.05, 0.99, 1050)).astype(np.float32)
    return confidence, rng.random(1050) < confidence**2


@pytest.fixture(scope="module")
def detection():
    """Scores rounded to one decimal (many ties), 30% positives."""
    rng = np.random.default_rng(1)
    positive = rng.random(400) < 0.3
    scores = (rng.normal(size=400) + positive).round(1).astype(np.float32)
    return scores, positive


# --- hand-computed values ---------------------------------------------------------------------


def test_rms_hand_computed():
    conf = jnp.array([0.1, 0.2, 0.3, 0.4, 0.9])
    correct = jnp.array([False, False, True, True, True])
    # beta=2: bins [0.1, 0.2] (gap 0.15) and [0.3, 0.4, 0.9] (mean 1.6/3, gap 1.6/3 - 1).
    expected = np.sqrt(2 / 5 * 0.15**2 + 3 / 5 * (1.6 / 3 - 1) ** 2)
    np.testing.assert_allclose(cal.rms_calibration_error(conf, correct, beta=2), expected, **TOL)
    skipped = np.sqrt(2 / 5 * 0.15**2)
    np.testing.assert_allclose(cal.rms_calibration_error(conf, correct, beta=2, skip_last_bin=True), skipped, **TOL)
    # fewer samples than beta: one bin of everything
    np.testing.assert_allclose(cal.rms_calibration_error(conf, correct, beta=10), abs(1.9 / 5 - 3 / 5), **TOL)


def test_ece_hand_computed():
    conf = jnp.array([0.1, 0.45, 0.55, 0.95])
    correct = jnp.array([False, True, False, True])
    # bins (0, .5] and (.5, 1]: |0.275 - 0.5| * 2/4 + |0.75 - 0.5| * 2/4
    np.testing.assert_allclose(cal.expected_calibration_error(conf, correct, num_bins=2), 0.2375, **TOL)
    # one bin: |mean conf - accuracy|
    np.testing.assert_allclose(cal.expected_calibration_error(conf, correct, num_bins=1), abs(0.5125 - 0.5), **TOL)
    # a perfectly calibrated toy: confidence 1 always right, confidence 0.5 right half the time
    conf2 = jnp.array([1.0, 1.0, 0.5, 0.5])
    np.testing.assert_allclose(cal.expected_calibration_error(conf2, jnp.array([1, 1, 1, 0])), 0.0, atol=1e-7)


def test_reliability_bins_hand_computed_and_sum_to_ece():
    conf = jnp.array([0.1, 0.45, 0.55, 0.95, 0.0])
    correct = jnp.array([False, True, False, True, True])
    bins = cal.reliability_bins(conf, correct, num_bins=4)  # (0, .25] (.25, .5] (.5, .75] (.75, 1]; 0 in the first
    np.testing.assert_array_equal(bins["count"], [2, 1, 1, 1])
    np.testing.assert_allclose(bins["confidence"], [0.05, 0.45, 0.55, 0.95], **TOL)
    np.testing.assert_allclose(bins["accuracy"], [0.5, 1.0, 0.0, 1.0], **TOL)
    empty = cal.reliability_bins(conf[:1], correct[:1], num_bins=2)
    assert np.isnan(empty["confidence"][1]) and np.isnan(empty["accuracy"][1]) and empty["count"][1] == 0
    gaps = np.nansum(np.asarray(bins["count"]) / 5 * np.abs(np.asarray(bins["confidence"]) - bins["accuracy"]))
    np.testing.assert_allclose(gaps, cal.expected_calibration_error(conf, correct, num_bins=4), **TOL)


def test_aurra_hand_computed_and_ties():
    # accuracy of the top 1, 2, 3: 1, 1/2, 2/3
    value = cal.aurra(jnp.array([0.9, 0.8, 0.7]), jnp.array([True, False, True]))
    np.testing.assert_allclose(value, (1 + 1 / 2 + 2 / 3) / 3, **TOL)
    # a tie counts with its block's mean correctness, whatever the order
    for order in ([True, False], [False, True]):
        np.testing.assert_allclose(cal.aurra(jnp.array([0.5, 0.5]), jnp.array(order)), 0.5, **TOL)


def test_detection_hand_computed():
    scores = jnp.array([0.9, 0.8, 0.7, 0.6])
    positive = jnp.array([True, False, True, False])
    np.testing.assert_allclose(cal.average_precision(scores, positive), (1 / 1 + 2 / 3) / 2, **TOL)
    np.testing.assert_allclose(cal.auroc(scores, positive), 3 / 4, **TOL)
    # both positives are needed for TPR >= 0.95: threshold 0.7 lets one negative through
    np.testing.assert_allclose(cal.fpr_at_tpr(scores, positive), 1 / 2, **TOL)
    np.testing.assert_allclose(cal.fpr_at_tpr(scores, positive, tpr=0.5), 0.0, **TOL)
    # a tie between a positive and a negative counts one half
    np.testing.assert_allclose(cal.auroc(jnp.array([0.5, 0.5]), jnp.array([True, False])), 0.5, **TOL)


def test_anomaly_score_is_minus_max_softmax():
    logits = jnp.array([[0.0, 0.0], [np.log(3.0), 0.0]])
    np.testing.assert_allclose(cal.max_softmax(logits), [0.5, 0.75], **TOL)
    np.testing.assert_allclose(cal.anomaly_score(logits), [-0.5, -0.75], **TOL)


# --- reference implementations ----------------------------------------------------------------


@pytest.mark.parametrize("beta", [100, 64, 2000])
def test_rms_matches_hendrycks_transcription(predictions, beta):
    conf, correct = predictions
    got = cal.rms_calibration_error(jnp.asarray(conf), jnp.asarray(correct), beta=beta)
    np.testing.assert_allclose(got, hendrycks_calib_err(conf, correct, beta), **TOL)
    if len(conf) >= 2 * beta:
        quirk = cal.rms_calibration_error(jnp.asarray(conf), jnp.asarray(correct), beta=beta, skip_last_bin=True)
        np.testing.assert_allclose(quirk, hendrycks_calib_err(conf, correct, beta, skip_last_bin=True), **TOL)


def test_aurra_matches_hendrycks(predictions):
    conf, correct = predictions
    np.testing.assert_allclose(
        cal.aurra(jnp.asarray(conf), jnp.asarray(correct)), hendrycks_aurra(conf, correct), **TOL
    )


def test_ece_matches_numpy_binning(predictions):
    conf, correct = predictions
    edges = np.linspace(0, 1, 16)
    bins = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, 14)  # ((m-1)/M, m/M]
    expected = sum(abs(conf[bins == m].sum() - correct[bins == m].sum()) for m in range(15)) / len(conf)
    np.testing.assert_allclose(cal.expected_calibration_error(jnp.asarray(conf), jnp.asarray(correct)), expected, **TOL)


def test_detection_matches_sklearn(detection):
    scores, positive = detection
    s, p = jnp.asarray(scores), jnp.asarray(positive)
    np.testing.assert_allclose(cal.auroc(s, p), sk.roc_auc_score(positive, scores), **TOL)
    np.testing.assert_allclose(cal.average_precision(s, p), sk.average_precision_score(positive, scores), **TOL)
    for tpr in (0.95, 0.8, 1.0):
        np.testing.assert_allclose(cal.fpr_at_tpr(s, p, tpr=tpr), sklearn_fpr_at_tpr(positive, scores, tpr), **TOL)


def test_ood_detection_is_get_measures(detection):
    scores, positive = detection
    got = cal.ood_detection(jnp.asarray(scores[~positive]), jnp.asarray(scores[positive]))
    np.testing.assert_allclose(got["aupr"], sk.average_precision_score(positive, scores), **TOL)
    np.testing.assert_allclose(got["auroc"], sk.roc_auc_score(positive, scores), **TOL)
    np.testing.assert_allclose(got["fpr_at_tpr"], sklearn_fpr_at_tpr(positive, scores), **TOL)


# --- properties -------------------------------------------------------------------------------


def test_order_of_samples_does_not_matter_with_ties():
    rng = np.random.default_rng(2)
    conf = rng.choice([0.3, 0.6, 0.9], size=300).astype(np.float32)
    correct = rng.random(300) < conf
    perm = rng.permutation(300)
    for fn in (cal.rms_calibration_error, cal.aurra, cal.expected_calibration_error):
        a = fn(jnp.asarray(conf), jnp.asarray(correct))
        b = fn(jnp.asarray(conf[perm]), jnp.asarray(correct[perm]))
        np.testing.assert_allclose(a, b, **TOL)


def test_calibration_streaming_equals_one_shot_and_merge_any_order(predictions):
    conf, correct = jnp.asarray(predictions[0]), jnp.asarray(predictions[1])
    one_shot = {
        "rms_calibration_error": cal.rms_calibration_error(conf, correct),
        "expected_calibration_error": cal.expected_calibration_error(conf, correct),
        "aurra": cal.aurra(conf, correct),
        "accuracy": jnp.mean(correct),
    }
    stats = cal.CalibrationStats.empty(1100)
    for lo in range(0, 1050, 256):
        stats = stats.update(conf[lo : lo + 256], correct[lo : lo + 256])
    # one capacity, so compute compiles once for all three
    halves = [cal.CalibrationStats.empty(1100).update(conf[:500], correct[:500]),
              cal.CalibrationStats.empty(1100).update(conf[500:], correct[500:])]
    for result in (stats.compute(), halves[0].merge(halves[1]).compute(), halves[1].merge(halves[0]).compute()):
        for name, value in one_shot.items():
            np.testing.assert_allclose(result[name], value, **TOL, err_msg=name)
    quirk = stats.replace(skip_last_bin=True).compute()["rms_calibration_error"]
    np.testing.assert_allclose(quirk, cal.rms_calibration_error(conf, correct, skip_last_bin=True), **TOL)


def test_ood_streaming_equals_one_shot_and_merge_any_order(detection):
    scores, positive = jnp.asarray(detection[0]), jnp.asarray(detection[1])
    one_shot = {"auroc": cal.auroc(scores, positive), "aupr": cal.average_precision(scores, positive),
                "fpr_at_tpr": cal.fpr_at_tpr(scores, positive)}
    parts = [cal.OODStats.empty(400).update(scores[i : i + 100], positive[i : i + 100]) for i in range(0, 400, 100)]
    for order in itertools.permutations(range(4), 4):
        merged = parts[order[0]]
        for i in order[1:]:
            merged = merged.merge(parts[i])
        for name, value in merged.compute().items():
            np.testing.assert_allclose(value, one_shot[name], **TOL, err_msg=f"{name} {order}")


def test_jit_equals_eager(predictions, detection):
    conf, correct = jnp.asarray(predictions[0]), jnp.asarray(predictions[1])
    scores, positive = jnp.asarray(detection[0]), jnp.asarray(detection[1])
    for fn, args in [(cal.rms_calibration_error, (conf, correct)), (cal.expected_calibration_error, (conf, correct)),
                     (cal.aurra, (conf, correct)), (cal.auroc, (scores, positive)),
                     (cal.average_precision, (scores, positive)), (cal.fpr_at_tpr, (scores, positive))]:
        np.testing.assert_allclose(jax.jit(fn)(*args), fn(*args), **TOL, err_msg=fn.__name__)
    update = jax.jit(lambda s, c, k: s.update(c, k))
    stats = cal.CalibrationStats.empty(1100)
    for lo in range(0, 1050, 350):  # same shapes: one compile
        stats = update(stats, conf[lo : lo + 350], correct[lo : lo + 350])
    traced = jax.jit(lambda s: s.compute())(stats)
    eager = stats.compute()
    for name in eager:
        np.testing.assert_allclose(traced[name], eager[name], **TOL, err_msg=name)


def test_traced_overflow_gives_nan_not_a_number():
    stats = cal.CalibrationStats.empty(2).update(jnp.array([0.5, 0.6, 0.7]), jnp.array([1, 0, 1]))
    assert int(stats.count) == 3
    assert np.isnan(jax.jit(lambda s: s.compute())(stats)["aurra"])
    fits = cal.CalibrationStats.empty(2).update(jnp.array([0.5]), jnp.array([1]))
    assert np.isnan(jax.jit(lambda s: s.compute())(fits.merge(fits.merge(fits)))["aurra"])  # overflow by merging
    assert not np.isnan(jax.jit(lambda s: s.compute())(fits.merge(fits))["aurra"])


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "confidence, correct, error, match",
    [
        (jnp.array([0.5, 0.6]), jnp.array([True]), ValueError, "shape"),
        (jnp.zeros((0,)), jnp.zeros((0,), bool), ValueError, "non-empty"),
        (jnp.array([0.5, jnp.nan]), jnp.array([True, False]), ValueError, "NaN"),
        (jnp.array([0.5, 1.5]), jnp.array([True, False]), ValueError, r"\[0, 1\]"),
        (jnp.array([0.5, 0.6]), jnp.array([0.5, 1.0]), TypeError, "boolean"),
        (jnp.array([0.5, 0.6]), jnp.array([2, 1]), ValueError, "0 and 1"),
        (jnp.array([1, 0]), jnp.array([True, False]), TypeError, "float"),
    ],
)
def test_bad_calibration_input(confidence, correct, error, match):
    for fn in (cal.rms_calibration_error, cal.expected_calibration_error, cal.aurra):
        with pytest.raises(error, match=match):
            fn(confidence, correct)
    with pytest.raises(error, match=match):
        cal.CalibrationStats.empty(4).update(confidence, correct)


def test_bad_settings_and_buffers():
    conf, correct = jnp.array([0.2, 0.8]), jnp.array([False, True])
    with pytest.raises(ValueError, match="beta"):
        cal.rms_calibration_error(conf, correct, beta=0)
    with pytest.raises(ValueError, match="num_bins"):
        cal.expected_calibration_error(conf, correct, num_bins=0)
    with pytest.raises(ValueError, match="skip_last_bin"):
        cal.rms_calibration_error(conf, correct, beta=2, skip_last_bin=True)
    with pytest.raises(ValueError, match="capacity"):
        cal.CalibrationStats.empty(0)
    with pytest.raises(ValueError, match="beta"):
        cal.CalibrationStats.empty(4, beta=0)
    with pytest.raises(ValueError, match="skip_last_bin"):
        cal.CalibrationStats.empty(4, beta=2, skip_last_bin=True).update(conf, correct).compute()
    with pytest.raises(ValueError, match="different sizes"):
        cal.CalibrationStats.empty(4).merge(cal.CalibrationStats.empty(5))
    with pytest.raises(ValueError, match="no samples"):
        cal.CalibrationStats.empty(4).compute()
    with pytest.raises(ValueError, match="overflowed"):
        cal.CalibrationStats.empty(1).update(conf, correct).compute()
    with pytest.raises(ValueError, match="overflowed"):
        cal.OODStats.empty(1).update(conf, correct).compute()


def test_bad_detection_input():
    scores = jnp.array([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="both"):
        cal.auroc(scores, jnp.array([True, True, True]))
    with pytest.raises(ValueError, match="both"):
        cal.average_precision(scores, jnp.array([False, False, False]))
    with pytest.raises(ValueError, match="both"):
        cal.OODStats.empty(3).update(scores, jnp.array([True, True, True])).compute()
    with pytest.raises(ValueError, match="tpr"):
        cal.fpr_at_tpr(scores, jnp.array([True, False, True]), tpr=1.5)
    with pytest.raises(ValueError, match="NaN"):
        cal.ood_detection(jnp.array([0.1, jnp.inf]), scores)
    with pytest.raises(ValueError, match="shape"):
        cal.auroc(scores, jnp.array([True, False]))
