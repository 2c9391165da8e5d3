"""Pixel noise and blur corruptions against the ``imagecorruptions`` reference.

The reference takes uint8 H x W x 3 images; we call its corruption functions directly (they
return float images in [0, 255] before the final uint8 cast) and compare with our output
on the same image scaled to [0, 1]. ``imagecorruptions`` 1.1.2 calls
``skimage.filters.gaussian(..., multichannel=True)``, an argument current scikit-image no
longer has; the ``reference`` fixture swaps in an adapter that maps it to
``channel_axis=-1`` and changes nothing else.
"""

from __future__ import annotations

import functools
import math
import warnings

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import skimage.data
import skimage.filters
import skimage.metrics
from PIL import Image

from robustjax import noise
from robustjax.noise import blur
from tests.helpers import count_compiles

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # pkg_resources deprecation, inside imagecorruptions
    ic = pytest.importorskip("imagecorruptions.corruptions")

PIXEL_NOISE = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise")
BLURS = ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "gaussian_blur")

# Float32 FFT filtering against the reference's float64 filters: measured max differences
# are ~3e-7; 1e-5 (0.0026 / 255) leaves room for other BLAS/FFT builds and is still far
# below one 8-bit level.
ATOL = 1e-5


@functools.cache
def image(size: int) -> np.ndarray:
    """A natural uint8 RGB image (scikit-image's astronaut), size x size."""
    return cv2.resize(skimage.data.astronaut(), (size, size), interpolation=cv2.INTER_AREA)


BATCH = 4  # every test uses batches of this many images, so they share compiled programs


def as_batch(img: np.ndarray) -> jax.Array:
    """``BATCH`` copies of ``img`` as float32 in [0, 1]."""
    return jnp.asarray(np.repeat(img[None], BATCH, axis=0) / 255.0, jnp.float32)


@pytest.fixture
def reference(monkeypatch):
    """``imagecorruptions.corruptions`` with its gaussian call adapted to current scikit-image."""
    skimage_gaussian = skimage.filters.gaussian

    def gaussian(image, sigma=1, multichannel=False, **kwargs):
        return skimage_gaussian(
            image, sigma=sigma, channel_axis=-1 if multichannel else None, **kwargs
        )

    monkeypatch.setattr(ic, "gaussian", gaussian)
    return ic


motion_blur_at_angle = jax.jit(blur.motion_blur_at_angle, static_argnums=(1, 2))
glass_blur_with_offsets = jax.jit(blur.glass_blur_with_offsets, static_argnums=(1, 2))


def constants(name: str, preset: str, severity: int):
    return noise.get(name).severity_constants(severity, preset)


# ----------------------------------------------------------------------------- constants

# make_cifar_c.py (hendrycks/robustness, ImageNet-C/create_c/make_cifar_c.py), transcribed.
CIFAR_10_C = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500, 250, 100, 75, 50),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "speckle_noise": (0.06, 0.1, 0.12, 0.16, 0.2),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1),
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
    "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
    "zoom_blur": tuple(tuple(np.arange(1, stop, 0.01)) for stop in (1.06, 1.11, 1.16, 1.21, 1.26)),
}


@pytest.mark.parametrize("name", sorted(CIFAR_10_C))
def test_cifar_constants_are_those_of_cifar_10_c(name):
    assert noise.get(name).constants["cifar"] == CIFAR_10_C[name]


# ----------------------------------------------------------------------------- deterministic blurs


@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("severity", [1, 3, 5])
@pytest.mark.parametrize("name", ["defocus_blur", "gaussian_blur", "zoom_blur"])
def test_deterministic_blur_matches_reference(reference, name, severity, size):
    img = image(size)
    expected = getattr(reference, name)(Image.fromarray(img), severity) / 255
    got = noise.corrupt(as_batch(img), name, severity, jax.random.key(0), preset="imagenet")[0]
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


def reference_with_constants(name: str, img: np.ndarray, c) -> np.ndarray:
    """The reference operation with explicit constants, built from ``imagecorruptions``'
    own helpers (``make_cifar_c.py`` runs the same operations with the CIFAR constants)."""
    x = img / 255.0
    if name == "defocus_blur":
        kernel = ic.disk(*c)
        return np.stack([cv2.filter2D(x[..., d], -1, kernel) for d in range(3)], axis=-1)
    if name == "gaussian_blur":
        return skimage.filters.gaussian(x, sigma=c, channel_axis=-1)
    if name == "zoom_blur":
        x = x.astype(np.float32)
        zooms = [ic.clipped_zoom(x, z)[: x.shape[0], : x.shape[1]] for z in c]
        return (x + np.sum(zooms, axis=0)) / (len(c) + 1)
    raise ValueError(name)


