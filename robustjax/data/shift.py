"""Natural distribution shift sets by name: ImageNet-A, -R and -O, ImageNet-C and CIFAR-10-C.

Each is read from its released files in ``data_dir`` when they are there, else from the
tensorflow-datasets builder prepared in ``data_dir`` (tfds' default folder when None):

=============  ==============================================  ==============================
name           released layout under ``data_dir``              tfds builder (read prepared)
=============  ==============================================  ==============================
imagenet-a     ``imagenet-a/<wnid>/*.jpg`` (imagenet-a.tar)    ``imagenet_a``, split test
imagenet-r     ``imagenet-r/<wnid>/*.jpg`` (imagenet-r.tar)    ``imagenet_r``, split test
imagenet-o     ``imagenet-o/<wnid>/*.jpg`` (imagenet-o.tar)    none
imagenet-c     ``ImageNet-C/<corruption>/<severity>/<wnid>/``  ``imagenet2012_corrupted/<c>_<s>``,
                                                               split validation
cifar10-c      ``CIFAR-10-C/<corruption>.npy`` + labels.npy    ``cifar10_corrupted/<c>_<s>``,
                                                               split test
=============  ==============================================  ==============================

Labels are always in the model's label space: ImageNet's 1,000 classes in sorted-wnid order
(the order of tfds' ``imagenet2012`` and of torchvision's ``ImageFolder``), or CIFAR-10's 10.
ImageNet-A, -R and -O cover 200 of the 1,000 classes (:func:`class_indices`); their
evaluation masks the logits to those (Hendrycks et al., "Natural Adversarial Examples", CVPR
2021; "The Many Faces of Robustness", ICCV 2021). The wnid lists ship in ``data/classes``,
copied from ``hendrycks/natural-adv-examples`` (``eval_many_models.py``) and
``hendrycks/imagenet-r`` (``eval.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from robustjax.data.dataset import ImageDataset, check_channels
from robustjax.data.files import image_files, with_image
from robustjax.data.preprocess import to_array
from robustjax.data.tfds import from_tfds

NAMES = ("imagenet-a", "imagenet-r", "imagenet-o", "imagenet-c", "cifar10-c")
CLASS_LISTS = ("imagenet", "imagenet-a", "imagenet-o", "imagenet-r")
# The released archives, to say where to get what is missing.
RELEASES = {
    "imagenet-a": "https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar",
    "imagenet-r": "https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar",
    "imagenet-o": "https://people.eecs.berkeley.edu/~hendrycks/imagenet-o.tar",
    "imagenet-c": "https://zenodo.org/record/2235448 (noise, blur, weather, digital and extra .tar)",
    "cifar10-c": "https://zenodo.org/record/2535967 (CIFAR-10-C.tar)",
}
FOLDERS = {"imagenet-a": "imagenet-a", "imagenet-r": "imagenet-r", "imagenet-o": "imagenet-o",
           "imagenet-c": "ImageNet-C", "cifar10-c": "CIFAR-10-C"}
TFDS = {"imagenet-a": ("imagenet_a", "test"), "imagenet-r": ("imagenet_r", "test"),
        "imagenet-c": ("imagenet2012_corrupted", "validation"), "cifar10-c": ("cifar10_corrupted", "test")}
# CIFAR-10-C's .npy files: each corruption's 50,000 images are severities 1..5, 10,000 each.
CIFAR10_C_PER_SEVERITY = 10_000


@functools.cache
def wnids(name: str = "imagenet") -> tuple[str, ...]:
    """The WordNet ids of a class list (:data:`CLASS_LISTS`), sorted: ``"imagenet"`` (1,000)
    or the 200 of ``"imagenet-a"``, ``"imagenet-o"`` or ``"imagenet-r"``."""
    if name not in CLASS_LISTS:
        raise ValueError(f"unknown class list {name!r}; expected one of {list(CLASS_LISTS)}")
    text = (Path(__file__).parent / "classes" / f"{name.replace('-', '_')}.txt").read_text()
    return tuple(line for line in text.splitlines() if line and not line.startswith("#"))


@functools.cache
def class_indices(name: str) -> tuple[int, ...]:
    """The indices among ImageNet's 1,000 classes (sorted wnids) of a 200-class list."""
    position = {wnid: index for index, wnid in enumerate(wnids("imagenet"))}
    return tuple(position[wnid] for wnid in wnids(name))


