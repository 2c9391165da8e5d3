"""Property-based fuzzing of the array API (attacks, noise, metrics, Classifier): every
malformed argument ends in a ValueError or TypeError, raised by robustjax's own checks,
whose message names that argument; every well-formed one gives a correct result.

Hypothesis runs derandomized with the profile of ``tests/conftest.py``. Valid cases keep
to one image shape (2, 8, 8, 1) and a few hyperparameter values, so they share compiled
programs; malformed ones are refused before anything is traced.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import robustjax as rj
from tests.helpers import linear_apply, linear_classifier

IMAGE_SHAPE = (8, 8, 1)
BATCH = 2


def ignoring_one_pixel_classifier() -> rj.Classifier:
    """A random linear classifier blind to pixel 0, whose gradient there is exactly 0 (as
    at the pixels a CNN's receptive fields miss)."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(int(np.prod(IMAGE_SHAPE)), 3))
    weights[0] = 0.0
    return linear_classifier(weights, rng.normal(size=3), IMAGE_SHAPE)


CLASSIFIER = ignoring_one_pixel_classifier()
KEY = jax.random.key(0)
PACKAGE = Path(rj.__file__).parent

FLOAT_DTYPES = (np.float16, np.float32, np.float64)
NON_FLOAT_DTYPES = (np.uint8, np.int32, np.int64, np.bool_, np.complex64, np.complex128)
BAD_PIXELS = (math.nan, math.inf, -math.inf, -1e-3, 1.001, 1e30, -0.5)
# Not arrays at all.
NON_ARRAYS = (None, "images", 0.5, [[0.5, 0.5]])


def assert_refused(call, argument: str) -> None:
    """``call()`` raises a ValueError or TypeError from robustjax's own code (not from deep
    inside JAX or NumPy) whose message names ``argument``."""
    with pytest.raises((ValueError, TypeError)) as caught:
        call()
    message = str(caught.value)
    assert re.search(rf"(?<![\w.]){re.escape(argument)}\b", message), f"{argument!r} not named in: {message}"
    raiser = caught.traceback[-1].path
    assert PACKAGE in Path(raiser).parents, f"raised in {raiser}, not by robustjax's checks: {message}"


def images(seed: int, shape=(BATCH, *IMAGE_SHAPE), dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, shape).astype(dtype)


@st.composite
def malformed_images(draw, wrong_shapes=((BATCH, 8, 8, 3), (BATCH, 4, 8, 1), (1, 16, 16, 1))):
    """Image batches no entry point may accept: another dtype, rank or image shape, an
    empty batch, a NaN, infinite or out-of-range pixel, or no array at all."""
    seed = draw(st.integers(0, 2**16))
    kind = draw(st.sampled_from(["dtype", "rank", "empty", "shape", "pixel", "non-array"]))
    if kind == "dtype":
        return images(seed).astype(draw(st.sampled_from(NON_FLOAT_DTYPES)))
    if kind == "rank":
        return images(seed, draw(st.sampled_from([(), (8,), (8, 8), (BATCH, 8, 8), (BATCH, 8, 8, 1, 1)])))
    if kind == "empty":
        return np.zeros((0, *IMAGE_SHAPE), draw(st.sampled_from(FLOAT_DTYPES)))
    if kind == "shape":
        return images(seed, draw(st.sampled_from(wrong_shapes)))
    if kind == "pixel":
        x = images(seed, dtype=draw(st.sampled_from(FLOAT_DTYPES)))
        x.flat[draw(st.integers(0, x.size - 1))] = draw(st.sampled_from(BAD_PIXELS))
        return x
    return draw(st.sampled_from(NON_ARRAYS))


def labels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CLASSIFIER.num_classes, BATCH).astype(np.int32)