@pytest.mark.parametrize("name", ["defocus_blur", "gaussian_blur", "zoom_blur"])
def test_deterministic_blur_with_cifar_constants(name):
    img = image(32)
    x = as_batch(img)
    for severity in noise.SEVERITIES:
        expected = reference_with_constants(name, img, constants(name, "cifar", severity))
        got = noise.corrupt(x, name, severity, jax.random.key(0), preset="cifar")[0]
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0, err_msg=f"severity {severity}")


def test_disk_kernel_equals_reference():
    for c in [(3, 0.1), (10, 0.5), (0.3, 0.4), (1.5, 0.1)]:
        np.testing.assert_allclose(blur.disk_kernel(*c), ic.disk(*c), atol=1e-8, rtol=0)


# ----------------------------------------------------------------------------- motion blur


@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("angle", [0.0, 23.7, -38.2, 45.0])
@pytest.mark.parametrize("severity", [1, 5])
def test_motion_blur_at_fixed_angle_matches_reference(monkeypatch, severity, angle, size):
    img = image(size)
    monkeypatch.setattr(
        np.random, "uniform", lambda *args, **kwargs: angle
    )  # the reference's angle
    expected = ic.motion_blur(Image.fromarray(img), severity) / 255
    radius, sigma = constants("motion_blur", "imagenet", severity)
    got = motion_blur_at_angle(as_batch(img), radius, sigma, jnp.full(BATCH, angle))[0]
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


def test_motion_blur_with_cifar_constants():
    img = image(32)
    for severity in noise.SEVERITIES:
        radius, sigma = constants("motion_blur", "cifar", severity)
        expected = ic._motion_blur(img, radius, sigma, -17.0) / 255
        got = motion_blur_at_angle(as_batch(img), radius, sigma, jnp.full(BATCH, -17.0))[0]
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0, err_msg=f"severity {severity}")


def test_motion_blur_draws_one_angle_per_image_in_the_reference_range():
    x = as_batch(image(32))
    key = jax.random.key(3)
    angles = jax.random.uniform(key, (BATCH,), minval=-45.0, maxval=45.0)
    radius, sigma = constants("motion_blur", "cifar", 2)
    got = noise.corrupt(x, "motion_blur", 2, key, preset="cifar")
    np.testing.assert_allclose(got, motion_blur_at_angle(x, radius, sigma, angles), atol=1e-6)
    assert len({np.asarray(g).tobytes() for g in got}) == BATCH  # one angle per image


# ----------------------------------------------------------------------------- glass blur


def reference_offsets(seed: int, size: int, max_delta: int, passes: int) -> np.ndarray:
    """Replays the reference's draws: per pass, pixels bottom-up and right to left,
    ``dx, dy = np.random.randint(-max_delta, max_delta, size=2)``. Shape (passes, 1, H, W, 2)."""
    rng = np.random.RandomState(seed)
    offsets = np.zeros((passes, 1, size, size, 2), np.int32)
    for k in range(passes):
        for h in range(size - max_delta, max_delta, -1):
            for w in range(size - max_delta, max_delta, -1):
                dx, dy = rng.randint(-max_delta, max_delta, size=(2,))
                offsets[k, 0, h, w] = dy, dx
    return offsets


@pytest.mark.parametrize(("size", "severities"), [(32, (1, 2, 3, 4, 5)), (64, (2, 5))])
def test_glass_blur_equals_reference_given_the_same_draws(reference, size, severities):
    img = image(size)
    for severity in severities:
        sigma, max_delta, passes = constants("glass_blur", "imagenet", severity)
        offsets = reference_offsets(severity, size, max_delta, passes)
        np.random.seed(severity)
        expected = reference.glass_blur(Image.fromarray(img), severity) / 255
        offsets = jnp.asarray(np.repeat(offsets, BATCH, axis=1))
        diff = np.abs(
            glass_blur_with_offsets(as_batch(img), sigma, max_delta, offsets)[0] - expected
        )
        # Where the first blur lands within float32 rounding (~1e-7) of an 8-bit level, the
        # reference's uint8 truncation can differ by one level at that pixel (then blurred):
        # rare, and never more than 1/255.
        assert diff.max() <= 1 / 255 and np.mean(diff > ATOL) < 0.01, (severity, diff.max())


