"""JPEG compression against Pillow/libjpeg, and system noise (decoders x resize modes)."""

import dataclasses
import io
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, features
from scipy.ndimage import gaussian_filter

import robustjax as rj
from robustjax.noise import system
from robustjax.ops.jpeg import jpeg_round_trip, quantization_tables


def smooth_image(seed: int, height: int, width: int, channels: int = 3, sigma: float = 2.0) -> np.ndarray:
    noise = np.random.default_rng(seed).random((height, width, channels))
    smooth = gaussian_filter(noise, (sigma, sigma, 0))
    return np.round(255 * (smooth - smooth.min()) / np.ptp(smooth)).astype(np.uint8)


def pil_round_trip(image: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, "JPEG", quality=quality)
    out = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
    return out.reshape(image.shape)


def ours(image: np.ndarray, quality: int) -> np.ndarray:
    out = jpeg_round_trip(jnp.asarray(image[None] / 255.0, jnp.float32), quality)
    return np.round(np.asarray(out[0]) * 255).astype(np.uint8)


# Pillow's wheels use libjpeg-turbo, which the round trip reproduces step for step in integer
# arithmetic, so the output must be identical. Another libjpeg (e.g. IJG 9, which upsamples
# chroma in the DCT domain) may differ by a few levels near edges: then require a mean
# absolute difference below 1/255 and PSNR above 40 dB.
BIT_EXACT = bool(features.check_feature("libjpeg_turbo"))


def assert_matches_libjpeg(actual: np.ndarray, expected: np.ndarray) -> None:
    if BIT_EXACT:
        np.testing.assert_array_equal(actual, expected)
        return
    diff = actual.astype(np.float64) - expected
    assert np.abs(diff).mean() < 1.0
    assert 10 * np.log10(255**2 / max(np.mean(diff**2), 1e-12)) > 40


# Odd sizes exercise libjpeg's edge padding (partial blocks and MCUs, odd chroma sizes);
# uniform noise makes every coefficient matter; one grey image takes the luminance-only path.
IMAGES = {
    "smooth_61x77": smooth_image(0, 61, 77),
    "noise_37x45": np.random.default_rng(1).integers(0, 256, (37, 45, 3), dtype=np.uint8),
    "grey_33x50": smooth_image(2, 33, 50, channels=1, sigma=1.0),
}


@pytest.mark.parametrize("name", list(IMAGES))
def test_jpeg_round_trip_matches_pillow(name):
    image = IMAGES[name]
    for quality in (1, 7, 25, 50, 80, 95, 100):
        assert_matches_libjpeg(ours(image, quality), pil_round_trip(image, quality))


def test_quantization_tables_match_what_pillow_writes():
    for quality in (7, 50, 90):
        buffer = io.BytesIO()
        Image.fromarray(IMAGES["smooth_61x77"]).save(buffer, "JPEG", quality=quality)
        written = Image.open(buffer).quantization  # natural order, luminance then chrominance
        for ours_table, index in zip(quantization_tables(quality), (0, 1)):
            np.testing.assert_array_equal(np.asarray(ours_table).ravel(), written[index])


def test_jpeg_corruption_matches_imagecorruptions():
    imagecorruptions = pytest.importorskip("imagecorruptions")
    image = smooth_image(3, 40, 48)
    x = jnp.asarray(image[None] / 255.0, jnp.float32)
    expected = imagecorruptions.corrupt(image, corruption_name="jpeg_compression", severity=5)
    out = rj.noise.corrupt(x, "jpeg_compression", 5, jax.random.key(0), preset="imagenet")
    assert_matches_libjpeg(np.round(np.asarray(out[0]) * 255).astype(np.uint8), expected)


def test_jpeg_quality_and_severity_are_monotone():
    x = jnp.asarray(smooth_image(4, 32, 32)[None] / 255.0, jnp.float32)
    errors = [float(jnp.abs(jpeg_round_trip(x, q) - x).mean()) for q in (5, 15, 40, 75, 95)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0] / 4
    corruption = rj.noise.get("jpeg_compression")
    assert corruption.constants == {"imagenet": (25, 18, 15, 10, 7), "cifar": (80, 65, 58, 50, 40)}
    for qualities in corruption.constants.values():  # severity 1..5: strictly worse quality
        by_severity = [float(jnp.abs(jpeg_round_trip(x, q) - x).mean()) for q in qualities]
        assert by_severity == sorted(by_severity) and by_severity[0] < by_severity[-1]