@st.composite
def malformed_labels(draw):
    """Labels of another dtype or shape, or out of the class range."""
    kind = draw(st.sampled_from(["dtype", "shape", "range", "non-array"]))
    if kind == "dtype":
        return np.zeros(BATCH, draw(st.sampled_from([np.float32, np.float64, np.complex64])))
    if kind == "shape":
        return np.zeros(draw(st.sampled_from([(), (BATCH + 1,), (BATCH, 1), (0,)])), np.int32)
    if kind == "range":
        return np.array([0, draw(st.sampled_from([-1, CLASSIFIER.num_classes, 2**31 - 1]))], np.int32)
    return draw(st.sampled_from([None, [0, 1], "0 1"]))


# ------------------------------------------------------------------------------- attacks

# Small budgets; each attack's valid runs share one compiled program.
ATTACKS = {
    "fgsm": lambda eps: rj.attacks.FGSM(eps=eps),
    "pgd": lambda eps: rj.attacks.PGD(eps=eps, steps=2),
    "square": lambda eps: rj.attacks.Square(eps=eps, max_queries=8),
}
# Hyperparameter values an attack must refuse, by field.
BAD_HYPERPARAMETERS = {
    "eps": [-1e-3, -math.inf, math.inf, math.nan, 1e39, 3e38, True, "0.1", None, [0.1], np.float32(math.nan)],
    "steps": [0, -1, 2.5, True, math.nan, "10", None, 10**30],
    "step_size": [-0.1, math.nan, math.inf, "0.1", 1e39],
    "norm": ["l3", "", None, 2, ["linf"]],
    "max_queries": [0, 1, 2, -5, 2.5, True, math.nan, None],
}
ATTACK_FIELDS = {"fgsm": ["eps"], "pgd": ["eps", "steps", "step_size", "norm"], "square": ["eps", "norm", "max_queries"]}


@settings(max_examples=60)
@given(name=st.sampled_from(sorted(ATTACKS)), data=st.data())
def test_attacks_refuse_bad_hyperparameters(name, data):
    field = data.draw(st.sampled_from(ATTACK_FIELDS[name]))
    value = data.draw(st.sampled_from(BAD_HYPERPARAMETERS[field]))
    assert_refused(lambda: rj.attacks.create(name, **{field: value}), field)


@settings(max_examples=60)
@given(name=st.sampled_from(sorted(ATTACKS)), argument=st.sampled_from(["x", "y", "target", "key"]), data=st.data())
def test_attacks_refuse_malformed_calls(name, argument, data):
    seed = data.draw(st.integers(0, 2**16))
    call = {"x": images(seed), "y": labels(seed), "target": None, "key": KEY}
    if argument == "x":
        call["x"] = data.draw(malformed_images())
    elif argument == "y":
        call["y"] = data.draw(malformed_labels())
    elif argument == "target":
        call["target"] = data.draw(st.one_of(malformed_labels().filter(lambda t: t is not None), st.just(call["y"])))
    else:
        call["key"] = data.draw(st.sampled_from([None, 0, np.zeros(2, np.uint32), jax.numpy.zeros(3), "key"]))
    attack = ATTACKS[name](0.1)
    assert_refused(lambda: attack(CLASSIFIER, call["x"], call["y"], key=call["key"], target=call["target"]),
                   argument)


@settings(max_examples=20)
@given(name=st.sampled_from(["fgsm", "pgd"]), seed=st.integers(0, 2**16), dtype=st.sampled_from(FLOAT_DTYPES),
       eps=st.sampled_from([0.0, 0.05, 1.0, 1e6, 1e20]))
def test_attacks_on_valid_inputs_stay_in_the_threat_set(name, seed, dtype, eps):
    """Any floating dtype and any finite radius, however large: ``x_adv`` is finite, in
    the box and in the ball, and ``success`` agrees with the classifier on ``x_adv``. (The
    radius is passed traced, so each attack compiles once; a score-based attack compiles
    for seconds per radius, so Square is fuzzed on its refusals only.)"""
    x = images(seed, dtype=dtype)
    y = labels(seed)
    result = ATTACKS[name](jax.numpy.float32(eps))(CLASSIFIER, x, y, key=KEY)
    x_adv = np.asarray(result.x_adv)
    assert x_adv.dtype == np.float32 and x_adv.shape == x.shape
    assert np.isfinite(x_adv).all() and x_adv.min() >= 0 and x_adv.max() <= 1
    assert np.abs(x_adv - x.astype(np.float32)).max() <= eps + 1e-6
    predicted = np.argmax(linear_apply(CLASSIFIER.params, x_adv), axis=-1)
    np.testing.assert_array_equal(np.asarray(result.success), predicted != y)


