import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import robustjax as rj
from robustjax.data.digits import GREY_LEVELS


def test_digits_split_is_fixed_disjoint_and_complete():
    train, test, everything = (rj.data.digits(s) for s in ("train", "test", "all"))
    assert (train.num_examples, test.num_examples, everything.num_examples) == (1297, 500, 1797)
    x_test, y_test = test.arrays()
    assert x_test.shape == (500, 8, 8, 1) and x_test.dtype == np.float32
    assert y_test.dtype == np.int32 and set(np.unique(y_test)) == set(range(10))
    assert 0.0 <= x_test.min() and x_test.max() <= 1.0
    data = rj.data.digits.__globals__["_load_file"]()
    assert not set(data["train_indices"]) & set(data["test_indices"])


def test_embedded_digits_are_scikit_learns():
    datasets = pytest.importorskip("sklearn.datasets")
    reference = datasets.load_digits()
    x, y = rj.data.digits("all").arrays()
    np.testing.assert_array_equal(x[..., 0] * GREY_LEVELS, reference.images)
    np.testing.assert_array_equal(y, reference.target)


def test_batches_cover_the_set_in_order():
    dataset = rj.data.digits("test")
    batches = list(dataset.batches(128, limit=300))
    assert [len(y) for _, y in batches] == [128, 128, 44]
    x_all, y_all = dataset.arrays(limit=300)
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), y_all)
    np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), x_all)


def test_uint8_images_are_scaled_to_unit_interval():
    images = np.array([[[[0]], [[255]]]], np.uint8).repeat(2, axis=0)
    x, y = rj.data.from_arrays(images, np.array([0, 1])).arrays()
    assert x.dtype == np.float32 and x.max() == 1.0 and x.min() == 0.0
    assert y.dtype == np.int32


@pytest.mark.parametrize(
    "images, labels, error, message",
    [
        (np.zeros((2, 4, 4, 1), np.float32), np.zeros(3, int), ValueError, "labels must have shape"),
        (np.zeros((2, 4), np.float32), np.zeros(2, int), ValueError, r"\(N, H, W, C\)"),
        (np.full((2, 4, 4, 1), 2.0, np.float32), np.zeros(2, int), ValueError, r"values in \[0, 1\]"),
        (np.full((2, 4, 4, 1), np.nan, np.float32), np.zeros(2, int), ValueError, "NaN"),
        (np.zeros((2, 4, 4, 1), np.float32), np.zeros(2, np.float32), TypeError, "labels must be integers"),
        (np.zeros((2, 4, 4, 1), np.int64), np.zeros(2, int), TypeError, "uint8 or float"),
        (np.zeros((2, 4, 4, 1), np.float32), np.array([0, -1]), ValueError, r"class indices from 0, found -1 \(1 label\)"),
    ],
)
def test_malformed_arrays_are_refused(images, labels, error, message):
    with pytest.raises(error, match=message):
        rj.data.from_arrays(images, labels, name="bad")


def test_npz_files(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (5, 6, 6, 3), dtype=np.uint8)
    np.savez(tmp_path / "a.npz", x=images, y=np.arange(5))
    x, y = rj.data.load(str(tmp_path / "a.npz")).arrays()
    np.testing.assert_allclose(x, images / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, np.arange(5))
    np.savez(tmp_path / "b.npz", pictures=images, y=np.arange(5))
    with pytest.raises(ValueError, match=r"found \['pictures', 'y'\]"):
        rj.data.from_npz(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", images=np.array([object()] * 5), labels=np.arange(5))
    with pytest.raises(ValueError, match="(?i)pickle"):
        rj.data.from_npz(tmp_path / "c.npz")
    with pytest.raises(ValueError, match="no .npz file"):
        rj.data.from_npz(tmp_path / "missing.npz")


def _write_images(folder, sizes):
    for i, (label, size) in enumerate(sizes):
        (folder / label).mkdir(parents=True, exist_ok=True)
        pixels = np.full((size, size, 3), 40 * i, np.uint8)
        Image.fromarray(pixels).save(folder / label / f"{i}.png")


def test_image_folder(tmp_path):
    _write_images(tmp_path, [("cat", 10), ("cat", 10), ("dog", 10)])
    dataset = rj.data.load(str(tmp_path))
    assert dataset.class_names == ("cat", "dog") and dataset.image_shape == (10, 10, 3)
    x, y = dataset.arrays()
    np.testing.assert_array_equal(y, [0, 0, 1])
    np.testing.assert_allclose(x[2], np.full((10, 10, 3), 80 / 255), rtol=1e-6)


def test_image_folder_of_mixed_sizes_needs_image_size(tmp_path):
    _write_images(tmp_path, [("a", 10), ("b", 20)])
    with pytest.raises(ValueError, match="pass image_size"):
        rj.data.from_folder(tmp_path).arrays()
    x, _ = rj.data.from_folder(tmp_path, image_size=8).arrays()
    assert x.shape == (2, 8, 8, 3)


def test_tfds_dataset_with_mock_data():
    with tfds.testing.mock_data(num_examples=20):
        dataset = rj.data.load("tfds:cifar10", "test")
        assert (dataset.num_examples, dataset.num_classes, dataset.image_shape) == (20, 10, (32, 32, 3))
        x, y = next(dataset.batches(8))
        assert x.shape == (8, 32, 32, 3) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1
        assert y.dtype == np.int32 and y.min() >= 0 and y.max() < 10
        resized = rj.data.from_tfds("cifar10", "test", image_size=16)
        assert next(resized.batches(4))[0].shape == (4, 16, 16, 3)


def test_tfds_unknown_names_and_features():
    with pytest.raises(ValueError, match="unknown tfds dataset"):
        rj.data.from_tfds("no_such_dataset_xyz")
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(ValueError, match="no Image feature 'picture'"):
            rj.data.from_tfds("cifar10", image_key="picture")


def test_unknown_dataset_spec():
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        rj.data.load("nope")
    with pytest.raises(ValueError, match="splits"):
        rj.data.digits("validation")
