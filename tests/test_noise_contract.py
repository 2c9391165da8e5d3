"""Registry-wide contract of the corruptions: every registered one is checked here."""

import jax
import numpy as np
import pytest

import robustjax as rj
from tests.helpers import count_compiles, unchecked_annotations

NAMES = rj.noise.names()
# Published constants under which severity 5 is not further from the clean image than
# severity 1 (the corruption files' own tests check monotonicity where it holds).
NOT_INCREASING = {"elastic_transform": "CIFAR-10-C's severity 1 has the largest affine warp"}


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """Smooth colour images (natural-image-like), 32x32, in [0, 1]."""
    rng = np.random.default_rng(0)
    coarse = rng.uniform(0.1, 0.9, size=(3, 4, 4, 3))
    return np.asarray(jax.image.resize(coarse, (3, 32, 32, 3), "cubic").clip(0, 1), np.float32)


def test_the_registry_holds_the_nineteen_corruptions_by_family():
    assert len(NAMES) == 19
    assert {f: len(rj.noise.names(f)) for f in rj.noise.FAMILIES} == {
        "noise": 3, "blur": 4, "weather": 4, "digital": 4, "extra": 4}


@pytest.mark.parametrize("name", NAMES)
def test_contract(name, images):
    corruption = rj.noise.get(name)
    assert corruption.name == name and name in rj.noise.names(corruption.family)
    key = jax.random.key(1)
    outputs = {s: np.asarray(rj.noise.corrupt(images, name, s, key)) for s in (1, 5)}
    for out in outputs.values():
        assert out.shape == images.shape and out.dtype == np.float32
        assert np.isfinite(out).all() and out.min() >= 0.0 and out.max() <= 1.0
    distance = {s: np.abs(out - images).mean() for s, out in outputs.items()}
    assert distance[1] > 0 and distance[5] > 0
    if name not in NOT_INCREASING:
        assert distance[1] < distance[5], distance
    again = np.asarray(rj.noise.corrupt(images, name, 5, key))
    np.testing.assert_array_equal(again, outputs[5])
    with count_compiles() as compiles:
        other = np.asarray(rj.noise.corrupt(images, name, 5, jax.random.key(2)))
    assert compiles[0] == 0
    if corruption.stochastic:
        assert not np.array_equal(other, outputs[5])
    else:
        np.testing.assert_array_equal(other, outputs[5])


@pytest.mark.parametrize("name", NAMES)
def test_grey_and_non_square_images(name):
    x = np.random.default_rng(1).uniform(size=(2, 24, 40, 1)).astype(np.float32)
    out = np.asarray(rj.noise.corrupt(x, name, 3, jax.random.key(0)))
    assert out.shape == x.shape and np.isfinite(out).all() and 0 <= out.min() and out.max() <= 1


def test_the_preset_follows_the_image_size():
    assert rj.noise.default_preset((32, 32)) == "cifar"
    assert rj.noise.default_preset((224, 224)) == "imagenet"


@pytest.mark.parametrize("kwargs, error, message", [
    ({"name": "fogg"}, ValueError, r"unknown corruption 'fogg' \(did you mean 'fog'.*known corruptions: \['brightness', "),
    ({"severity": 0}, ValueError, "severity must be an integer from 1 to 5, got 0"),
    ({"severity": 6}, ValueError, "severity must be an integer from 1 to 5, got 6"),
    ({"severity": 2.0}, ValueError, "severity must be an integer"),
    ({"x": np.zeros((8, 8, 3), np.float32)}, ValueError, r"batch of images \(B, H, W, C\)"),
    ({"x": np.full((1, 8, 8, 3), 2.0, np.float32)}, ValueError, r"values in \[0, 1\]"),
    ({"x": np.zeros((1, 8, 8, 3), np.uint8)}, TypeError, "floating-point images"),
    ({"x": np.zeros((1, 8, 8, 2), np.float32)}, ValueError, "1 or 3 channels"),
    ({"preset": "tiny"}, ValueError, "preset must be one of"),
])
def test_bad_input(kwargs, error, message):
    args = {"x": np.zeros((1, 8, 8, 3), np.float32), "name": "fog", "severity": 1, "key": jax.random.key(0)} | kwargs
    preset = args.pop("preset", None)
    with unchecked_annotations(), pytest.raises(error, match=message):
        rj.noise.corrupt(args["x"], args["name"], args["severity"], args["key"], preset=preset)