@settings(max_examples=10)
@given(eps=st.sampled_from([1e25, 1e30, 1e38, 3e38, 1e39]), seed=st.integers(0, 2**16))
def test_a_huge_python_eps_is_refused_or_stays_finite(eps, seed):
    """A Python float is fixed into the program in float32: 1e39 becomes inf there, and
    inf times the zero gradient of an ignored pixel makes a NaN image that no attack
    success would count."""
    x, y = images(seed), labels(seed)
    try:
        result = rj.attacks.FGSM(eps=eps)(CLASSIFIER, x, y, key=KEY)
    except ValueError as error:
        assert "eps" in str(error) and eps > 1e30, str(error)
        return
    x_adv = np.asarray(result.x_adv)
    assert np.isfinite(x_adv).all() and x_adv.min() >= 0 and x_adv.max() <= 1


# --------------------------------------------------------------------------------- noise

@settings(max_examples=40)
@given(argument=st.sampled_from(["x", "severity", "name", "key", "preset"]), data=st.data())
def test_corrupt_refuses_malformed_arguments(argument, data):
    call = {"x": images(data.draw(st.integers(0, 2**16))), "name": "gaussian_noise", "severity": 1, "key": KEY,
            "preset": None}
    call[argument] = data.draw({
        "x": malformed_images(wrong_shapes=((BATCH, 8, 8, 2), (BATCH, 8, 8, 4))),
        "severity": st.sampled_from([0, 6, -1, 2.0, True, "3", None, math.nan]),
        "name": st.sampled_from(["no_such_noise", "", 3, None, ["gaussian_noise"]]),
        "key": st.sampled_from([None, 0, "key", np.zeros(2, np.uint32), jax.numpy.zeros(3)]),
        "preset": st.sampled_from(["tiny", "", 1, ["cifar"]]),
    }[argument])
    named = "corruption" if argument == "name" else argument  # the message says "unknown corruption ..."
    assert_refused(lambda: rj.noise.corrupt(call["x"], call["name"], call["severity"], call["key"],
                                            preset=call["preset"]), named)


@settings(max_examples=12)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(FLOAT_DTYPES))
def test_corrupt_keeps_valid_images_valid(seed, dtype):
    x = images(seed, dtype=dtype)
    corrupted = np.asarray(rj.noise.corrupt(x, "gaussian_noise", 3, KEY))
    assert corrupted.dtype == np.float32 and corrupted.shape == x.shape
    assert np.isfinite(corrupted).all() and corrupted.min() >= 0 and corrupted.max() <= 1


# ------------------------------------------------------------------------------- metrics

CALIBRATION_SIZE = 16


@st.composite
def malformed_scores(draw):
    """Confidences that are not a non-empty 1-D float array in [0, 1] without NaN."""
    kind = draw(st.sampled_from(["dtype", "shape", "value", "non-array"]))
    if kind == "dtype":
        return np.ones(CALIBRATION_SIZE, draw(st.sampled_from([np.int32, np.bool_, np.complex64])))
    if kind == "shape":
        return np.full(draw(st.sampled_from([(), (0,), (CALIBRATION_SIZE, 1), (2, 8)])), 0.5, np.float32)
    if kind == "value":
        scores = np.full(CALIBRATION_SIZE, 0.5, draw(st.sampled_from(FLOAT_DTYPES)))
        scores[draw(st.integers(0, CALIBRATION_SIZE - 1))] = draw(st.sampled_from([math.nan, math.inf, -0.1, 1.5]))
        return scores
    return draw(st.sampled_from([None, 0.5, [0.5] * CALIBRATION_SIZE]))


