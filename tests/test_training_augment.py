"""Training augmentation (issue 21) against torchvision: RobustART's STANDARD (random
resized crop, flip, colour jitter) and CIFAR's pad-crop-flip, each piece equal to
torchvision's on the same float image; sampled boxes inside the image and within the
area and ratio bounds; the recipe's augmentation is what the training step trains on."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax import training
from robustjax.training import augment
from robustjax.training.model import TrainModel
from robustjax.training.step import AUGMENT_STREAM, init_state, make_step

torch = pytest.importorskip("torch")
TF = pytest.importorskip("torchvision.transforms.functional")
from torchvision.transforms import InterpolationMode, RandomResizedCrop  # noqa: E402

pytestmark = pytest.mark.torch
_augment = jax.jit(augment.augment, static_argnums=0)


def _image(height=20, width=24, channels=3) -> np.ndarray:
    """Random colours with grey pixels (hue and saturation 0) and pure primaries (hue sectors)."""
    img = np.random.default_rng(0).uniform(size=(height, width, channels)).astype(np.float32)
    img[:3, :3] = 0.5
    img[4, :6, :] = np.eye(3, dtype=np.float32).repeat(2, axis=0)[:, :channels]
    return img


def _torch(img: np.ndarray):
    return torch.from_numpy(img.transpose(2, 0, 1).copy())


def _numpy(tensor) -> np.ndarray:
    return tensor.numpy().transpose(1, 2, 0)


@pytest.mark.parametrize("channels", [3, 1])
def test_colour_adjustments_equal_torchvision(channels):
    img = _image(channels=channels)
    worst = {}
    for name in ("brightness", "contrast", "saturation", "hue"):
        ours, theirs = getattr(augment, f"adjust_{name}"), getattr(TF, f"adjust_{name}")
        factors = (-0.5, -0.1, 0.0, 0.03, 0.1, 0.5) if name == "hue" else (0.0, 0.8, 1.0, 1.17, 1.5)
        worst[name] = max(float(np.abs(np.asarray(ours(img, f)) - _numpy(theirs(_torch(img), f))).max())
                          for f in factors)
    assert max(worst.values()) < 1e-5, worst  # measured: <= 2e-7, hue 9e-7


def test_jitter_applies_its_factors_in_its_order_as_torchvision():
    img = _image()
    for seed in range(4):
        order, factors = augment.jitter_params(jax.random.key(seed))
        assert sorted(np.asarray(order).tolist()) == [0, 1, 2, 3]
        assert np.all(np.asarray(factors[:3]) >= 0.8) and np.all(np.asarray(factors[:3]) <= 1.2)
        assert -0.1 <= float(factors[3]) <= 0.1
        expected = _torch(img)
        for index in np.asarray(order):  # torchvision's ColorJitter.forward with these parameters
            name = ("brightness", "contrast", "saturation", "hue")[index]
            expected = getattr(TF, f"adjust_{name}")(expected, float(factors[index]))
        ours = np.asarray(jax.jit(augment.apply_jitter)(jnp.asarray(img), order, factors))
        np.testing.assert_allclose(ours, _numpy(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("box", [(0, 0, 20, 24), (3, 5, 7, 9), (10, 2, 10, 21), (1, 1, 19, 3), (0, 0, 1, 1),
                                 (2, 0, 18, 24)])
def test_resized_crop_equals_torchvision_bilinear(box):
    img = _image()
    ours = np.asarray(augment.resized_crop(jnp.asarray(img), jnp.array(box)))
    theirs = _numpy(TF.resized_crop(_torch(img), *box, [20, 24], InterpolationMode.BILINEAR, antialias=False))
    np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0)  # measured: <= 2.4e-7


def test_flip_and_pad_crop_flip_are_torchvision_crops_of_the_padded_image():
    img = _image(8, 10)
    flipped = augment.random_flip(jax.random.key(0), jnp.asarray(img))
    assert any(np.array_equal(np.asarray(flipped), candidate) for candidate in (img, _numpy(TF.hflip(_torch(img)))))
    padded = TF.pad(_torch(img), 4)  # RandomCrop(padding=4): zeros around, then a window at a uniform offset
    windows = [_numpy(TF.crop(padded, top, left, 8, 10)) for top, left in itertools.product(range(9), repeat=2)]
    windows += [w[:, ::-1] for w in windows]
    seen = set()
    for seed in range(12):
        out = np.asarray(augment.pad_crop_flip(jax.random.key(seed), jnp.asarray(img)))
        matches = [i for i, w in enumerate(windows) if np.array_equal(out, w)]
        assert matches, seed
        seen.add(matches[0] >= 81)
    assert seen == {False, True}  # both flipped and unflipped outputs occur


@pytest.mark.parametrize("height,width", [(224, 224), (32, 48), (4, 64)])
def test_sampled_boxes_lie_inside_within_the_bounds(height, width):
    """Every box fits, and its area is 8-100% and its ratio 3/4-4/3 up to the rounding of
    its sides to whole pixels (torchvision's centred fallback too); box sizes are distributed
    as torchvision's RandomResizedCrop's (on the 4x64 image, where most draws fail, its
    fallback is the 4x5 box)."""
    draw = jax.jit(jax.vmap(lambda k: augment.random_resized_crop_box(k, height, width)))
    boxes = np.asarray(draw(jax.random.split(jax.random.key(0), 2000)))
    top, left, h, w = boxes.T
    assert np.all((top >= 0) & (left >= 0) & (h >= 1) & (w >= 1) & (top + h <= height) & (left + w <= width))
    area = height * width
    assert np.all((w + 0.5) * (h + 0.5) >= 0.08 * area) and np.all((w - 0.5) * (h - 0.5) <= area)
    assert np.all((w + 0.5) / (h - 0.5) >= 3 / 4) and np.all((w - 0.5) / (h + 0.5) <= 4 / 3)
    torch.manual_seed(0)
    reference = np.array([RandomResizedCrop.get_params(torch.zeros(1, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
                          for _ in range(2000)])
    assert abs((h * w).mean() - (reference[:, 2] * reference[:, 3]).mean()) < 0.03 * area
    assert abs(h.mean() - reference[:, 2].mean()) < 0.03 * height and abs(w.mean() - reference[:, 3].mean()) < 0.03 * width
    if (height, width) == (4, 64):
        assert augment._centre_box(height, width, (3 / 4, 4 / 3)) == (4, 5)
        assert abs(np.mean(w == 5) - np.mean(reference[:, 3] == 5)) < 0.02 and np.mean(w == 5) > 0.9


def _batch() -> jax.Array:
    """Four 8x8 images (one shape, so the tests share the compiled augmentation)."""
    img = _image(8, 8)
    return jnp.asarray(np.stack([img, img[::-1], img[:, ::-1], img.transpose(1, 0, 2)[..., ::-1]]))


def test_augmentations_keep_shapes_and_range_and_none_is_the_identity():
    x = _batch()
    assert augment.augment("none", jax.random.key(0), x) is x
    for name in ("standard", "pad_crop_flip"):
        out = _augment(name, jax.random.key(0), x)
        assert out.shape == x.shape and out.dtype == jnp.float32
        assert float(out.min()) >= 0 and float(out.max()) <= 1
        again = _augment(name, jax.random.key(0), x)
        np.testing.assert_array_equal(out, again)
    with pytest.raises(ValueError, match=r"unknown augmentation 'standart' \(did you mean 'standard'\?\)"):
        training.Recipe(augment="standart")


def test_aligned_recipe_chooses_the_augmentation_by_family():
    assert training.aligned("resnet").augment == "standard"
    assert training.aligned("vit").augment == "standard" and training.aligned("mlp_mixer").optimizer == "adamw"
    assert training.aligned("wide_resnet").augment == "pad_crop_flip"
    assert training.aligned("digits_cnn").augment == "none" and training.aligned("nas_nb201").augment == "none"
    assert training.aligned("resnet", augment="none").augment == "none"
    from robustjax.training.recipe import CIFAR_FAMILIES, STANDARD_FAMILIES

    families = {rj.zoo.get(name).family for name in rj.zoo.names()}
    unclassified = families - set(STANDARD_FAMILIES) - set(CIFAR_FAMILIES)
    assert unclassified == {"digits_cnn", "digits_mlp", "nas_bignas", "nas_nb201"}, unclassified


class _Linear(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(8 * 8 * 3, 3, rngs=rngs)

    def __call__(self, x):
        return self.linear(x.reshape(x.shape[0], -1))


def test_the_step_trains_on_the_augmented_images():
    """The first step's loss is the cross-entropy on augment(fold_in(step key, 1), x)."""
    clf = rj.Classifier.from_nnx(_Linear(rngs=nnx.Rngs(0)), num_classes=3, input_shape=(8, 8, 3))
    recipe = training.Recipe(steps=2, batch_size=4, warmup_epochs=0, label_smoothing=0.0, augment="standard")
    model = TrainModel.from_classifier(clf)
    optimizer, step = make_step(model, recipe, training.techniques.create(""), 4)
    x = _batch()
    y = jnp.array([0, 1, 2, 1])
    seed = jax.random.key(5)
    _, metrics = step(init_state(model, optimizer, recipe), x, y, seed)
    seen = _augment("standard", jax.random.fold_in(jax.random.fold_in(seed, 0), AUGMENT_STREAM), x)
    loss = float(jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(clf(seen)), y[:, None], axis=1)))
    assert not np.allclose(np.asarray(seen), np.asarray(x))
    assert np.isclose(float(metrics["loss"]), loss, rtol=1e-5)
