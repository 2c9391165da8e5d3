"""Datasets from local files: ``.npz`` archives and class-per-folder image trees."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from robustjax.data.dataset import ImageDataset, from_arrays
from robustjax.data.preprocess import to_array

NPZ_KEYS = (("images", "labels"), ("x", "y"))


def from_npz(path: str | Path, *, num_classes: int | None = None) -> ImageDataset:
    """Images and labels from an ``.npz`` file with keys ``images``/``labels`` (or ``x``/``y``).

    Images are (N, H, W, C) or (N, H, W), uint8 or float in [0, 1]. Pickled objects are
    refused (``allow_pickle=False``).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no .npz file at {str(path)!r}")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not an archive of named arrays")
        with loaded as npz:
            keys = next((pair for pair in NPZ_KEYS if set(pair) <= set(npz.files)), None)
            found = sorted(npz.files)
            images, labels = (npz[key] for key in keys) if keys else (None, None)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:  # ValueError: pickled data, refused
        raise ValueError(f"{path} is not a readable .npz file of arrays: {error}") from None
    if keys is None:
        raise ValueError(f"{path}: expected arrays named 'images' and 'labels' (or 'x' and 'y'), found {found}")
    return from_arrays(images, labels, name=path.name, num_classes=num_classes)


def _image_files(folder: Path) -> list[Path]:
    extensions = {ext.lower() for ext in Image.registered_extensions()}
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in extensions)


def from_folder(path: str | Path, *, image_size: int | None = None, channels: int = 3) -> ImageDataset:
    """Images in ``path/<class_name>/**/<image>``, one sub-folder per class (sorted by name).

    With ``image_size``, each image is resized (shorter side to ``image_size / 0.875``)
    and centre-cropped to ``image_size`` squared; without it all images must share one size.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"no image folder at {str(root)!r}")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for label, class_dir in enumerate(class_dirs):
        class_files = _image_files(class_dir)
        files += class_files
        labels += [label] * len(class_files)
    if not files:
        raise ValueError(f"{root}: expected one sub-folder of images per class, found no images")
    labels = np.asarray(labels, np.int32)

    def load(file: Path) -> np.ndarray:
        try:
            with Image.open(file) as image:
                return to_array(image, channels=channels, image_size=image_size)
        except OSError as error:
            raise ValueError(f"{file}: not a readable image ({error})") from None

    first = load(files[0])

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        images = []
        for i in indices:
            image = load(files[i])
            if image.shape != first.shape:
                raise ValueError(
                    f"{files[i]} has shape {image.shape}, {files[0].name} has {first.shape}; "
                    "pass image_size to resize all images to one size"
                )
            images.append(image)
        return np.stack(images), labels[indices]

    return ImageDataset(
        name=root.name,
        num_examples=len(files),
        num_classes=max(len(class_dirs), 2),
        image_shape=first.shape,
        read=read,
        class_names=tuple(d.name for d in class_dirs),
    )
