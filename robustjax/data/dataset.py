"""A labelled image set, read in batches of float32 NHWC images in [0, 1]."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from robustjax.checks import check_images, check_labels, check_positive_int

Reader = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def to_unit_float(images: np.ndarray, *, source: str) -> np.ndarray:
    """uint8 images become float32 / 255; float images must already lie in [0, 1]."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if np.issubdtype(images.dtype, np.floating):
        return images.astype(np.float32)
    raise TypeError(f"{source}: images must be uint8 or float in [0, 1], got dtype {images.dtype}")


@dataclasses.dataclass(frozen=True)
class ImageDataset:
    """Random-access labelled images.

    ``read(indices)`` returns ``(images, labels)`` for those indices; every batch it
    returns is validated (float32 NHWC in [0, 1], int32 labels in range), so malformed
    data fails with an error naming the dataset instead of producing a wrong number.
    """

    name: str
    num_examples: int
    num_classes: int
    image_shape: tuple[int, int, int]
    read: Reader = dataclasses.field(repr=False)
    class_names: tuple[str, ...] | None = None

    def batches(
        self, batch_size: int, *, limit: int | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields ``(images, labels)`` in order; the last batch may be smaller."""
        check_positive_int(batch_size, "batch_size")
        total = self.num_examples if limit is None else min(limit, self.num_examples)
        for start in range(0, total, batch_size):
            indices = np.arange(start, min(start + batch_size, total))
            yield self._validated(*self.read(indices))

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (validated) examples at ``indices``."""
        return self._validated(*self.read(np.asarray(indices)))

    def arrays(self, *, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The whole set (or its first ``limit`` examples) as two arrays."""
        total = self.num_examples if limit is None else min(limit, self.num_examples)
        return self._validated(*self.read(np.arange(total)))

    def _validated(self, images, labels) -> tuple[np.ndarray, np.ndarray]:
        images = to_unit_float(images, source=f"dataset {self.name!r}")
        labels = np.asarray(labels)
        try:
            check_images(images, name="images", input_shape=self.image_shape)
            check_labels(labels, num_classes=self.num_classes, batch_size=images.shape[0], name="labels")
        except (TypeError, ValueError) as error:
            raise type(error)(f"dataset {self.name!r}: {error}") from None
        return images, labels.astype(np.int32)  # in range, so the cast keeps every label


def from_arrays(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    name: str = "arrays",
    num_classes: int | None = None,
    class_names: tuple[str, ...] | None = None,
) -> ImageDataset:
    """An in-memory dataset from NHWC images (uint8, or float in [0, 1]) and int labels.

    Labels must be class indices below ``num_classes`` (default: ``max(labels) + 1``).
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise ValueError(f"{name}: images must be (N, H, W, C) or (N, H, W), got shape {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{name}: labels must have shape ({images.shape[0]},) to match the images, got {labels.shape}"
        )
    if images.shape[0] == 0:
        raise ValueError(f"{name}: the dataset is empty (images of shape {images.shape})")
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"{name}: labels must be integers, got dtype {labels.dtype}")
    if num_classes is not None:
        check_positive_int(num_classes, f"{name}: num_classes")
    try:
        check_labels(labels, num_classes=num_classes, batch_size=labels.shape[0], name=f"{name}: labels")
    except ValueError as error:
        given = "" if num_classes is None else f"; fix the labels or num_classes={num_classes}"
        raise ValueError(f"{error}{given}") from None
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    dataset = ImageDataset(
        name=name,
        num_examples=int(images.shape[0]),
        num_classes=max(int(num_classes), 2),
        image_shape=tuple(int(d) for d in images.shape[1:]),
        read=lambda indices: (images[indices], labels[indices]),
        class_names=class_names,
    )
    dataset.arrays(limit=None)  # validate every example once, up front
    return dataset


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The example indices of training step ``step``: epochs of permutations seeded by (seed,
    epoch), cut into full batches (the remainder of an epoch is left out, so shapes never
    change). A function of (seed, step) alone, so a resumed run sees the batches an
    uninterrupted one sees."""
    per_epoch = max(1, num_examples // batch_size)
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    return order[position * batch_size:(position + 1) * batch_size]


def with_num_classes(dataset: ImageDataset, num_classes: int | None) -> ImageDataset:
    """``dataset`` counted as ``num_classes`` classes, which must cover its own (None: as it is)."""
    if num_classes is None:
        return dataset
    check_positive_int(num_classes, "num_classes")
    if dataset.num_classes > num_classes:
        raise ValueError(
            f"dataset {dataset.name!r} has {dataset.num_classes} classes, more than num_classes={num_classes}"
        )
    return dataclasses.replace(dataset, num_classes=num_classes)


def check_channels(channels: int | None) -> None:
    """``channels`` must be None (as the images are), 1 (grey) or 3 (RGB)."""
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1, 3 or None (as the images are), got {channels!r}")
