"""ImageNet-P sequences and flip probability: reference conformance and closed forms.

References: hendrycks/robustness ``ImageNet-P/create_p/make_imagenet_p.py`` and
``make_cifar_p.py`` (frame formulas) and ``ImageNet-P/test.py`` (``flip_prob`` and
``ranking_dist``), ported below as loops; OpenCV, scikit-image, scipy, torchvision and
``imagecorruptions`` for the image operations the generators call.
"""

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
from PIL import Image
from scipy.stats import rankdata
from skimage import color as skcolor
from skimage.filters import gaussian as sk_gaussian

import robustjax as rj
from robustjax.noise import flip
from robustjax.noise import sequences as seq

RNG = np.random.default_rng(0)
warp = jax.jit(seq._warp)


def smooth_images(b=2, h=32, w=32, c=3, seed=0):
    """Smooth random images, so interpolation differences stay small."""
    noise = np.random.default_rng(seed).uniform(size=(b, h, w, c))
    return np.clip(ndi.gaussian_filter(noise, (0, 2, 2, 0)) * 3 - 1, 0, 1).astype(np.float32)


# ------------------------------------------------------------------- frame parameters

# Transcribed from the reference generators: frame index i -> parameter.
REFERENCE_FORMULAS = {
    ("motion_blur", "imagenet"): (31, lambda i: (i - 30) * 4),
    ("motion_blur", "cifar"): (21, lambda i: (i - 20) * 9),
    ("zoom_blur", "imagenet"): (31, lambda i: 1 + 0.004 * i),
    ("gaussian_blur", "imagenet"): (31, lambda i: 0.25 + 0.035 * i),
    ("gaussian_blur", "cifar"): (31, lambda i: 0.3 + 0.015 * i),
    ("snow", "imagenet"): (31, lambda i: i * 4 - 150),
    ("brightness", "imagenet"): (31, lambda i: (i - 15) * 2 / 100.0),
    ("brightness", "cifar"): (31, lambda i: (i - 15) * 1.5 / 100.0),
    ("translate", "imagenet"): (41, lambda i: i - 20),
    ("translate", "cifar"): (16, lambda i: i - 7),
    ("rotate", "imagenet"): (31, lambda i: i - 15),
    ("tilt", "imagenet"): (31, lambda i: i - 15),
    ("tilt", "cifar"): (31, lambda i: 0.75 * (i - 15)),
    ("scale", "imagenet"): (31, lambda i: (i * 2.5 + 40) / 100.0),
    ("scale", "cifar"): (31, lambda i: (i * 2 + 70) / 100.0),
    ("shear", "cifar"): (31, lambda i: i - 15),
}
REFERENCE_NOISE = {
    ("gaussian_noise", "imagenet"): (0.03, 0.05, 0.08), ("gaussian_noise", "cifar"): (0.02, 0.04, 0.06),
    ("shot_noise", "imagenet"): (300, 120, 60), ("shot_noise", "cifar"): (700, 400, 200),
    ("speckle_noise", "imagenet"): (0.05, 0.10, 0.15), ("speckle_noise", "cifar"): (0.05, 0.07, 0.10),
}


