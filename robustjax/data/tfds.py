"""Any TensorFlow Datasets image-classification set, read without TensorFlow.

Uses the builder's ``as_data_source`` (random access over prepared ``array_record``
files), so the dataset must already be prepared in ``data_dir`` (``tfds build NAME
--file_format array_record``); nothing is downloaded here.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from robustjax.data.dataset import ImageDataset, check_channels, with_num_classes
from robustjax.data.preprocess import to_array


def from_tfds(
    name: str,
    split: str = "test",
    *,
    data_dir: str | None = None,
    image_key: str = "image",
    label_key: str = "label",
    image_size: int | None = None,
    channels: int | None = None,
    num_classes: int | None = None,
) -> ImageDataset:
    """``name`` (e.g. ``cifar10``, ``svhn_cropped``, ``imagenet2012``) and ``split`` from tfds.

    Datasets whose images vary in size (ImageNet) need ``image_size``: images are resized
    (shorter side to ``image_size / 0.875``) and centre-cropped. ``channels`` (1 or 3)
    converts the images (grey to RGB or RGB to grey); default: as stored. ``num_classes``
    (e.g. the model's) must be at least the dataset's; default: the dataset's.
    tensorflow-datasets is imported here rather than with robustjax, which it would slow down.
    """
    import tensorflow_datasets as tfds

    check_channels(channels)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ValueError(f"unknown tfds dataset {name!r}: {str(error).splitlines()[0]}") from None
    features = builder.info.features
    for key, kind in ((image_key, tfds.features.Image), (label_key, tfds.features.ClassLabel)):
        if key not in features or not isinstance(features[key], kind):
            raise ValueError(
                f"tfds dataset {name!r} has no {kind.__name__} feature {key!r}; its features are {list(features)}"
            )
    image_feature, label_feature = features[image_key], features[label_key]
    try:
        source = builder.as_data_source(split=split)
    except Exception as error:  # tfds raises several types for a missing or unprepared split
        raise ValueError(_unreadable(builder, name, split, error)) from None
    shape = tuple(image_feature.shape)
    if image_size is None and None in shape[:2]:
        raise ValueError(f"tfds dataset {name!r} has images of varying size {shape}; pass image_size")
    stored = shape[-1] or 3
    channels = channels or stored

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        examples = [source[int(i)] for i in indices]
        images = [np.asarray(example[image_key]) for example in examples]
        if image_size is not None or channels != stored:
            images = [
                to_array(Image.fromarray(img.squeeze(-1) if img.shape[-1] == 1 else img),
                         channels=channels, image_size=image_size)
                for img in images
            ]
        labels = np.asarray([example[label_key] for example in examples])
        return np.stack(images), labels

    height, width = (image_size, image_size) if image_size is not None else shape[:2]
    dataset = ImageDataset(
        name=f"{name}/{split}",
        num_examples=len(source),
        num_classes=label_feature.num_classes,
        image_shape=(int(height), int(width), channels),
        read=read,
        class_names=tuple(label_feature.names),
    )
    return with_num_classes(dataset, num_classes)


def _unreadable(builder, name: str, split: str, error: Exception) -> str:
    """Why ``builder``'s ``split`` cannot be read, and what to do, on one line."""
    from tensorflow_datasets.core import dataset_info, file_adapters

    root = builder.data_dir_root
    build = f"tfds build {name} --data_dir {root} --file_format array_record"
    if not dataset_info.dataset_info_path(builder.data_path).exists():
        return (f"tfds dataset {name!r} is not prepared in {root}; prepare it with `{build}` "
                "(robustjax reads array_record files without TensorFlow)")
    formats = builder.info.available_file_formats()
    if not formats & file_adapters.FileFormat.with_random_access():
        stored = ", ".join(sorted(f.value for f in formats))
        return (f"tfds dataset {name!r} is prepared in {root} as {stored} files, which need TensorFlow; "
                f"rebuild it with `{build} --overwrite`")
    first_line = next(iter(str(error).splitlines()), type(error).__name__)
    return f"cannot read tfds {name!r} split {split!r}: {first_line}"