@st.composite
def malformed_flags(draw):
    """Correctness flags that are not CALIBRATION_SIZE booleans (or 0/1 integers)."""
    kind = draw(st.sampled_from(["dtype", "shape", "value", "non-array"]))
    if kind == "dtype":
        return np.ones(CALIBRATION_SIZE, draw(st.sampled_from([np.float32, np.float64])))
    if kind == "shape":
        return np.ones(draw(st.sampled_from([(CALIBRATION_SIZE - 1,), (CALIBRATION_SIZE, 1), ()])), bool)
    if kind == "value":
        return np.full(CALIBRATION_SIZE, draw(st.sampled_from([2, -1, 255])), np.int32)
    return draw(st.sampled_from([None, True]))


def reference_ece(confidence: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    """ECE over equal-width bins ((m-1)/M, m/M], confidence 0 in the first (Guo et al. 2017)."""
    bins = np.clip(np.ceil(confidence * num_bins).astype(int) - 1, 0, num_bins - 1)
    gaps = [abs(np.sum(confidence[bins == m] - correct[bins == m])) for m in range(num_bins)]
    return float(np.sum(gaps) / confidence.size)


@settings(max_examples=40)
@given(argument=st.sampled_from(["confidence", "correct", "num_bins"]), data=st.data())
def test_calibration_error_refuses_malformed_arguments(argument, data):
    call = {"confidence": np.full(CALIBRATION_SIZE, 0.5, np.float32), "correct": np.ones(CALIBRATION_SIZE, bool),
            "num_bins": 15}
    call[argument] = data.draw({"confidence": malformed_scores(), "correct": malformed_flags(),
                                "num_bins": st.sampled_from([0, -1, 2.5, True, None, "15"])}[argument])
    ece = rj.metrics.calibration.expected_calibration_error
    assert_refused(lambda: ece(call["confidence"], call["correct"], num_bins=call["num_bins"]), argument)
    stats = rj.metrics.calibration.CalibrationStats.empty(CALIBRATION_SIZE)
    if argument != "num_bins":
        assert_refused(lambda: stats.update(call["confidence"], call["correct"]), argument)


@settings(max_examples=15)
@given(steps=st.lists(st.integers(0, 64), min_size=CALIBRATION_SIZE, max_size=CALIBRATION_SIZE),
       correct=st.lists(st.booleans(), min_size=CALIBRATION_SIZE, max_size=CALIBRATION_SIZE),
       dtype=st.sampled_from(FLOAT_DTYPES))
def test_calibration_error_matches_its_definition(steps, correct, dtype):
    """Confidences on a grid of 1/64 (off every bin edge but 0 and 1), in any float dtype;
    one-shot and streamed (two batches) agree with the definition."""
    confidence, correct = (np.asarray(steps) / 64).astype(dtype), np.asarray(correct)
    expected = reference_ece(confidence.astype(np.float64), correct, 15)
    calibration = rj.metrics.calibration
    assert float(calibration.expected_calibration_error(confidence, correct)) == pytest.approx(expected, abs=1e-6)
    half = CALIBRATION_SIZE // 2
    stats = calibration.CalibrationStats.empty(CALIBRATION_SIZE).update(confidence[:half], correct[:half])
    streamed = stats.update(confidence[half:], correct[half:]).compute()
    assert float(streamed["expected_calibration_error"]) == pytest.approx(expected, abs=1e-6)
    assert float(streamed["accuracy"]) == pytest.approx(correct.mean())


@settings(max_examples=10)
@given(capacity=st.sampled_from([0, -1, 2.5, True, None, "16", 2**70]))
def test_calibration_stats_refuse_a_bad_capacity(capacity):
    assert_refused(lambda: rj.metrics.calibration.CalibrationStats.empty(capacity), "capacity")


def test_calibration_stats_refuse_an_empty_or_overfull_buffer():
    stats = rj.metrics.calibration.CalibrationStats.empty(4)
    assert_refused(stats.compute, "update")
    full = stats.update(np.full(3, 0.5, np.float32), np.ones(3, bool)).update(np.full(3, 0.5, np.float32),
                                                                            np.ones(3, bool))
    assert_refused(full.compute, "capacity")


@st.composite
def malformed_logits(draw):
    """Logits that are not a finite float (B, K) array with K >= 2."""
    kind = draw(st.sampled_from(["dtype", "shape", "value", "non-array"]))
    if kind == "dtype":
        return np.zeros((BATCH, 3), draw(st.sampled_from([np.int32, np.bool_, np.complex64])))
    if kind == "shape":
        return np.zeros(draw(st.sampled_from([(BATCH,), (BATCH, 1), (0, 3), (BATCH, 3, 1)])), np.float32)
    if kind == "value":
        logits = np.zeros((BATCH, 3), draw(st.sampled_from(FLOAT_DTYPES)))
        logits.flat[draw(st.integers(0, logits.size - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        return logits
    return draw(st.sampled_from([None, [[0.0, 1.0]] * BATCH]))


@settings(max_examples=30)
@given(argument=st.sampled_from(["logits", "labels"]), data=st.data())
def test_accuracy_refuses_malformed_arguments(argument, data):
    behaviour = rj.metrics.behaviour
    call = {"logits": np.zeros((BATCH, 3), np.float32), "labels": labels(0)}
    call[argument] = data.draw(malformed_logits() if argument == "logits" else malformed_labels())
    assert_refused(lambda: behaviour.accuracy(call["logits"], call["labels"]), argument)
    assert_refused(lambda: behaviour.Accuracy.empty().update(call["logits"], call["labels"]), argument)


@settings(max_examples=15)
@given(logits=st.lists(st.floats(-6e4, 6e4, width=16), min_size=BATCH * 3, max_size=BATCH * 3),
       labels=st.lists(st.integers(0, 2), min_size=BATCH, max_size=BATCH), dtype=st.sampled_from(FLOAT_DTYPES))
def test_accuracy_matches_its_definition(logits, labels, dtype):
    logits, labels = np.asarray(logits, dtype).reshape(BATCH, 3), np.asarray(labels, np.int32)
    expected = np.mean(np.argmax(logits, axis=-1) == labels)
    behaviour = rj.metrics.behaviour
    assert float(behaviour.accuracy(logits, labels)) == pytest.approx(expected)
    assert float(behaviour.Accuracy.empty().update(logits, labels).compute()["accuracy"]) == pytest.approx(expected)


@settings(max_examples=30)
@given(argument=st.sampled_from(["x", "x_adv"]), data=st.data())
def test_lp_distortion_refuses_malformed_images(argument, data):
    call = {"x": images(1), "x_adv": images(2)}
    call[argument] = data.draw(malformed_images())
    assert_refused(lambda: rj.metrics.imperceptibility.lp_distortion(call["x"], call["x_adv"]), argument)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(FLOAT_DTYPES))
def test_lp_distortion_matches_its_definition(seed, dtype):
    x, x_adv = images(seed, dtype=dtype), images(seed + 1, dtype=dtype)
    distortion = rj.metrics.imperceptibility.lp_distortion(x, x_adv)
    flat, delta = x.astype(np.float32).reshape(BATCH, -1), (x_adv.astype(np.float32) - x.astype(np.float32))
    delta = delta.reshape(BATCH, -1)
    np.testing.assert_allclose(distortion.l2, np.linalg.norm(delta, axis=-1) / np.linalg.norm(flat, axis=-1),
                               rtol=1e-5)
    np.testing.assert_allclose(distortion.linf, np.abs(delta).max(-1) / flat.max(-1), rtol=1e-5)


# ---------------------------------------------------------------------------- Classifier

BAD_CLASSIFIER_FIELDS = {
    "num_classes": [0, 1, -3, True, 2.0, "3", None, math.nan],
    "input_shape": [(8, 8), (8, 8, 1, 1), (8, 0, 1), (-8, 8, 1), (8.0, 8, 1), (True, 8, 1), None, "881", 8],
    "mean": [(), (0.0, 0.0), (math.nan,), (math.inf,), ("a",), None, 0.5],
    "std": [(0.0,), (-1.0,), (math.nan,), (math.inf,), (1.0, 1.0), ("a",), None, 1.0],
    "apply_fn": [None, "linear", 3],
    "name": [None, 3, b"linear"],
}


@settings(max_examples=50)
@given(field=st.sampled_from(sorted(BAD_CLASSIFIER_FIELDS)), data=st.data())
def test_classifier_refuses_bad_fields(field, data):
    fields = dict(params=CLASSIFIER.params, apply_fn=linear_apply, num_classes=3, input_shape=IMAGE_SHAPE)
    fields[field] = data.draw(st.sampled_from(BAD_CLASSIFIER_FIELDS[field]))
    assert_refused(lambda: rj.Classifier(**fields), field)


@settings(max_examples=30)
@given(method=st.sampled_from(["__call__", "features"]), x=malformed_images(wrong_shapes=((BATCH, 8, 8, 3),)))
def test_classifier_calls_refuse_malformed_images(method, x):
    """A call checks what it can without looking at values (it may be traced): a float
    (B, H, W, C) batch with the classifier's channels; H and W may differ from input_shape
    for networks that take any size, and the values are the caller's to check."""
    if isinstance(x, np.ndarray) and x.ndim == 4 and x.shape[-1] == 1 and np.issubdtype(x.dtype, np.floating):
        return
    classifier = CLASSIFIER.replace(features_fn=lambda params, x: {"logits": linear_apply(params, x)})
    assert_refused(lambda: getattr(classifier, method)(x), "x")


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(FLOAT_DTYPES))
def test_classifier_calls_give_the_logits_of_any_float_dtype(seed, dtype):
    x = images(seed, dtype=dtype)
    expected = linear_apply(CLASSIFIER.params, x.astype(np.float32))
    np.testing.assert_allclose(np.asarray(CLASSIFIER(x)), expected, rtol=1e-5, atol=1e-5)


HOOK_WORKLOAD = textwrap.dedent("""
    import beartype  # noqa: F401  (the hook's decorator refers to it)
    import jax
    import numpy as np
    from jaxtyping import install_import_hook

    # The hook on the modules the calls below enter: all of robustjax would take 10 s more to import.
    HOOKED = ["robustjax.attacks.base", "robustjax.metrics.calibration", "robustjax.noise.registry"]
    with install_import_hook(HOOKED, "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"):
        import robustjax as rj
        from robustjax import attacks, metrics, noise  # noqa: F401  (loaded lazily otherwise)

    from tests.helpers import random_linear_classifier

    clf = random_linear_classifier(input_shape=(8, 8, 1))
    good, y, key = np.full((2, 8, 8, 1), 0.5, np.float32), np.zeros(2, np.int32), jax.random.key(0)
    calls = {
        "x": lambda: rj.attacks.FGSM(eps=0.1)(clf, good[..., 0], y, key=key),
        "y": lambda: rj.attacks.FGSM(eps=0.1)(clf, good, y.astype(np.float32), key=key),
        "confidence": lambda: rj.metrics.calibration.expected_calibration_error(np.ones((2, 2)), np.ones(2, bool)),
        "severity": lambda: rj.noise.corrupt(good, "gaussian_noise", "3", key),
    }
    for argument, call in calls.items():
        try:
            call()
        except TypeError as error:
            assert repr(argument) in str(error) or f"{argument}=" in str(error), (argument, str(error))
        else:
            raise AssertionError(f"{argument}: accepted")
    print("ok")
""")


def test_errors_under_the_annotation_checker_name_the_argument():
    """Under jaxtyping's import hook with beartype (see test_annotations.py) a malformed
    argument fails its annotation first, with a TypeCheckError (a TypeError) that names it."""
    done = subprocess.run([sys.executable, "-c", HOOK_WORKLOAD], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]