@pytest.mark.parametrize("name,preset", sorted(REFERENCE_FORMULAS))
def test_frame_parameters_match_reference_scripts(name, preset):
    length, formula = REFERENCE_FORMULAS[name, preset]
    assert seq.default_length(name, preset) == length
    expected = [formula(i) for i in range(length)]
    np.testing.assert_allclose(seq.frame_parameters(name, preset=preset), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,preset", sorted(REFERENCE_NOISE))
def test_noise_strength_matches_reference_scripts(name, preset):
    for difficulty, strength in enumerate(REFERENCE_NOISE[name, preset], start=1):
        params = seq.frame_parameters(name, preset=preset, difficulty=difficulty)
        assert params.shape == (31,) and params[0] == 0  # clean first frame, then 30 draws
        np.testing.assert_array_equal(params[1:], strength)


# -------------------------------------------------------- contract, for every perturbation

@pytest.mark.parametrize("name", seq.names())
def test_sequence_contract(name):
    perturbation = seq.get(name)
    assert perturbation.name == name and name in seq.names(perturbation.family)
    x = jnp.asarray(smooth_images(2, 16, 16, 3))
    key0, key1 = jax.random.key(0), jax.random.key(1)
    a = seq.perturbation_sequence(x, name, key0, length=6)
    compiled = seq.sequence_frames._cache_size()
    b = seq.perturbation_sequence(x, name, key0, length=6)
    c = seq.perturbation_sequence(x, name, key1, length=6)
    assert seq.sequence_frames._cache_size() == compiled, "a new key recompiled"
    assert a.shape == (2, 6, 16, 16, 3) and a.dtype == jnp.float32
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0 and not bool(jnp.isnan(a).any())
    np.testing.assert_array_equal(a, b)
    stochastic = name in seq.names("noise") + ["snow", "spatter"]
    assert bool(jnp.any(a != c)) == stochastic
    if seq.is_noise(name):  # the first frame is the clean image
        np.testing.assert_array_equal(a[:, 0], x)


def test_full_length_and_grayscale():
    x = jnp.asarray(smooth_images(1, 32, 32, 1))
    frames = seq.perturbation_sequence(x, "translate", jax.random.key(0))
    assert frames.shape == (1, 16, 32, 32, 1)  # CIFAR-10-P translate has 16 frames


# ------------------------------------------------------------ closed forms and references

def test_translate_by_integer_is_a_shift_with_zero_fill():
    x = smooth_images(1, 16, 16, 3)
    frames = np.asarray(seq.perturbation_sequence(jnp.asarray(x), "translate", jax.random.key(0)))
    for i, shift in enumerate(seq.frame_parameters("translate", preset="cifar").astype(int)):
        expected = np.zeros_like(x[0])
        if shift >= 0:
            expected[:, shift:] = x[0, :, :16 - shift]
        else:
            expected[:, :shift] = x[0, :, -shift:]
        np.testing.assert_allclose(frames[0, i], expected, atol=1e-6)


@pytest.mark.parametrize("name", ["rotate", "shear"])  # tilt at 0 degrees scales by f / (1 + f)
def test_zero_parameter_frame_is_identity(name):
    x = smooth_images(1, 16, 16, 3)
    frames = seq.perturbation_sequence(jnp.asarray(x), name, jax.random.key(0), preset="imagenet")
    middle = list(seq.frame_parameters(name, preset="imagenet")).index(0.0)
    np.testing.assert_allclose(frames[0, middle], x[0], atol=1e-5)


@pytest.mark.parametrize("kind,value", [("angle", 7.0), ("shear", -11.0), ("scale", 0.8), ("scale", 1.15)])
def test_affine_matches_torchvision_on_pil(kind, value):
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    x = smooth_images(1, 40, 40, 1)[0, ..., 0]
    matrix = seq._affine_inverse(40, 40, **{kind: value})
    ours = np.asarray(warp(jnp.asarray(x)[..., None], jnp.asarray(matrix, jnp.float32)))[..., 0]
    affine = dict(angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, 0.0])
    affine[{"angle": "angle", "shear": "shear", "scale": "scale"}[kind]] = [value, 0.0] if kind == "shear" else value
    theirs = np.asarray(TF.affine(Image.fromarray(x, mode="F"), interpolation=InterpolationMode.BILINEAR, **affine))
    # PIL fills whole border pixels where we blend with the zero fill, so compare inside.
    inside = ndi.binary_erosion(theirs != 0, iterations=2) & ndi.binary_erosion(ours != 0, iterations=2)
    assert inside.mean() > 0.4
    np.testing.assert_allclose(ours[inside], theirs[inside], atol=1e-4)  # float32 bilinear both sides