@dataclasses.dataclass(frozen=True)
class ShiftSet:
    """A natural-shift set ready to evaluate.

    ``kind`` is ``"classification"`` (``dataset``: labelled images), ``"ood"`` (``dataset``:
    out-of-distribution images, labels meaningless) or ``"corruptions"`` (``corrupted[(c, s)]``:
    one labelled set per corruption and severity). ``num_classes`` is the class count the model
    must predict (1,000 or 10); ``subset`` the classes its logits are masked to (None: all).
    ``source`` says where the images come from.
    """

    name: str
    kind: str
    source: str
    num_classes: int
    subset: tuple[int, ...] | None = None
    dataset: ImageDataset | None = None
    corrupted: dict[tuple[str, int], ImageDataset] = dataclasses.field(default_factory=dict, repr=False)


def default_data_dir() -> Path:
    """tfds' default data folder (``~/tensorflow_datasets``, or ``$TFDS_DATA_DIR``)."""
    import os

    return Path(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")).expanduser()


def load_shift(name: str, *, data_dir: str | Path | None = None, image_size: int | None = None,
               channels: int | None = None, corruptions: tuple[str, ...] = (),
               severities: tuple[int, ...] = (1, 2, 3, 4, 5)) -> ShiftSet:
    """The set ``name`` (:data:`NAMES`), from its released files in ``data_dir`` or its
    prepared tfds builder. ``image_size`` resizes (shorter side to ``image_size / 0.875``) and
    centre-crops images of varying size; without it all images must share one size.
    ``corruptions`` and ``severities`` choose the parts of ImageNet-C and CIFAR-10-C."""
    if name not in NAMES:
        import difflib

        close = difflib.get_close_matches(name, NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown natural-shift dataset {name!r}{hint}; expected one of {list(NAMES)}")
    check_channels(channels)
    root = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    folder = root / FOLDERS[name]
    if name in ("imagenet-c", "cifar10-c"):
        if not corruptions:
            raise ValueError(f"{name}: name at least one corruption")
        # The released images are already at their evaluation size (ImageNet-C: 224 x 224 centre
        # crops): resizing and cropping them again would change the benchmark, so they are read as stored.
        if folder.is_dir():
            read = _cifar10_c_file if name == "cifar10-c" else functools.partial(_imagenet_c_folder, channels=channels)
            corrupted = {(c, s): read(folder, c, s) for c in corruptions for s in severities}
            source = str(folder)
        else:
            builder, split = TFDS[name]
            corrupted = {(c, s): _tfds_part(name, f"{builder}/{c}_{s}", split, root, data_dir, None, channels)
                         for c in corruptions for s in severities}
            source = f"tfds:{builder}/{split}"
        stored = next(iter(corrupted.values())).image_shape
        if image_size is not None and image_size != stored[0]:
            raise ValueError(f"{name}: its images are {stored[0]}x{stored[1]} and are evaluated as stored; "
                             f"image_size={image_size} asks for another size: evaluate a model of input size "
                             f"{stored[0]}")
        return ShiftSet(name, "corruptions", source, 10 if name == "cifar10-c" else 1000, corrupted=corrupted)
    subset = class_indices(name)
    if folder.is_dir():
        dataset = wnid_folder(folder, allowed=wnids(name), image_size=image_size, channels=channels, name=name)
        source = str(folder)
    elif name in TFDS:
        builder, split = TFDS[name]
        dataset = _tfds_part(name, builder, split, root, data_dir, image_size, channels)
        dataset = _labels_within(dataset, subset, name)
        source = f"tfds:{builder}/{split}"
    else:
        raise ValueError(f"{name}: no folder {folder} (tensorflow-datasets has no builder for it); download "
                         f"{RELEASES[name]} and extract it in {root}, which gives {folder}/<wnid>/*.jpg")
    kind = "ood" if name == "imagenet-o" else "classification"
    return ShiftSet(name, kind, source, 1000, subset, dataset)


def _tfds_part(name: str, builder: str, split: str, root: Path, data_dir, image_size, channels) -> ImageDataset:
    """A prepared tfds set; a missing one names both ways to provide it, on one line."""
    try:
        return from_tfds(builder, split, data_dir=None if data_dir is None else str(data_dir), image_size=image_size,
                         channels=channels)
    except ValueError as error:
        manual = ""
        if builder.startswith("imagenet2012_corrupted"):
            manual = (f" (its build generates the corruptions from ImageNet: put ILSVRC2012_img_train.tar and "
                      f"ILSVRC2012_img_val.tar, from https://image-net.org, in {root / 'downloads' / 'manual'})")
        raise ValueError(f"{name}: no released files in {root / FOLDERS[name]} ({RELEASES[name]}), and {error}"
                         f"{manual}") from None


def _labels_within(dataset: ImageDataset, subset: tuple[int, ...], name: str) -> ImageDataset:
    """``dataset`` whose every batch is checked to hold only labels of ``subset``: a masked
    prediction could never be right on another label."""
    allowed = np.zeros(1000, bool)
    allowed[list(subset)] = True

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        images, labels = dataset.read(indices)
        labels = np.asarray(labels)
        if (bad := labels[(labels < 0) | (labels >= 1000) | ~allowed[np.clip(labels, 0, 999)]]).size:
            raise ValueError(f"{name}: label {int(bad[0])} is not one of its {len(subset)} classes; the prepared "
                             f"set {dataset.name!r} is not {name}")
        return images, labels

    return dataclasses.replace(dataset, read=read)


def _image_reader(files: list[Path], labels: np.ndarray, channels: int, image_size: int | None,
                  shape: tuple[int, int, int]) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def load(file: Path) -> np.ndarray:
        return with_image(file, lambda image: to_array(image, channels=channels, image_size=image_size))

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        images = []
        for i in indices:
            image = load(files[i])
            if image.shape != shape:
                raise ValueError(f"{files[i]} has shape {image.shape}, {files[0].name} has {shape}; pass "
                                 "image_size (robustjax evaluate --image-size) to resize all images to one size")
            images.append(image)
        return np.stack(images), labels[indices]

    return read


def _channels_of(files: list[Path], channels: int | None) -> int:
    if channels is not None:
        return channels
    grey = all(with_image(file, lambda image: Image.getmodebase(image.mode) == "L") for file in files)
    return 1 if grey else 3


def check_one_size(files: list[Path], what: str) -> None:
    """Refuses image files of different sizes (read from their headers), naming two."""
    sizes = {}
    for file in files:
        size = with_image(file, lambda image: image.size)
        sizes.setdefault(size, file)
        if len(sizes) > 1:
            (a, file_a), (b, file_b) = list(sizes.items())[:2]
            raise ValueError(f"{what}: images of different sizes ({file_a.name} is {a[0]}x{a[1]}, {file_b.name} is "
                             f"{b[0]}x{b[1]}); pass image_size (robustjax evaluate --image-size) to resize them")


def wnid_folder(root: str | Path, *, allowed: tuple[str, ...] | None = None, image_size: int | None = None,
                channels: int | None = None, name: str | None = None, check_sizes: bool = True) -> ImageDataset:
    """Images in ``root/<wnid>/**``, labelled with each wnid's index among ImageNet's 1,000
    classes (sorted wnids), as the released ImageNet-A, -R, -O and -C folders hold them.
    Every sub-folder must be one of ``allowed`` (default: the 1,000). Without ``image_size``
    all images must share one size (checked on their headers when ``check_sizes``)."""
    root = Path(root)
    name = name or root.name
    allowed = wnids("imagenet") if allowed is None else allowed
    position = {wnid: index for index, wnid in enumerate(wnids("imagenet"))}
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if unknown := [p.name for p in folders if p.name not in set(allowed)]:
        raise ValueError(f"{name}: {root} has sub-folder(s) {unknown[:3]} that are not among its {len(allowed)} "
                         "ImageNet classes (wnids like n01498041)")
    files, labels = [], []
    for folder in folders:
        found = image_files(folder)
        files += found
        labels += [position[folder.name]] * len(found)
    if not files:
        raise ValueError(f"{name}: expected images in wnid sub-folders of {root}, found none")
    if image_size is None and check_sizes:
        check_one_size(files, f"{name} ({root})")
    channels = _channels_of(files[:1], channels) if channels is None else channels
    first = with_image(files[0], lambda image: to_array(image, channels=channels, image_size=image_size))
    return ImageDataset(name=name, num_examples=len(files), num_classes=1000, image_shape=first.shape,
                        read=_image_reader(files, np.asarray(labels, np.int32), channels, image_size, first.shape))


def image_files_folder(root: str | Path, *, num_classes: int, image_size: int | None = None,
                       channels: int | None = None) -> ImageDataset:
    """Every image under ``root`` (any layout), unlabelled (all labels 0 of ``num_classes``):
    an out-of-distribution set. Without ``image_size`` all images must share one size."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"no folder of out-of-distribution images at {str(root)!r}")
    check_channels(channels)
    files = image_files(root)
    if not files:
        raise ValueError(f"{root}: expected out-of-distribution images (any layout), found none")
    if image_size is None:
        check_one_size(files, str(root))
    channels = _channels_of(files, channels)
    first = with_image(files[0], lambda image: to_array(image, channels=channels, image_size=image_size))
    return ImageDataset(name=f"folder:{root}", num_examples=len(files), num_classes=num_classes,
                        image_shape=first.shape,
                        read=_image_reader(files, np.zeros(len(files), np.int32), channels, image_size, first.shape))


def _imagenet_c_folder(root: Path, corruption: str, severity: int, *, channels: int | None) -> ImageDataset:
    folder = root / corruption / str(severity)
    if not folder.is_dir():
        raise ValueError(f"imagenet-c: no folder {folder}; the released ImageNet-C holds "
                         f"{root}/<corruption>/<severity>/<wnid>/*.JPEG ({RELEASES['imagenet-c']})")
    # The released images are all 224 x 224: reading 50,000 headers per part would only cost time.
    return wnid_folder(folder, channels=channels, name=f"imagenet-c/{corruption}/{severity}", check_sizes=False)


def _cifar10_c_file(root: Path, corruption: str, severity: int) -> ImageDataset:
    """Severity ``severity`` of ``root/<corruption>.npy``: rows (s-1)*10,000 to s*10,000, labels
    from ``root/labels.npy``; memory-mapped, never unpickled."""
    name = f"cifar10-c/{corruption}/{severity}"
    paths = {"images": root / f"{corruption}.npy", "labels": root / "labels.npy"}
    for path in paths.values():
        if not path.is_file():
            raise ValueError(f"{name}: no file {path}; the released CIFAR-10-C holds one <corruption>.npy per "
                             f"corruption and labels.npy ({RELEASES['cifar10-c']})")
    try:
        images = np.load(paths["images"], mmap_mode="r", allow_pickle=False)
        labels = np.load(paths["labels"], mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{name}: {paths['images']} or labels.npy is not a numeric .npy array ({error})") from None
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or images.dtype != np.uint8:
        raise ValueError(f"{name}: {paths['images']} must hold uint8 images (N, H, W, 3), got "
                         f"{images.dtype} {images.shape}")
    per_severity, rest = divmod(images.shape[0], 5)
    if rest or labels.shape != (images.shape[0],):
        raise ValueError(f"{name}: expected 5 severities of equal size and one label per image, got "
                         f"{images.shape[0]} images and labels of shape {labels.shape}")
    offset = (severity - 1) * per_severity

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = offset + np.asarray(indices)
        return np.asarray(images[rows]), np.asarray(labels[rows]).astype(np.int64)

    return ImageDataset(name=name, num_examples=per_severity, num_classes=10, image_shape=tuple(images.shape[1:]),
                        read=read)
