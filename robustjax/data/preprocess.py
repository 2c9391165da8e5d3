"""Host-side image preprocessing shared by the file and tfds readers."""

from __future__ import annotations

import numpy as np
from PIL import Image

# The usual evaluation protocol: resize the shorter side to size / 0.875, centre-crop.
CENTER_CROP_FRACTION = 0.875


def resize_center_crop(image: Image.Image, size: int, *, crop_fraction: float = CENTER_CROP_FRACTION) -> Image.Image:
    """Resizes the shorter side to ``round(size / crop_fraction)`` (bilinear), then crops
    the central ``size x size`` square."""
    short = round(size / crop_fraction)
    width, height = image.size
    scale = short / min(width, height)
    image = image.resize((max(size, round(width * scale)), max(size, round(height * scale))), Image.BILINEAR)
    width, height = image.size
    left, top = (width - size) // 2, (height - size) // 2
    return image.crop((left, top, left + size, top + size))


def to_array(image: Image.Image, *, channels: int, image_size: int | None) -> np.ndarray:
    """A PIL image as uint8 (H, W, channels), optionally resized and centre-cropped."""
    image = image.convert({1: "L", 3: "RGB"}[channels])
    if image_size is not None:
        image = resize_center_crop(image, image_size)
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array