def test_tilt_matches_opencv_warp_perspective():
    x = smooth_images(1, 40, 48, 3)[0]
    matrix = np.linalg.inv(seq._tilt_inverse(40, 48, 9.0))
    theirs = cv2.warpPerspective(x, matrix, (48, 40), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    ours = np.asarray(warp(jnp.asarray(x), jnp.asarray(seq._tilt_inverse(40, 48, 9.0), jnp.float32)))
    inside = ndi.binary_erosion(theirs.sum(-1) != 0, iterations=2)
    # OpenCV quantises sample positions to 1/32 pixel: error <= slope/32 on these smooth images.
    np.testing.assert_allclose(ours[inside], theirs[inside], atol=0.01)


def test_brightness_matches_skimage_hsv():
    x = smooth_images(1, 16, 16, 3)
    x[0, 0, 0] = 0  # a black pixel (undefined hue)
    frames = np.asarray(seq.perturbation_sequence(jnp.asarray(x), "brightness", jax.random.key(0)))
    for i, c in enumerate(seq.frame_parameters("brightness", preset="cifar")):
        hsv = skcolor.rgb2hsv(x[0].astype(np.float64))
        hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
        np.testing.assert_allclose(frames[0, i], skcolor.hsv2rgb(hsv), atol=1e-5)


def test_gaussian_blur_matches_skimage():
    x = smooth_images(1, 24, 24, 3)
    frames = np.asarray(seq.perturbation_sequence(jnp.asarray(x), "gaussian_blur", jax.random.key(0), preset="imagenet"))
    for i in (0, 12, 30):
        sigma = seq.frame_parameters("gaussian_blur", preset="imagenet")[i]
        expected = sk_gaussian(x[0].astype(np.float64), sigma=sigma, truncate=6.0, channel_axis=-1, mode="nearest")
        np.testing.assert_allclose(frames[0, i], expected, atol=1e-5)


def test_motion_blur_matches_imagecorruptions_port_of_imagemagick():
    from imagecorruptions.corruptions import _motion_blur

    x = smooth_images(1, 32, 32, 3)
    frames = np.asarray(seq.perturbation_sequence(jnp.asarray(x), "motion_blur", jax.random.key(0)))
    for i, angle in enumerate(seq.frame_parameters("motion_blur", preset="cifar")):
        expected = _motion_blur(x[0], radius=6, sigma=1.8, angle=angle)
        np.testing.assert_allclose(frames[0, i], expected, atol=1e-5, err_msg=f"angle {angle}")


def test_zoom_blur_is_the_running_mean_of_zooms():
    x = smooth_images(1, 16, 16, 3)
    frames = np.asarray(seq.perturbation_sequence(jnp.asarray(x), "zoom_blur", jax.random.key(0), length=4))
    zooms = [np.asarray(warp(jnp.asarray(x[0]), jnp.asarray(seq._affine_inverse(16, 16, scale=1 + 0.004 * i),
                                                                  jnp.float32))) for i in range(4)]
    np.testing.assert_allclose(frames[0, 0], x[0], atol=1e-6)
    np.testing.assert_allclose(frames[0, 3], np.mean(zooms, axis=0), atol=1e-5)


def test_snow_layer_zoom_matches_reference_clipped_zoom():
    layer = RNG.normal(size=(24, 24))
    for zoom in (2, 3):
        crop = int(np.ceil(24 / zoom))
        top = (24 - crop) // 2
        zoomed = ndi.zoom(layer[top:top + crop, top:top + crop], zoom, order=1)
        trim = (zoomed.shape[0] - 24) // 2
        expected = zoomed[trim:trim + 24, trim:trim + 24]
        coords = seq._clipped_zoom_coordinates(24, zoom)
        ours = ndi.map_coordinates(layer, np.meshgrid(coords, coords, indexing="ij"), order=1)
        np.testing.assert_allclose(ours, expected, atol=1e-9)


def test_spatter_image_ops_match_opencv():
    """Canny, equalizeHist and the capped distance transform of the spatter mask."""
    layer = ndi.gaussian_filter(RNG.normal(0.65, 0.27, (48, 48)), 1.5)
    levels = np.floor(np.where(layer < 0.69, 0, np.clip(layer, 0, 1)) * 255).astype(np.uint8)
    edges = np.asarray(jax.jit(seq._canny, static_argnums=(1, 2))(jnp.asarray(levels, jnp.float32), 50.0, 150.0))
    np.testing.assert_array_equal(edges, cv2.Canny(levels, 50, 150) > 0)
    grey = RNG.integers(30, 200, (32, 32)).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(jax.jit(seq._equalize_hist)(jnp.asarray(grey, jnp.float32))),
                                  cv2.equalizeHist(grey))
    target = RNG.uniform(size=(40, 40)) < 0.01
    exact = np.minimum(ndi.distance_transform_edt(~target), 20)
    np.testing.assert_allclose(np.asarray(jax.jit(seq._distance_to, static_argnums=1)(jnp.asarray(target), 20)), exact, atol=1e-5)


def test_noise_frames_have_the_published_strength():
    x = jnp.full((1, 32, 32, 3), 0.5, jnp.float32)  # mid-grey: no clipping
    key = jax.random.key(3)
    # 30 frames x 3072 pixels: relative standard errors of std and variance are <= 0.5%,
    # so 3% is a > 5 sigma bound.
    for name, strength in [("gaussian_noise", 0.05), ("speckle_noise", 0.5 * 0.07)]:
        frames = seq.perturbation_sequence(x, name, key, difficulty=2, preset="imagenet" if name[0] == "g" else "cifar")
        residual = np.asarray(frames[0, 1:] - x[0])
        assert abs(residual.mean()) < 1e-3
        assert abs(residual.std() / strength - 1) < 0.03
    frames = seq.perturbation_sequence(x, "shot_noise", key, difficulty=3, preset="imagenet")
    residual = np.asarray(frames[0, 1:] - x[0])  # Poisson(0.5 * 60) / 60: var = 0.5 / 60
    assert abs(residual.mean()) < 1e-3 and abs(residual.var() / (0.5 / 60) - 1) < 0.03


