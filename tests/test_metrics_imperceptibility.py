"""Imperceptibility metrics: ALD_p, ASS (SSIM) and PSD."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from skimage.metrics import structural_similarity as skimage_ssim

from robustjax.metrics import imperceptibility as im


def _pair(seed=0, shape=(3, 16, 18, 3), noise=0.1):
    rng = np.random.default_rng(seed)
    # smooth images with texture, so SSIM and PSD see both flat and busy regions
    grid = np.linspace(0, 1, shape[1])[:, None] * np.linspace(0, 1, shape[2])[None, :]
    x = 0.5 * grid[None, :, :, None] + 0.5 * rng.uniform(size=shape)
    x_adv = np.clip(x + rng.normal(0, noise, size=shape), 0, 1)
    return jnp.asarray(x, jnp.float32), jnp.asarray(x_adv, jnp.float32)


def test_lp_distortion_hand_computed():
    x = jnp.array([[[[0.2], [0.4]], [[0.0], [1.0]]]], jnp.float32)
    x_adv = jnp.array([[[[0.3], [0.4 + 1e-4]], [[0.0], [0.6]]]], jnp.float32)
    d = im.lp_distortion(x, x_adv)
    # 8-bit changes at 2 entries, 3 nonzero entries; the 1e-4 change is below half a grey level
    np.testing.assert_allclose(d.l0, [2 / 3], rtol=1e-6)
    np.testing.assert_allclose(d.l2, [np.sqrt(0.1**2 + 1e-8 + 0.4**2) / np.sqrt(0.04 + 0.16 + 1.0)], rtol=1e-5)
    np.testing.assert_allclose(d.linf, [0.4 / 1.0], rtol=1e-5)
    t = im.lp_distortion(x, x_adv, toolkit_compat=True)
    np.testing.assert_allclose(t.l0, [3 / 4], rtol=1e-6)  # every float change, over H W C
    np.testing.assert_allclose(t.linf, [0.4], rtol=1e-5)  # not normalised
    np.testing.assert_allclose(t.l2, d.l2, rtol=1e-6)


def test_averages_run_over_the_success_set_only():
    x, x_adv = _pair()
    success = jnp.array([True, False, True])
    per_example = im.lp_distortion(x, x_adv)
    ald = im.average_lp_distortion(x, x_adv, success)
    for field in ("l0", "l2", "linf"):
        np.testing.assert_allclose(getattr(ald, field), getattr(per_example, field)[jnp.array([0, 2])].mean(), rtol=1e-6)
    np.testing.assert_allclose(
        im.average_structural_similarity(x, x_adv, success), im.structural_similarity(x, x_adv)[jnp.array([0, 2])].mean(), rtol=1e-6
    )
    np.testing.assert_allclose(
        im.average_perturbation_sensitivity_distance(x, x_adv, success),
        im.perturbation_sensitivity_distance(x, x_adv)[jnp.array([0, 2])].mean(),
        rtol=1e-6,
    )


def test_identical_inputs():
    x, _ = _pair()
    success = jnp.ones(3, bool)
    assert all(np.all(v == 0) for v in im.average_lp_distortion(x, x, success))
    np.testing.assert_allclose(im.structural_similarity(x, x), 1.0, atol=1e-6)
    np.testing.assert_allclose(im.structural_similarity(x, x, toolkit_compat=True), 1.0, atol=1e-6)
    assert np.all(im.perturbation_sensitivity_distance(x, x) == 0)


def test_ssim_of_constant_images_is_closed_form():
    a, b = 0.3, 0.6
    x, y = jnp.full((1, 11, 11, 1), a, jnp.float32), jnp.full((1, 11, 11, 1), b, jnp.float32)
    c1 = (0.01 * 1.0) ** 2  # zero variances: the contrast-structure factor is C2 / C2 = 1
    np.testing.assert_allclose(im.structural_similarity(x, y), [(2 * a * b + c1) / (a * a + b * b + c1)], rtol=1e-5)


@pytest.mark.parametrize(("shape", "window"), [((3, 16, 18, 3), 11), ((2, 11, 23, 1), 11), ((3, 8, 8, 1), 7),
                                              ((2, 5, 9, 3), 3)])
def test_ssim_matches_skimage(shape, window):
    x, x_adv = _pair(1, shape)
    ours = im.structural_similarity(x, x_adv, window=window)
    ref = [
        skimage_ssim(np.float64(a), np.float64(b), gaussian_weights=True, sigma=1.5, win_size=window,
                     use_sample_covariance=False, data_range=1.0, channel_axis=-1)
        for a, b in zip(x, x_adv)
    ]
    # float32 local moments (E[x^2] - E[x]^2 on [0, 1] values) against float64: ~1e-6.
    np.testing.assert_allclose(ours, ref, atol=2e-5)


def test_ssim_toolkit_compat_matches_skimage_with_aisafety_settings():
    x, x_adv = _pair(2, (2, 12, 14, 3))
    ours = im.structural_similarity(x, x_adv, toolkit_compat=True)
    # skimage 0.17's compare_ssim defaults: 7x7 uniform window, sample covariance, and
    # data_range 2 (the float range) on round(255 x).
    ref = [skimage_ssim(np.round(255 * np.float64(a)), np.round(255 * np.float64(b)), data_range=2, channel_axis=-1)
           for a, b in zip(x, x_adv)]
    # float32 moments of 0..255 values: cancellation error ~255^2 * 6e-8 in variances of ~1e3.
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_psd_hand_computed():
    x = jnp.array([0.1, 0.5, 0.2, 0.7, 0.4, 0.9, 0.3, 0.8, 0.6], jnp.float32).reshape(1, 3, 3, 1)
    x_adv = x.at[0, 1, 1, 0].add(0.05)  # only the centre changes; its 3x3 neighbourhood is x
    std = np.std(np.asarray(x))
    np.testing.assert_allclose(im.perturbation_sensitivity_distance(x, x_adv), [0.05 / (std + 1 / 255)], rtol=1e-4)
    np.testing.assert_allclose(im.perturbation_sensitivity_distance(x, x_adv, eps=0.5), [0.05 / (std + 0.5)], rtol=1e-4)
    np.testing.assert_allclose(im.perturbation_sensitivity_distance(x, x_adv, toolkit_compat=True), [0.05 * std], rtol=1e-4)


def _psd_loops(x, x_adv, eps, toolkit_compat):
    """AISafety's per-pixel loop (np.pad 'reflect', population std), with either weight."""
    out = []
    for a, b in zip(np.float64(x), np.float64(x_adv)):
        total = 0.0
        for c in range(a.shape[-1]):
            padded = np.pad(a[..., c], 1, mode="reflect")
            for h in range(a.shape[0]):
                for w in range(a.shape[1]):
                    std = np.std(padded[h : h + 3, w : w + 3])
                    total += abs(b[h, w, c] - a[h, w, c]) * (std if toolkit_compat else 1 / (std + eps))
        out.append(total)
    return out


