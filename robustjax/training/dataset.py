"""The training split of a dataset named on the command line, refused before training
when the dataset has no such split."""

from __future__ import annotations

from pathlib import Path

from robustjax import data
from robustjax.data.dataset import ImageDataset
from robustjax.data.digits import SPLITS as DIGITS_SPLITS


def training_dataset(spec: str, split: str = "train", *, data_dir: str | None = None,
                     image_size: int | None = None, num_classes: int | None = None,
                     channels: int | None = None) -> ImageDataset:
    """``split`` of ``spec`` (as ``data.load`` names datasets). A ``.npz`` file or an image
    folder has no splits: all of it is the training set. A digits or tfds dataset without
    ``split`` is refused, naming the splits it has."""
    if spec == "digits" and split not in DIGITS_SPLITS:
        raise ValueError(f"dataset 'digits' has no {split!r} split to train on; its splits: {list(DIGITS_SPLITS)}")
    if spec.startswith("tfds:"):
        import tensorflow_datasets as tfds

        name = spec.removeprefix("tfds:")
        try:
            splits = list(tfds.builder(name, data_dir=data_dir).info.splits.keys())
        except tfds.core.registered.DatasetNotFoundError as error:
            raise ValueError(f"unknown tfds dataset {name!r}: {str(error).splitlines()[0]}") from None
        if splits and split not in splits:
            raise ValueError(f"tfds dataset {name!r} has no {split!r} split to train on; its splits: {sorted(splits)}"
                             " (pass --split to choose one)")
    elif Path(spec).suffix == ".npz" or Path(spec).is_dir():
        split = "all"
    return data.load(spec, split, data_dir=data_dir, image_size=image_size, num_classes=num_classes,
                     channels=channels)