@pytest.mark.parametrize("name", ["gaussian_blur", "zoom_blur"])
def test_blur_strength_grows_along_the_sequence(name):
    x = jnp.asarray(smooth_images(1, 24, 24, 3))
    frames = seq.perturbation_sequence(x, name, jax.random.key(0), length=10)
    distance = np.asarray(jnp.abs(frames[0] - x[0]).mean(axis=(1, 2, 3)))
    assert np.all(np.diff(distance) > 0), distance


def test_noise_strength_grows_with_difficulty():
    x = jnp.asarray(smooth_images(2, 16, 16, 3)) * 0.5 + 0.25
    distance = [float(jnp.abs(seq.perturbation_sequence(x, "gaussian_noise", jax.random.key(0), length=6, difficulty=d)
                              - x[:, None]).mean()) for d in (1, 2, 3)]
    assert distance[0] < distance[1] < distance[2]


# ------------------------------------------------------------------------ flip metrics

def reference_flip_prob(predictions, noise, step):
    """``flip_prob`` of ImageNet-P/test.py."""
    result = 0
    step = 1 if noise else step
    for vid in predictions:
        flips = []
        for i in range(step):
            prev = vid[i]
            for pred in vid[i::step][1:]:
                flips.append(int(prev != pred))
                if not noise:
                    prev = pred
        result += np.mean(flips) / len(predictions)
    return result


def reference_top5_distance(logits, noise, step):
    """``ranking_dist(mode='top5')`` of ImageNet-P/test.py."""
    cum = np.cumsum(np.asarray([0] + [1] * 5 + [0] * (logits.shape[-1] - 6)))
    dist = lambda sigma: np.sum(np.abs(cum[:5] - cum[sigma - 1][:5]))  # noqa: E731
    step = 1 if noise else step
    result = 0
    for vid in logits:
        ranks = [rankdata(-frame, method="ordinal") for frame in vid]
        out = []
        for i in range(step):
            inv = np.argsort(ranks[i])
            for rank in ranks[i::step][1:]:
                out.append(dist(rank[inv]))
                if not noise:
                    inv = np.argsort(rank)
        result += np.mean(out) / len(logits)
    return result


def test_hand_computed_flip_probability_and_top5_distance():
    predictions = jnp.asarray([[0, 0, 1, 1, 0], [2, 2, 2, 2, 2]])
    # previous-frame rule: flips at 0->1 and 1->0 of sequence 0: (2/4 + 0/4) / 2
    assert float(flip.flip_probability(predictions, noise_sequence=False)) == pytest.approx(0.25)
    # first-frame rule: frames 2 and 3 of sequence 0 differ from frame 0: (2/4 + 0) / 2
    assert float(flip.flip_probability(predictions, noise_sequence=True)) == pytest.approx(0.25)
    # step 2: pairs (0,2), (1,3), (2,4) -> 1, 1, 1 for sequence 0
    assert float(flip.flip_probability(predictions, noise_sequence=False, step=2)) == pytest.approx(0.5)
    # T5D: ranking 0>1>2>3>4>5 then 1>0>2>3>4>5 (one swap: d = 2) then 5 first (d = 5)
    base = -jnp.arange(7.0)
    frames = jnp.stack([base, base.at[1].set(1.0), base.at[5].set(9.0)])[None]
    assert float(flip.top5_distance(frames, noise_sequence=False)) == pytest.approx((2 + 5) / 2)
    # against frame 0: swap (2), class 5 on top (|1-2|+|2-3|+|3-4|+|4-5|+|5-6| = 5)
    assert float(flip.top5_distance(frames, noise_sequence=True)) == pytest.approx((2 + 5) / 2)


@pytest.mark.parametrize("noise,step", [(True, 1), (False, 1), (False, 2), (False, 3)])
def test_flip_metrics_match_reference_loops(noise, step):
    logits = RNG.integers(0, 4, (5, 9, 12)).astype(np.float32)  # many ties: 'ordinal' tie rule
    predictions = jnp.argmax(jnp.asarray(logits), -1)
    assert float(flip.flip_probability(predictions, noise_sequence=noise, step=step)) == pytest.approx(
        reference_flip_prob(np.asarray(predictions), noise, step), abs=1e-6)
    assert float(flip.top5_distance(jnp.asarray(logits), noise_sequence=noise, step=step)) == pytest.approx(
        reference_top5_distance(logits, noise, step), abs=1e-5)