def test_jpeg_quality_is_traced_and_vmaps():
    x = jnp.asarray(smooth_image(5, 16, 24)[None] / 255.0, jnp.float32)
    qualities = jnp.array([10, 60], jnp.int32)
    batched = jax.vmap(lambda q: jpeg_round_trip(x, q))(qualities)
    for out, quality in zip(batched, (10, 60)):
        np.testing.assert_array_equal(out, jpeg_round_trip(x, quality))


def test_jpeg_bad_input():
    x = jnp.zeros((1, 8, 8, 3), jnp.float32)
    with pytest.raises(ValueError, match="quality must be from 1 to 100, got 0"):
        jpeg_round_trip(x, 0)
    with pytest.raises(TypeError, match="quality must be an integer"):
        jpeg_round_trip(x, 50.0)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        jpeg_round_trip(jnp.zeros((1, 8, 8, 2), jnp.float32), 50)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        jpeg_round_trip(x + 2.0, 50)


# ---- system noise ----------------------------------------------------------------------

def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def encoded():
    """Reddish (class 0) and bluish (class 1) smooth images of assorted sizes, as JPEG."""
    images, labels = [], []
    for index, (height, width) in enumerate([(60, 80), (50, 47), (72, 64), (45, 90), (64, 64)]):
        image = smooth_image(10 + index, height, width, sigma=4.0).astype(np.float64)
        label = index % 2
        image[..., 2 * label] = 0.5 * image[..., 2 * label] + 120  # boost red or blue
        images.append(encode_jpeg(np.clip(image, 0, 255).astype(np.uint8)))
        labels.append(label)
    return images, np.array(labels, np.int32)


def test_variants_and_shapes(encoded):
    images, _ = encoded
    assert len(system.variants(decoders=["pil", "opencv"])) == 22
    assert len(system.variants(decoders=system.DECODERS)) == 33
    variant = system.SystemNoiseVariant("pil", "pil-bilinear")
    out = system.decode_and_resize(images[0], variant, resize_to=36, crop=32)
    assert out.shape == (32, 32, 3) and out.dtype == np.float32 and 0 <= out.min() <= out.max() <= 1
    assert system.decode_and_resize(images[1], variant).shape == (224, 224, 3)
    assert system.default_resize(224) == 256 and system.default_resize(32) == 36


def test_pil_and_opencv_decoders_agree(encoded):
    # Both wrap libjpeg-turbo with its default islow IDCT and fancy upsampling; allow at most
    # one level of difference in case a build differs in its SIMD rounding.
    for data in encoded[0]:
        pil, cv = system.decode(data, "pil"), system.decode(data, "opencv")
        assert pil.shape == cv.shape
        assert np.abs(pil.astype(int) - cv).max() <= 1


def test_ffmpeg_decoder_is_close_but_its_own(encoded):
    pytest.importorskip("av")
    data = encoded[0][0]
    pil, ff = system.decode(data, "pil").astype(int), system.decode(data, "ffmpeg")
    assert ff.shape == pil.shape and ff.dtype == np.uint8
    # FFmpeg's JPEG decoder and swscale's chroma handling differ from libjpeg by a few
    # levels on these smooth images (measured 2.9 mean), nowhere near a different picture.
    assert np.abs(pil - ff).mean() < 8


def test_resize_modes_differ(encoded):
    decoded = system.decode(encoded[0][0], "pil")
    outputs = {mode: system.resize(decoded, mode, 36).tobytes() for mode in system.RESIZE_MODES}
    assert len(set(outputs.values())) == len(system.RESIZE_MODES)


def test_summary_math():
    report = system.summarize({"a": 0.5, "b": 0.7, "c": 0.9})
    assert report.mean == pytest.approx(0.7)
    assert report.std == pytest.approx(np.sqrt((0.2**2 + 0 + 0.2**2) / 3))  # population std
    assert report.negative_std == -report.std
    with pytest.raises(ValueError, match="empty"):
        system.summarize({})