@pytest.mark.parametrize("toolkit_compat", [False, True])
def test_psd_matches_pixel_loop(toolkit_compat):
    x, x_adv = _pair(3, (2, 5, 6, 2))
    ours = im.perturbation_sensitivity_distance(x, x_adv, toolkit_compat=toolkit_compat)
    # float32 sums of 60 terms against float64: 1e-5 relative.
    np.testing.assert_allclose(ours, _psd_loops(x, x_adv, 1 / 255, toolkit_compat), rtol=1e-5)


def _values(result):
    """A metric result (a scalar, a Distortion or a compute() dict) as one flat array."""
    if isinstance(result, dict):
        result = tuple(result.values())
    return jnp.atleast_1d(jnp.stack(result) if isinstance(result, tuple) else result)


def _cases():
    return [
        (im.AverageStructuralSimilarity, im.average_structural_similarity, {}),
        (im.AverageStructuralSimilarity, im.average_structural_similarity, {"toolkit_compat": True}),
        (im.PerturbationSensitivityDistance, im.average_perturbation_sensitivity_distance, {}),
        (im.PerturbationSensitivityDistance, im.average_perturbation_sensitivity_distance, {"toolkit_compat": True}),
        (im.AverageLpDistortion, im.average_lp_distortion, {}),
        (im.AverageLpDistortion, im.average_lp_distortion, {"toolkit_compat": True}),
    ]