def test_glass_shuffle_equals_the_sequential_loop():
    """Pointer jumping gives the reference loop's result (its swap statement, verbatim in
    effect, on an H x W x 3 array) for random offsets, on a non-square image."""
    height, width, max_delta = 23, 31, 3
    rng = np.random.default_rng(0)
    offsets = rng.integers(-max_delta, max_delta, size=(2, height, width, 2))
    pixels = rng.random((2, height, width, 3)).astype(np.float32)
    for b in range(2):
        x = pixels[b].copy()
        for h in range(height - max_delta, max_delta, -1):
            for w in range(width - max_delta, max_delta, -1):
                dy, dx = offsets[b, h, w]
                x[h, w], x[h + dy, w + dx] = x[h + dy, w + dx], x[h, w]
        got = blur.glass_shuffle(jnp.asarray(pixels), jnp.asarray(offsets, jnp.int32), max_delta)[b]
        np.testing.assert_array_equal(got, x)


def glass_statistics(clean: np.ndarray, corrupted: np.ndarray) -> tuple[float, float]:
    """Mean absolute distance and SSIM to the clean image."""
    ssim = skimage.metrics.structural_similarity(clean, corrupted, channel_axis=-1, data_range=1.0)
    return float(np.abs(corrupted - clean).mean()), float(ssim)


def test_glass_blur_matches_reference_in_distribution(reference):
    """Our keyed draws against the reference's own over several seeds: distance and SSIM
    to the clean image within the spread of the two (4 standard deviations)."""
    img, severity, seeds = image(64), 4, BATCH
    clean = img / 255.0
    ref = []
    for seed in range(seeds):
        np.random.seed(seed)
        ref.append(
            glass_statistics(clean, reference.glass_blur(Image.fromarray(img), severity) / 255)
        )
    out = np.asarray(
        noise.corrupt(as_batch(img), "glass_blur", severity, jax.random.key(0), preset="imagenet")
    )
    ours = [glass_statistics(clean, o.astype(np.float64)) for o in out]
    ref, ours = np.array(ref), np.array(ours)
    spread = np.hypot(ref.std(0), ours.std(0))
    assert np.all(np.abs(ref.mean(0) - ours.mean(0)) < 4 * spread), (
        ref.mean(0),
        ours.mean(0),
        spread,
    )


# ----------------------------------------------------------------------------- pixel noise


def std_standard_error(sample: np.ndarray) -> float:
    centred = sample - sample.mean()
    variance = np.mean(centred**2)
    return math.sqrt(max(np.mean(centred**4) - variance**2, 0.0) / sample.size) / (2 * math.sqrt(variance))


@pytest.mark.parametrize("severity", [1, 3, 5])
@pytest.mark.parametrize("name", PIXEL_NOISE)
def test_pixel_noise_matches_reference_in_distribution(reference, name, severity):
    """Noise (output minus clean) over 4 draws of a 64 x 64 RGB image (49,152 values each):
    equal means and standard deviations within 5 standard errors, and a two-sample
    Kolmogorov-Smirnov test that does not reject at the 0.1% level. The standard error of
    the standard deviation uses the fourth moment, sqrt((m4 - s^4) / n) / (2 s): impulse
    noise is far from normal, and the normal-theory s / sqrt(2 n) understates it."""
    img, draws = image(64), BATCH
    clean = img / 255.0
    ref_noise = []
    for seed in range(draws):
        np.random.seed(seed)
        ref_noise.append(getattr(reference, name)(Image.fromarray(img), severity) / 255 - clean)
    ref_noise = np.ravel(ref_noise)
    x = as_batch(img)
    out = noise.corrupt(x, name, severity, jax.random.key(severity), preset="imagenet")
    our_noise = np.asarray(out - x, np.float64).ravel()  # untouched values give exactly 0
    n = ref_noise.size
    mean_se = math.sqrt((ref_noise.var() + our_noise.var()) / n)
    assert abs(ref_noise.mean() - our_noise.mean()) < 5 * mean_se
    std_se = math.hypot(*(std_standard_error(sample) for sample in (ref_noise, our_noise)))
    assert abs(ref_noise.std() - our_noise.std()) < 5 * std_se + 1e-4
    assert scipy.stats.ks_2samp(ref_noise, our_noise).pvalue > 1e-3