def colour_apply(params, x):
    """Logits from the mean colour: class 0 likes red, class 1 likes blue."""
    return x.mean(axis=(1, 2)) @ params


@pytest.fixture(scope="module")
def colour_classifier():
    weights = jnp.array([[1.0, -1.0], [0.0, 0.0], [-1.0, 1.0]], jnp.float32)
    return rj.Classifier(params=weights, apply_fn=colour_apply, num_classes=2, input_shape=(32, 32, 3))


def test_evaluate_matches_per_image_pipeline_and_compiles_once(encoded, colour_classifier):
    images, labels = encoded
    labels = labels.copy()
    labels[0] = 1 - labels[0]  # one wrong label: accuracy below 1 for every variant
    chosen = system.variants(decoders=["pil", "opencv"], resizes=["pil-bicubic", "opencv-area", "opencv-nearest"])
    system._predict.clear_cache()
    report = system.evaluate_system_noise(colour_classifier, images, labels, chosen, batch_size=2, workers=2)
    assert system._predict._cache_size() == 1  # one program for every variant and batch
    assert list(report.accuracy) == [v.name for v in chosen]
    for variant in chosen:
        x = np.stack([system.decode_and_resize(data, variant, 36, 32) for data in images])
        predictions = np.asarray(colour_classifier(x)).argmax(-1)
        assert report.accuracy[variant.name] == pytest.approx(np.mean(predictions == labels))
    values = list(report.accuracy.values())
    assert report.mean == pytest.approx(np.mean(values)) and report.std == pytest.approx(np.std(values))


def test_system_noise_errors(encoded, colour_classifier):
    images, labels = encoded
    with pytest.raises(ValueError, match="unknown decoder 'libjpeg'; valid decoders: pil, opencv, ffmpeg"):
        system.SystemNoiseVariant("libjpeg", "pil-bilinear")
    with pytest.raises(ValueError, match="unknown resize mode 'pil-cubic'; valid modes: pil-nearest"):
        system.SystemNoiseVariant("pil", "pil-cubic")
    for decoder in ("pil", "opencv"):
        with pytest.raises(ValueError, match=f"decoder '{decoder}' could not decode"):
            system.decode(b"not an image", decoder)
    with pytest.raises(TypeError, match="encoded must be bytes"):
        system.decode("file.jpg", "pil")
    variant = system.SystemNoiseVariant("pil", "pil-box")
    with pytest.raises(ValueError, match="crop .40. must not exceed resize_to .36."):
        system.decode_and_resize(images[0], variant, resize_to=36, crop=40)
    with pytest.raises(ValueError, match=r"encoded_images\[1\]: decoder 'pil' could not decode"):
        system.evaluate_system_noise(colour_classifier, [images[0], b"broken"], labels[:2], [variant])
    with pytest.raises(ValueError, match="labels must have shape"):
        system.evaluate_system_noise(colour_classifier, images, labels[:2], [variant])
    with pytest.raises(ValueError, match="the classifier expects"):
        system.evaluate_system_noise(colour_classifier, images, labels, [variant], crop=24)
    with pytest.raises(TypeError, match="SystemNoiseVariant"):
        system.evaluate_system_noise(colour_classifier, images, labels, [("pil", "pil-box")])
    assert dataclasses.is_dataclass(variant) and hash(variant) == hash(system.SystemNoiseVariant("pil", "pil-box"))


def test_noise_benchmark_runs_and_writes_its_json(tmp_path):
    pytest.importorskip("imagecorruptions")
    subprocess.run([sys.executable, "-m", "benchmarks.noise", "--quick", "--corruptions",
                    "jpeg_compression,brightness", "--out", str(tmp_path)], check=True, capture_output=True)
    payload = json.loads((tmp_path / f"noise.{jax.default_backend()}.json").read_text())
    assert {row["name"] for row in payload["results"]} == {"jpeg_compression@32", "brightness@32"}
    assert payload["machine"]["versions"]["imagecorruptions"]
    for row in payload["results"]:
        assert row["robustjax_images_per_s"] > 0 and row["peer_images_per_s"] > 0 and row["ratio"] > 0
    assert set(payload["geometric_mean_ratio"]) == {"32"} and payload["skipped"] == {}