def test_streaming_stats_equal_one_shot_in_any_order():
    logits = jnp.asarray(RNG.normal(size=(6, 7, 10)).astype(np.float32))
    rule = dict(noise_sequence=False, step=1)
    whole = flip.FlipStats.empty().update(logits, **rule).compute()
    a = flip.FlipStats.empty().update(logits[:2], **rule)
    b = flip.FlipStats.empty().update(logits[2:], **rule)
    for merged in (a.merge(b), b.merge(a)):
        for name, value in merged.compute().items():
            assert float(value) == pytest.approx(float(whole[name]), rel=1e-6)
    assert float(whole["flip_probability"]) == pytest.approx(float(flip.flip_probability(jnp.argmax(logits, -1), **rule)))
    assert jax.jit(lambda l: flip.FlipStats.empty().update(l, **rule).compute())(logits)["top5_distance"] == \
        pytest.approx(float(whole["top5_distance"]), rel=1e-6)


def test_constant_classifier_never_flips():
    clf = rj.Classifier(params=jnp.zeros(()), apply_fn=lambda p, x: jnp.tile(jnp.arange(10.0), (x.shape[0], 1)) + p,
                        num_classes=10, input_shape=(16, 16, 3))
    x = jnp.asarray(smooth_images(3, 16, 16, 3))
    for name in ("gaussian_noise", "rotate"):
        out = flip.evaluate_sequences(clf, x, name, jax.random.key(0), length=5)
        assert float(out["flip_probability"]) == 0.0 and float(out["top5_distance"]) == 0.0


def test_evaluate_sequences_matches_the_composed_functions(digits_clf, digits_batch):
    x = jnp.asarray(digits_batch[0][:8])
    key = jax.random.key(0)
    out = flip.evaluate_sequences(digits_clf, x, "translate", key, difficulty=2)
    frames = seq.perturbation_sequence(x, "translate", key)
    logits = digits_clf(frames.reshape(-1, 8, 8, 1)).reshape(8, frames.shape[1], -1)
    expected = flip.flip_probability(jnp.argmax(logits, -1), noise_sequence=False, step=2)
    assert float(out["flip_probability"]) == pytest.approx(float(expected), abs=1e-6)
    assert float(out["top5_distance"]) == pytest.approx(
        float(flip.top5_distance(logits, noise_sequence=False, step=2)), rel=1e-5)
    assert out["flip_rate_per_sequence"].shape == (8,)
    assert 0 < float(out["flip_probability"]) < 1  # translations of 8x8 digits do flip some


# ------------------------------------------------------------------------------ errors

def test_bad_input_errors(digits_clf):
    x = jnp.asarray(smooth_images(1, 16, 16, 3))
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="unknown perturbation 'rotation'.*did you mean 'rotate'.*known perturbations: "):
        seq.perturbation_sequence(x, "rotation", key)
    with pytest.raises(ValueError, match="length must be an integer >= 2"):
        seq.perturbation_sequence(x, "rotate", key, length=1)
    with pytest.raises(ValueError, match="difficulty must be 1, 2 or 3"):
        seq.perturbation_sequence(x, "rotate", key, difficulty=4)
    with pytest.raises(ValueError, match=r"\(B, H, W, C\)"):
        seq.perturbation_sequence(x[0], "rotate", key)
    with pytest.raises(ValueError, match="values in \\[0, 1\\]"):
        seq.perturbation_sequence(x * 2, "rotate", key)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        seq.perturbation_sequence(jnp.zeros((1, 16, 16, 2)), "rotate", key)
    with pytest.raises(ValueError, match="at least 8x8"):
        seq.perturbation_sequence(jnp.zeros((1, 4, 4, 3)), "rotate", key)
    with pytest.raises(TypeError, match="PRNG key"):
        seq.perturbation_sequence(x, "rotate", 0)
    with pytest.raises(ValueError, match="preset must be one of"):
        seq.perturbation_sequence(x, "rotate", key, preset="tiny")
    with pytest.raises(ValueError, match="step must be 1"):
        flip.flip_probability(jnp.zeros((2, 4), jnp.int32), noise_sequence=True, step=2)
    with pytest.raises(ValueError, match="more than step=3 frames"):
        flip.flip_probability(jnp.zeros((2, 3), jnp.int32), noise_sequence=False, step=3)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        flip.flip_probability(jnp.zeros((6,), jnp.int32), noise_sequence=False)
    with pytest.raises(ValueError, match="k=11 exceeds"):
        flip.top5_distance(jnp.zeros((1, 3, 10)), noise_sequence=False, k=11)
    with pytest.raises(ValueError, match="classifier expects"):
        flip.evaluate_sequences(digits_clf, x, "rotate", key)
