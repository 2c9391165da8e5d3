"""Any TensorFlow Datasets image-classification set, read without TensorFlow.

Uses ``tfds.data_source`` (random access over prepared ``array_record`` files), so the
dataset must already be prepared in ``data_dir`` (``tfds build NAME`` or
``tfds.builder(NAME).download_and_prepare()``); nothing is downloaded here.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from robustjax.data.dataset import ImageDataset
from robustjax.data.preprocess import to_array


def from_tfds(
    name: str,
    split: str = "test",
    *,
    data_dir: str | None = None,
    image_key: str = "image",
    label_key: str = "label",
    image_size: int | None = None,
) -> ImageDataset:
    """``name`` (e.g. ``cifar10``, ``svhn_cropped``, ``imagenet2012``) and ``split`` from tfds.

    Datasets whose images vary in size (ImageNet) need ``image_size``: images are resized
    (shorter side to ``image_size / 0.875``) and centre-cropped. tensorflow-datasets is
    imported here rather than with robustjax, which it would slow down.
    """
    import tensorflow_datasets as tfds

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
    shape = tuple(image_feature.shape)
    if image_size is None and None in shape[:2]:
        raise ValueError(f"tfds dataset {name!r} has images of varying size {shape}; pass image_size")
    channels = shape[-1] or 3
    try:
        source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as error:  # tfds raises several types for a missing or unprepared split
        raise ValueError(f"cannot read tfds {name!r} split {split!r}: {error}") from None

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        examples = [source[int(i)] for i in indices]
        images = [np.asarray(example[image_key]) for example in examples]
        if image_size is not None:
            images = [
                to_array(Image.fromarray(img.squeeze(-1) if img.shape[-1] == 1 else img),
                         channels=channels, image_size=image_size)
                for img in images
            ]
        labels = np.asarray([example[label_key] for example in examples])
        return np.stack(images), labels

    image_shape = (image_size, image_size, channels) if image_size is not None else shape
    return ImageDataset(
        name=f"{name}/{split}",
        num_examples=len(source),
        num_classes=label_feature.num_classes,
        image_shape=tuple(int(d) for d in image_shape),
        read=read,
        class_names=tuple(label_feature.names),
    )