def test_streaming_equals_one_shot_and_merge_order_is_free():
    x, x_adv = _pair(4, (7, 12, 12, 3))
    success = jnp.array([True, False, True, True, False, True, True])
    cuts = [slice(0, 2), slice(2, 5), slice(5, 7)]
    for accumulator, one_shot, kwargs in _cases():
        whole = _values(one_shot(x, x_adv, success, **kwargs))
        a, b, c = (accumulator.empty(**kwargs).update(x[s], x_adv[s], success[s]) for s in cuts)
        for merged in (a.merge(b).merge(c), c.merge(b).merge(a), b.merge(a.merge(c))):
            # float32 sums of <= 7 terms in different orders.
            np.testing.assert_allclose(_values(merged.compute()), whole, rtol=1e-6, err_msg=one_shot.__name__)


def test_jit_equals_eager():
    x, x_adv = _pair(5, (3, 12, 12, 3))
    success = jnp.array([True, True, False])
    for _, one_shot, kwargs in _cases():
        jitted = jax.jit(lambda *a, f=one_shot, kw=kwargs: f(*a, **kw))(x, x_adv, success)
        with jax.disable_jit():
            eager = one_shot(x, x_adv, success, **kwargs)
        # XLA fusion may reorder float32 reductions: a few ulp.
        np.testing.assert_allclose(_values(jitted), _values(eager), rtol=2e-6, err_msg=one_shot.__name__)


def test_ssim_and_distortion_are_differentiable():
    x, x_adv = _pair(6, (1, 12, 12, 1))
    for f in (lambda v: im.structural_similarity(x, v).sum(), lambda v: im.lp_distortion(x, v).l2.sum()):
        grad = jax.grad(f)(x_adv)
        assert np.isfinite(grad).all() and np.abs(grad).sum() > 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, y, s: im.average_lp_distortion(x, y[:, :-1], s), "same shape"),
        (lambda x, y, s: im.average_lp_distortion(x[:0], y[:0], s[:0]), "empty batch"),
        (lambda x, y, s: im.average_structural_similarity(x, y.at[0, 0, 0, 0].set(jnp.nan), s), "NaN"),
        (lambda x, y, s: im.average_structural_similarity(x, y + 1, s), r"\[0, 1\]"),
        (lambda x, y, s: im.average_structural_similarity(x, y, s[:2]), "success must be a bool"),
        (lambda x, y, s: im.average_structural_similarity(x, y, s.astype(jnp.int32)), "success must be a bool"),
        (lambda x, y, s: im.average_structural_similarity(x[:, :10], y[:, :10], s), "at least 11 x 11"),
        (lambda x, y, s: im.average_perturbation_sensitivity_distance(x, y, jnp.zeros(3, bool)), "success set S is empty"),
        (lambda x, y, s: im.average_perturbation_sensitivity_distance(x, y, s, eps=0.0), "eps"),
        (lambda x, y, s: im.average_lp_distortion(x.at[1].set(0.001), y, s), "all 0 at 8 bits"),
        (lambda x, y, s: im.average_lp_distortion((x * 255).astype(jnp.uint8), y, s), "floating-point"),
        (lambda x, y, s: im.AverageStructuralSimilarity.empty(window=4), "window must be odd"),
        (lambda x, y, s: im.PerturbationSensitivityDistance.empty(eps=-1.0), "eps"),
        (lambda x, y, s: im.AverageLpDistortion.empty().compute(), "ALD is undefined"),
    ],
)
def test_bad_input(call, message):
    x, x_adv = _pair(7, (3, 12, 12, 3))
    with pytest.raises((ValueError, TypeError), match=message):
        call(x, x_adv, jnp.ones(3, bool))
