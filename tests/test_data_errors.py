"""A newcomer's mistakes with data each stop with one line naming the file or dataset,
the problem and what to do."""

import logging

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import robustjax as rj


def refusal(call) -> str:
    """The one-line message of the ValueError ``call()`` raises."""
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_a_text_file_named_npz(tmp_path):
    (tmp_path / "x.npz").write_text("hello\n")
    message = refusal(lambda: rj.data.load(str(tmp_path / "x.npz")))
    assert "x.npz is not an .npz archive (not a zip file); write one with numpy.savez(" in message
    assert "allow_pickle" not in message


def test_a_single_array_saved_under_npz(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "one.npy").rename(tmp_path / "one.npz")
    assert "one.npz is not an .npz archive (a single array saved by numpy.save)" in refusal(
        lambda: rj.data.from_npz(tmp_path / "one.npz"))


def test_a_corrupt_npz_archive(tmp_path):
    path = tmp_path / "broken.npz"
    np.savez(path, images=np.zeros((2, 4, 4), np.uint8), labels=np.arange(2))
    content = bytearray(path.read_bytes())
    content[60:70] = b"\xff" * 10  # inside the images member: its CRC no longer matches
    path.write_bytes(bytes(content))
    assert "broken.npz is a corrupt .npz archive" in refusal(lambda: rj.data.from_npz(path))


def test_object_arrays_are_refused(tmp_path):
    np.savez(tmp_path / "objects.npz", images=np.array([object()] * 2), labels=np.arange(2))
    message = refusal(lambda: rj.data.from_npz(tmp_path / "objects.npz"))
    assert "objects.npz holds object arrays" in message and "refused for safety" in message


def test_labels_outside_the_given_class_count(tmp_path):
    np.savez(tmp_path / "badlab.npz", images=np.zeros((6, 4, 4), np.uint8), labels=[-1, 10, 0, 1, 2, 3])
    message = refusal(lambda: rj.data.load(str(tmp_path / "badlab.npz"), num_classes=10))
    assert message.startswith(
        "badlab.npz: labels must be class indices in [0, 10), found -1 (1 label) and 10 (1 label)")


def test_negative_labels_without_a_class_count(tmp_path):
    np.savez(tmp_path / "badlab.npz", images=np.zeros((6, 4, 4), np.uint8), labels=[-1, 10, 0, 1, 2, 3])
    assert refusal(lambda: rj.data.load(str(tmp_path / "badlab.npz"))) == (
        "badlab.npz: labels must be class indices from 0, found -1 (1 label)")


def test_many_bad_labels_are_summarised():
    labels = np.array([-3, -3, -2, -1, 12, 13, 14, 15, 0])
    assert "found -3 (2 labels), -2 (1 label), -1 (1 label), 12 (1 label), 13 (1 label) and 2 more values" in (
        refusal(lambda: rj.data.from_arrays(np.zeros((9, 4, 4), np.uint8), labels, num_classes=10)))


def write_folder(root, modes):
    """One 8x8 PNG per mode, in the class folders ``a`` and ``b`` in turn."""
    for i, mode in enumerate(modes):
        (root / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        Image.new(mode, (8, 8), 60).save(root / "ab"[i % 2] / f"{i}.png")


def test_a_grey_folder_loads_as_one_channel(tmp_path):
    write_folder(tmp_path, ["L", "L", "L"])
    assert rj.data.load(str(tmp_path)).image_shape == (8, 8, 1)
    x, _ = rj.data.load(str(tmp_path), channels=3).arrays()
    assert x.shape == (3, 8, 8, 3)


def test_a_folder_with_one_colour_image_loads_as_rgb(tmp_path):
    write_folder(tmp_path, ["L", "RGB", "L"])
    x, _ = rj.data.load(str(tmp_path)).arrays()
    assert x.shape == (3, 8, 8, 3)


def test_a_class_count_below_the_folders(tmp_path):
    write_folder(tmp_path, ["L", "L"])
    assert refusal(lambda: rj.data.load(str(tmp_path), num_classes=1)) == (
        f"dataset {tmp_path.name!r} has 2 classes, more than num_classes=1")


def test_tfds_class_count_and_channels():
    with tfds.testing.mock_data(num_examples=4):
        assert refusal(lambda: rj.data.load("tfds:cifar10", num_classes=5)) == (
            "dataset 'cifar10/test' has 10 classes, more than num_classes=5")
        x, _ = rj.data.load("tfds:mnist", channels=3).arrays()
        assert x.shape == (4, 28, 28, 3)


def test_an_unprepared_tfds_dataset(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        message = refusal(lambda: rj.data.from_tfds("mnist", data_dir=str(tmp_path)))
    assert f"'mnist' is not prepared in {tmp_path}" in message
    assert f"`tfds build mnist --data_dir {tmp_path} --file_format array_record`" in message
    assert not caplog.records, [record.getMessage() for record in caplog.records]


def test_a_tfds_dataset_prepared_as_tfrecord(tmp_path):
    builder = tfds.builder("mnist", data_dir=tmp_path)
    builder.data_path.mkdir(parents=True)
    builder.info.write_to_directory(builder.data_path)  # what `tfds build` writes, without the records
    message = refusal(lambda: rj.data.from_tfds("mnist", data_dir=str(tmp_path)))
    assert f"prepared in {tmp_path} as tfrecord files" in message
    assert "--file_format array_record --overwrite`" in message