def test_shot_noise_is_poisson_for_small_and_large_rates():
    """Constant images, rates on both sides of the inversion / rejection split: counts
    ``photons * out`` have Poisson mean and variance, and the Poisson distribution
    (chi-square test over the bins with expected count >= 5)."""
    photons = 500  # CIFAR severity 1; counts stay far below the clip at 500
    for level in (0.003, 0.019, 0.021, 0.09):  # rates 1.5, 9.5, 10.5, 45
        rate = photons * level
        x = jnp.full((BATCH, 32, 32, 3), level, jnp.float32)
        out = noise.corrupt(x, "shot_noise", 1, jax.random.key(1), preset="cifar")
        counts = np.rint(np.asarray(out) * photons)
        counts = counts.ravel().astype(int)
        n = counts.size
        assert abs(counts.mean() - rate) < 5 * math.sqrt(rate / n)
        assert abs(counts.var() - rate) < 5 * rate * math.sqrt(2 / n)
        support = np.arange(int(rate + 8 * math.sqrt(rate) + 10))
        expected = scipy.stats.poisson.pmf(support, rate) * n
        keep = expected >= 5
        observed = np.bincount(counts, minlength=support.size)[: support.size][keep]
        expected = expected[keep] * observed.sum() / expected[keep].sum()
        assert scipy.stats.chisquare(observed, expected).pvalue > 1e-3, rate


# ----------------------------------------------------------------------------- contract


# Severity pairs (s, s + 1) whose published constants do not increase the mean distance to
# the clean image, so the check there is only that severity 5 is further than severity 1.
# Glass blur: its shuffle moves pixels, a stronger blur then averages them back (CIFAR
# distances 0.0824, 0.0826, 0.0821, 0.128, 0.122; ImageNet at 64 x 64: 0.093, 0.096, 0.140,
# 0.136, 0.148; the same draws give the same numbers in the reference, see the glass tests).
# CIFAR motion blur: severities 3 and 4, (radius, sigma) = (6, 2) and (8, 2), differ only in
# taps weighing below 2e-8.
NOT_INCREASING = {
    ("glass_blur", "cifar"): {(2, 3), (4, 5)},
    ("glass_blur", "imagenet"): {(3, 4)},
    ("motion_blur", "cifar"): {(3, 4)},
}


@pytest.mark.parametrize(("preset", "size"), [("cifar", 32), ("imagenet", 64)])
@pytest.mark.parametrize("name", PIXEL_NOISE + BLURS)
def test_corruption_contract(name, preset, size):
    """Range, shape and dtype; severity monotone in mean distance to the clean image; same key,
    same output; a new key changes stochastic ones and does not recompile; grey images work."""
    x = as_batch(image(size))
    key, other = jax.random.key(0), jax.random.key(1)
    distances = []
    for severity in noise.SEVERITIES:
        out = noise.corrupt(x, name, severity, key, preset=preset)
        assert out.shape == x.shape and out.dtype == jnp.float32
        assert 0.0 <= float(out.min()) and float(out.max()) <= 1.0
        distances.append(float(jnp.abs(out - x).mean()))
    allowed = NOT_INCREASING.get((name, preset), set())
    increasing = [(s, s + 1) for s in noise.SEVERITIES[:-1] if distances[s - 1] < distances[s]]
    assert set(zip(noise.SEVERITIES, noise.SEVERITIES[1:])) - set(increasing) <= allowed, distances
    assert distances[0] < distances[-1]
    with count_compiles() as compiles:
        again = noise.corrupt(x, name, 5, key, preset=preset)
        changed = noise.corrupt(x, name, 5, other, preset=preset)
    assert compiles[0] == 0
    np.testing.assert_array_equal(again, out)
    assert noise.get(name).stochastic == (not np.array_equal(changed, out))
    if preset == "cifar":
        grey = noise.corrupt(x[..., :1], name, 3, key, preset=preset)
        assert (
            grey.shape == x[..., :1].shape and 0.0 <= float(grey.min()) and float(grey.max()) <= 1.0
        )


def test_families():
    assert set(noise.names("noise")) >= {"gaussian_noise", "shot_noise", "impulse_noise"}
    assert set(noise.names("blur")) >= {"defocus_blur", "glass_blur", "motion_blur", "zoom_blur"}
    assert set(noise.names("extra")) >= {"speckle_noise", "gaussian_blur"}
