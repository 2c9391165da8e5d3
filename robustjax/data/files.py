"""Datasets from local files: ``.npz`` archives and class-per-folder image trees."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from robustjax.data.dataset import ImageDataset, check_channels, from_arrays, with_num_classes
from robustjax.data.preprocess import to_array

NPZ_KEYS = (("images", "labels"), ("x", "y"))


def from_npz(path: str | Path, *, num_classes: int | None = None) -> ImageDataset:
    """Images and labels from an ``.npz`` file with keys ``images``/``labels`` (or ``x``/``y``).

    Images are (N, H, W, C) or (N, H, W), uint8 or float in [0, 1]; labels are class
    indices below ``num_classes`` (default: from the labels). Object arrays are refused
    (``allow_pickle=False``): loading them would run pickled code.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no .npz file at {str(path)!r}")
    images, labels = _npz_arrays(path)
    return from_arrays(images, labels, name=path.name, num_classes=num_classes)


def _npz_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The images and labels stored in the .npz archive at ``path``."""
    savez = "write one with numpy.savez(path, images=..., labels=...)"
    if not zipfile.is_zipfile(path):
        with path.open("rb") as file:
            npy = file.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX
        kind = "a single array saved by numpy.save" if npy else "not a zip file"
        raise ValueError(f"{path} is not an .npz archive ({kind}); {savez}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            found = sorted(npz.files)
            keys = next((pair for pair in NPZ_KEYS if set(pair) <= set(found)), None)
            arrays = tuple(npz[key] for key in keys) if keys else None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        if "allow_pickle" in str(error):  # numpy's refusal of an object array
            raise ValueError(f"{path} holds object arrays (pickled Python objects), refused for safety; "
                             "save numeric arrays") from None
        raise ValueError(f"{path} is a corrupt .npz archive ({error}); {savez}") from None
    if arrays is None:
        raise ValueError(f"{path}: expected arrays named 'images' and 'labels' (or 'x' and 'y'), found {found}")
    return arrays


def image_files(folder: Path) -> list[Path]:
    """The image files under ``folder`` (any depth), by every extension Pillow reads, sorted."""
    extensions = {ext.lower() for ext in Image.registered_extensions()}
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in extensions)


def with_image(file: Path, use):
    """``use(image)`` on the image in ``file``; an unreadable file is a ValueError naming it."""
    try:
        with Image.open(file) as image:
            return use(image)
    except OSError as error:
        raise ValueError(f"{file}: not a readable image ({error})") from None


def _is_grey(image: Image.Image) -> bool:
    return Image.getmodebase(image.mode) == "L"  # 1, L, LA, I, I;16, F: read from the header


def from_folder(
    path: str | Path, *, image_size: int | None = None, channels: int | None = None,
    num_classes: int | None = None,
) -> ImageDataset:
    """Images in ``path/<class_name>/**/<image>``, one sub-folder per class (sorted by name).

    With ``image_size``, each image is resized (shorter side to ``image_size / 0.875``)
    and centre-cropped to ``image_size`` squared; without it all images must share one size.
    ``channels`` is 1 (grey) or 3 (RGB), or None for as the images are: 1 when every image
    is greyscale (its mode, read from the file's header), else 3. ``num_classes`` (e.g. the
    model's class count) must be at least the number of sub-folders; default: that number.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"no image folder at {str(root)!r}")
    check_channels(channels)
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for label, class_dir in enumerate(class_dirs):
        class_files = image_files(class_dir)
        files += class_files
        labels += [label] * len(class_files)
    if not files:
        raise ValueError(f"{root}: expected one sub-folder of images per class, found no images")
    labels = np.asarray(labels, np.int32)
    if channels is None:
        channels = 1 if all(with_image(file, _is_grey) for file in files) else 3

    def load(file: Path) -> np.ndarray:
        return with_image(file, lambda image: to_array(image, channels=channels, image_size=image_size))

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

    dataset = ImageDataset(
        name=root.name,
        num_examples=len(files),
        num_classes=max(len(class_dirs), 2),
        image_shape=first.shape,
        read=read,
        class_names=tuple(d.name for d in class_dirs),
    )
    return with_num_classes(dataset, num_classes)
