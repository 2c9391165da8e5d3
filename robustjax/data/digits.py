"""The embedded default dataset: the 8x8 handwritten digits that scikit-learn ships.

1,797 real images of the digits 0-9 (UCI "Optical Recognition of Handwritten Digits",
E. Alpaydin and C. Kaynak, 1998, CC BY 4.0), 16 grey levels each. ``digits.npz`` holds
them exactly as ``sklearn.datasets.load_digits()`` returns them (a test checks this) and a
fixed split: 500 test and 1,297 train examples, drawn once with
``numpy.random.default_rng(0).permutation`` and stored, so the split never changes.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

from robustjax.data.dataset import ImageDataset, from_arrays

SPLITS = ("train", "test", "all")
GREY_LEVELS = 16


@functools.cache
def _load_file() -> dict[str, np.ndarray]:
    with resources.files("robustjax.data").joinpath("digits.npz").open("rb") as f, np.load(f, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def digits(split: str = "test") -> ImageDataset:
    """The embedded digits as 8x8x1 float32 images in [0, 1] (grey level / 16)."""
    if split not in SPLITS:
        raise ValueError(f"digits has splits {list(SPLITS)}, got {split!r}")
    data = _load_file()
    indices = np.arange(len(data["labels"])) if split == "all" else data[f"{split}_indices"]
    images = data["images"][indices, :, :, None].astype(np.float32) / GREY_LEVELS
    return from_arrays(
        images,
        data["labels"][indices].astype(np.int32),
        name=f"digits/{split}",
        num_classes=10,
        class_names=tuple(str(d) for d in range(10)),
    )
