"""Regression tests for defects an independent check found in the metrics and pixelate
(issue 17): masked sums that let excluded examples in, signed-zero ties in top-k, ALD_0's
denominator, reduced-precision matrix products, and documentation that claimed more."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from skimage import data

import robustjax.noise as noise
from robustjax import metrics
from robustjax.evaluation import metric_suite, plan_from_dict
from robustjax.metrics import calibration as cal
from robustjax.metrics import coverage
from robustjax.metrics import imperceptibility as im
from robustjax.noise import digital
from tests.test_metrics_calibration import hendrycks_calib_err

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ic = pytest.importorskip("imagecorruptions.corruptions")


def _images(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=shape).astype(np.float32)
    return x, np.clip(x + rng.normal(0, 0.05, shape), 0, 1).astype(np.float32)


# ----------------------------------------------------------------------------- ALD over S


def test_ald_ignores_an_all_zero_image_outside_the_success_set():
    x, x_adv = _images((3, 6, 6, 1))
    x[0], x_adv[0] = 0.0, 0.0  # a blank image whose attack failed: outside S
    success = np.array([False, True, True])
    expected = [np.mean(v) for v in im.lp_distortion(x[1:], x_adv[1:])]
    np.testing.assert_allclose(im.average_lp_distortion(x, x_adv, success), expected, rtol=1e-6)
    jitted = jax.jit(lambda *a: im.AverageLpDistortion.empty().update(*a))(x, x_adv, success).compute()
    np.testing.assert_allclose([jitted["ald_0"], jitted["ald_2"], jitted["ald_inf"]], expected, rtol=1e-6)
    with pytest.raises(ValueError, match=r"x\[0\] \(in the success set\)"):
        im.average_lp_distortion(x, x_adv, np.ones(3, bool))


# ----------------------------------------------------------------------------- top-k ties


def test_top_k_ties_between_signed_zeros_go_to_the_lower_index():
    # GELU(x) is -0.0 for tiny negative x: -0.0 and +0.0 tie, so neuron 0 wins.
    values = {"layer": jnp.array([[-0.0, 0.0, -1.0], [0.0, -0.0, -1.0]], jnp.float32)}
    covered = coverage.TopKCoverage.empty({"layer": 3}, k=1).update(values).covered["layer"]
    np.testing.assert_array_equal(covered, [True, False, False])
    assert int(coverage.tknp(values, k=1)) == 1


# ----------------------------------------------------------------------------- ALD_0


def test_ald_0_denominator_option():
    x = np.array([[[[0.2], [0.4]], [[0.0], [1.0]]]], np.float32)
    x_adv = np.array([[[[0.3], [0.4 + 1e-4]], [[0.0], [0.6]]]], np.float32)
    # 8-bit changes at 2 entries; 3 nonzero entries; 4 entries. Toolkit: 3 float changes.
    for kwargs, l0 in [({}, 2 / 3), ({"l0_denominator": "size"}, 2 / 4), ({"toolkit_compat": True}, 3 / 4),
                       ({"toolkit_compat": True, "l0_denominator": "nonzero"}, 3 / 3)]:
        np.testing.assert_allclose(im.lp_distortion(x, x_adv, **kwargs).l0, [l0], rtol=1e-6, err_msg=str(kwargs))
        np.testing.assert_allclose(im.average_lp_distortion(x, x_adv, np.ones(1, bool), **kwargs).l0, l0, rtol=1e-6)
    assert im.AverageLpDistortion.empty(toolkit_compat=True).l0_denominator == "size"
    with pytest.raises(ValueError, match="l0_denominator must be one of"):
        im.AverageLpDistortion.empty(l0_denominator="pixels")


def test_ald_0_denominator_in_plans_and_report_settings():
    for raw, recorded in [({}, "nonzero"), ({"toolkit_compat": True}, "size"), ({"ald_l0_denominator": "size"}, "size")]:
        run = plan_from_dict({"metrics": raw}).metrics
        settings = metric_suite._settings(run, {"dense": 4}, None, None, 10, 11)
        assert settings["ALD_0"]["l0_denominator"] == recorded, raw
    with pytest.raises(ValueError, match="ald_l0_denominator must be one of"):
        plan_from_dict({"metrics": {"ald_l0_denominator": "chw"}})


# ----------------------------------------------------------------------------- precision


def _dot_precisions(fn, *args) -> list:
    """The precision of every matrix product and convolution in ``fn``'s jaxpr."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
                found.append(eqn.params["precision"])
            for param in eqn.params.values():
                for sub in param if isinstance(param, tuple | list) else (param,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def _full_precision(precision) -> bool:
    return precision is not None and all(p == jax.lax.Precision.HIGHEST for p in np.atleast_1d(precision))


def test_masked_sums_and_pixelate_run_in_full_precision():
    x, x_adv = _images((2, 11, 11, 1))
    success = np.array([True, False])
    for acc in (im.AverageLpDistortion.empty(), im.AverageStructuralSimilarity.empty(),
                im.PerturbationSensitivityDistance.empty()):
        precisions = _dot_precisions(lambda a, b, s, acc=acc: acc.update(a, b, s).total, x, x_adv, success)
        assert all(map(_full_precision, precisions)), (type(acc).__name__, precisions)
    precisions = _dot_precisions(lambda a: digital.pixelate(a, 0.5, None), x)
    assert precisions and all(map(_full_precision, precisions)), precisions


# ----------------------------------------------------------------------------- what the docs claim


def test_rms_equals_hendrycks_calib_err_only_when_skipping_the_last_bin():
    rng = np.random.default_rng(0)
    confidence = rng.permutation(np.linspace(0.3, 0.99, 300)).astype(np.float32)
    correct = rng.random(300) < 0.5  # poorly calibrated: every bin has a gap
    hendrycks = hendrycks_calib_err(confidence, correct, beta=100, skip_last_bin=True)  # the original skips it
    skipped = cal.rms_calibration_error(confidence, correct, beta=100, skip_last_bin=True)
    np.testing.assert_allclose(skipped, hendrycks, rtol=1e-5)
    assert abs(float(cal.rms_calibration_error(confidence, correct, beta=100)) - hendrycks) > 1e-3


def _photo(size: int) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR))
                     for im in (data.astronaut(), data.chelsea())])


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_pixelate_is_one_level_from_imagecorruptions_on_a_share_of_pixels(severity):
    images = _photo(64)
    x = jnp.asarray(images / 255.0, jnp.float32)
    ours = np.asarray(noise.corrupt(x, "pixelate", severity, jax.random.key(0), preset="imagenet")) * 255
    ref = np.stack([np.asarray(ic.pixelate(Image.fromarray(image), severity)) for image in images])
    assert np.abs(ours - ref).max() <= 1 + 1e-3
    assert 0.13 <= np.mean(np.round(ours) != ref) <= 0.45  # as 8-bit images
    # The cause: Pillow rounds (half up) to 8 bits after each pass of its down-scale. Our
    # resampling matrices with that rounding give imagecorruptions' result exactly.
    small_size = int(64 * noise.get("pixelate").severity_constants(severity, "imagenet"))
    down = digital.linear_operator_matrix(digital._pil_resize_columns, 64, small_size, Image.BOX)
    up = digital.linear_operator_matrix(digital._pil_resize_columns, small_size, 64, Image.NEAREST)
    to_8_bits = lambda v: np.floor(v + 0.5)  # noqa: E731
    small = to_8_bits(down @ to_8_bits(np.moveaxis(images, -1, 1).astype(np.float64) @ down.T))
    np.testing.assert_array_equal(np.moveaxis(up @ small @ up.T, 1, -1), ref)


def test_imagecorruptions_agreement_below_65_px_needs_the_imagenet_preset():
    images = _photo(32)
    x = jnp.asarray(images / 255.0, jnp.float32)
    ref = np.stack([ic.contrast(image, 3) for image in images]) / 255.0
    default = np.asarray(noise.corrupt(x, "contrast", 3, jax.random.key(0)))  # "cifar" at 32 px
    imagenet = np.asarray(noise.corrupt(x, "contrast", 3, jax.random.key(0), preset="imagenet"))
    assert np.abs(default - ref).max() > 0.05
    np.testing.assert_allclose(imagenet, ref, atol=1e-5)


def test_mean_corruption_error_is_the_plain_mean_not_mce():
    errors = np.array([[0.2, 0.4], [0.5, 0.7]])
    baseline = np.array([[0.5, 0.5], [0.6, 0.6]])
    np.testing.assert_allclose(metrics.mean_corruption_error(errors), [0.3, 0.6])
    np.testing.assert_allclose(np.mean(metrics.corruption_error(errors, baseline)), (0.6 / 1.0 + 1.2 / 1.2) / 2)
