"""Labelled image sets yielding float32 NHWC images in [0, 1] and int32 labels; ``shift``
reads the released natural-shift sets (ImageNet-A, -R, -O, -C, CIFAR-10-C) by name."""

from __future__ import annotations

from pathlib import Path

from robustjax.data import shift
from robustjax.data.dataset import ImageDataset, check_channels, from_arrays, with_num_classes
from robustjax.data.digits import digits
from robustjax.data.files import from_folder, from_npz
from robustjax.data.tfds import from_tfds

DEFAULT_DATASET = "digits"

__all__ = ["ImageDataset", "digits", "from_arrays", "from_folder", "from_npz", "from_tfds", "load", "shift"]


def load(spec: str = DEFAULT_DATASET, split: str = "test", *, image_size: int | None = None,
         data_dir: str | None = None, num_classes: int | None = None,
         channels: int | None = None) -> ImageDataset:
    """A dataset named on the command line or in a plan.

    ``spec`` is ``digits`` (embedded), ``tfds:NAME`` (a prepared TensorFlow Datasets
    set, e.g. ``tfds:cifar10``), a path to an ``.npz`` file, or a folder with one
    sub-folder of images per class. ``num_classes`` is the class count the labels must
    fit, e.g. the model's; default: from the data. ``channels`` (1 or 3) converts the
    images of a folder or tfds set (the others keep theirs); default: as the images are.
    """
    check_channels(channels)
    path = Path(spec)
    if spec == "digits":
        dataset = with_num_classes(digits(split), num_classes)
    elif spec.startswith("tfds:"):
        dataset = from_tfds(spec.removeprefix("tfds:"), split, data_dir=data_dir, image_size=image_size,
                            channels=channels, num_classes=num_classes)
    elif path.suffix == ".npz":
        dataset = from_npz(path, num_classes=num_classes)
    elif path.is_dir():
        dataset = from_folder(path, image_size=image_size, channels=channels, num_classes=num_classes)
    else:
        raise ValueError(
            f"unknown dataset {spec!r}: expected 'digits', 'tfds:NAME', a path to an .npz file "
            "or a folder of class sub-folders"
        )
    return dataset
