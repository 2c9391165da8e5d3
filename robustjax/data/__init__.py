"""Labelled image sets yielding float32 NHWC images in [0, 1] and int32 labels."""

from __future__ import annotations

from pathlib import Path

from robustjax.data.dataset import ImageDataset, from_arrays
from robustjax.data.digits import digits
from robustjax.data.files import from_folder, from_npz
from robustjax.data.tfds import from_tfds

DEFAULT_DATASET = "digits"

__all__ = ["ImageDataset", "digits", "from_arrays", "from_folder", "from_npz", "from_tfds", "load"]


def load(spec: str = DEFAULT_DATASET, split: str = "test", *, image_size: int | None = None,
         data_dir: str | None = None) -> ImageDataset:
    """A dataset named on the command line or in a plan.

    ``spec`` is ``digits`` (embedded), ``tfds:NAME`` (a prepared TensorFlow Datasets
    set, e.g. ``tfds:cifar10``), a path to an ``.npz`` file, or a folder with one
    sub-folder of images per class.
    """
    if spec == "digits":
        return digits(split)
    if spec.startswith("tfds:"):
        return from_tfds(spec.removeprefix("tfds:"), split, data_dir=data_dir, image_size=image_size)
    path = Path(spec)
    if path.suffix == ".npz":
        return from_npz(path)
    if path.is_dir():
        return from_folder(path, image_size=image_size)
    raise ValueError(
        f"unknown dataset {spec!r}: expected 'digits', 'tfds:NAME', a path to an .npz file "
        "or a folder of class sub-folders"
    )
