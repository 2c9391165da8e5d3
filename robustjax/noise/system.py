"""System noise (ImageNet-S, RobustART, Tang et al. 2021): the same encoded image decoded
and resized by different libraries, and a classifier's accuracy under each combination.

A variant is a (decoder, resize mode) pair. The pipeline is RobustART's evaluation
transform: decode the encoded bytes to RGB, resize the *whole* image to
``resize_to x resize_to`` (aspect ratio not kept; ``resize_to = int(crop * 8 / 7)``, 256
for a 224 crop), centre-crop ``crop x crop`` at offset ``round((resize_to - crop) / 2)``.

Decoders (all three are RobustART's):

- ``"pil"``: ``Image.open(...).convert("RGB")`` (Pillow's libjpeg-turbo, libpng, ...);
- ``"opencv"``: ``cv2.imdecode(..., IMREAD_COLOR)`` then BGR -> RGB (OpenCV's own
  libjpeg-turbo build; unlike Pillow it applies the EXIF orientation);
- ``"ffmpeg"``: FFmpeg's decoders through PyAV (``av``, whose wheels bundle FFmpeg), the
  first frame converted to ``rgb24`` with swscale's bicubic flags, as RobustART's
  ``ffmpeg -i FILE -f rawvideo -pix_fmt rgb24`` does. FFmpeg has its own JPEG decoder and
  chroma upsampling, so it differs from the other two. (torchvision's ``decode_image`` was
  not chosen: it is libjpeg-turbo with the same defaults, bit-identical to Pillow here.)

Resize modes: Pillow's six filters (``pil-nearest``, ``pil-bilinear``, ``pil-bicubic``,
``pil-box``, ``pil-hamming``, ``pil-lanczos``) and OpenCV's five interpolations
(``opencv-nearest``, ``opencv-linear``, ``opencv-area``, ``opencv-cubic``,
``opencv-lanczos4``), named after each library's constants (RobustART calls them
``pil-cubic``, ``opencv-bilinear`` and ``opencv-lanczos``).

RobustART summarises a model by the mean and standard deviation of its accuracy over the
variants and reports the negative standard deviation (higher is more robust). Which
standard deviation is unverified; this uses the population one (``ddof=0``).

Decoding runs on the host; the classifier sees fixed-size padded batches through one
jitted forward pass, compiled once for all variants. Each image is decoded once per
decoder and resized from that for every resize mode.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import itertools
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int
from PIL import Image

from robustjax.checks import check_choice, check_labels, check_positive_int
from robustjax.classifier import Classifier

DECODERS: tuple[str, ...] = ("pil", "opencv", "ffmpeg")
# resize mode -> (library, name of the library's constant)
RESIZE_MODES: dict[str, tuple[str, str]] = {
    "pil-nearest": ("pil", "NEAREST"),
    "pil-bilinear": ("pil", "BILINEAR"),
    "pil-bicubic": ("pil", "BICUBIC"),
    "pil-box": ("pil", "BOX"),
    "pil-hamming": ("pil", "HAMMING"),
    "pil-lanczos": ("pil", "LANCZOS"),
    "opencv-nearest": ("opencv", "INTER_NEAREST"),
    "opencv-linear": ("opencv", "INTER_LINEAR"),
    "opencv-area": ("opencv", "INTER_AREA"),
    "opencv-cubic": ("opencv", "INTER_CUBIC"),
    "opencv-lanczos4": ("opencv", "INTER_LANCZOS4"),
}
# The optional library behind each decoder or resize library: (module, pip package).
_OPTIONAL = {"opencv": ("cv2", "opencv-python-headless"), "ffmpeg": ("av", "av")}


def _optional_module(library: str):
    module, package = _OPTIONAL[library]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"the {library!r} system-noise variants need the {module!r} module: "
                          f"pip install {package}") from error


def available_decoders() -> tuple[str, ...]:
    """The decoders whose libraries can be imported here."""
    available = []
    for decoder in DECODERS:
        try:
            if decoder in _OPTIONAL:
                _optional_module(decoder)
        except ImportError:
            continue
        available.append(decoder)
    return tuple(available)


@dataclasses.dataclass(frozen=True)
class SystemNoiseVariant:
    """One decoder and one resize mode (see the module docstring for the names)."""

    decoder: str
    resize: str

    def __post_init__(self):
        if self.decoder not in DECODERS:
            raise ValueError(f"unknown decoder {self.decoder!r}; valid decoders: {', '.join(DECODERS)}")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"unknown resize mode {self.resize!r}; valid modes: {', '.join(RESIZE_MODES)}")

    @property
    def name(self) -> str:
        return f"{self.decoder}+{self.resize}"


def variants(decoders: Iterable[str] | None = None,
             resizes: Iterable[str] | None = None) -> list[SystemNoiseVariant]:
    """Every (decoder, resize mode) pair; by default all resize modes and the decoders
    that are installed (``available_decoders()``; all three give 33 variants)."""
    decoders = available_decoders() if decoders is None else tuple(decoders)
    resizes = tuple(RESIZE_MODES) if resizes is None else tuple(resizes)
    return [SystemNoiseVariant(d, r) for d, r in itertools.product(decoders, resizes)]


_all_variants = variants  # evaluate_system_noise's argument shadows the name


def _undecodable(decoder: str, error: Exception | None = None) -> ValueError:
    detail = f": {error}" if error is not None else ""
    return ValueError(f"decoder {decoder!r} could not decode the encoded image{detail}")


def decode(encoded: bytes, decoder: str) -> np.ndarray:
    """Decodes image bytes to uint8 RGB (H, W, 3) with one of ``DECODERS``."""
    check_choice(decoder, DECODERS, "decoder")
    if not isinstance(encoded, (bytes, bytearray, memoryview)):
        raise TypeError(f"encoded must be bytes, got {type(encoded).__name__}")
    if decoder == "pil":
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                return np.asarray(image.convert("RGB"))
        except (OSError, ValueError) as error:  # UnidentifiedImageError is an OSError
            raise _undecodable(decoder, error) from error
    if decoder == "opencv":
        cv2 = _optional_module("opencv")
        image = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise _undecodable(decoder)
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    av = _optional_module("ffmpeg")
    try:
        with av.open(io.BytesIO(encoded)) as container:
            frame = next(container.decode(video=0))
            return frame.to_ndarray(format="rgb24", interpolation="BICUBIC")
    except (av.error.FFmpegError, StopIteration, IndexError) as error:
        raise _undecodable(decoder, error) from error


def resize(image: np.ndarray, mode: str, size: int) -> np.ndarray:
    """Resizes uint8 (H, W, 3) to (size, size, 3) with one of ``RESIZE_MODES``."""
    check_choice(mode, RESIZE_MODES, "resize mode")
    library, constant = RESIZE_MODES[mode]
    if library == "pil":
        return np.asarray(Image.fromarray(image).resize((size, size), getattr(Image.Resampling, constant)))
    cv2 = _optional_module("opencv")
    return cv2.resize(image, (size, size), interpolation=getattr(cv2, constant))


def center_crop(image: np.ndarray, crop: int) -> np.ndarray:
    """The central (crop, crop) window, offset ``round((size - crop) / 2)`` as torchvision."""
    top = round((image.shape[0] - crop) / 2)
    left = round((image.shape[1] - crop) / 2)
    return image[top:top + crop, left:left + crop]


def default_resize(crop: int) -> int:
    """RobustART's resize before the centre crop: ``int(crop * 8 / 7)`` (256 for 224)."""
    return int(crop * 8 / 7)


def _check_sizes(resize_to: int, crop: int) -> None:
    check_positive_int(resize_to, "resize_to")
    check_positive_int(crop, "crop")
    if crop > resize_to:
        raise ValueError(f"crop ({crop}) must not exceed resize_to ({resize_to})")


def to_grey(image: np.ndarray) -> np.ndarray:
    """uint8 RGB (H, W, 3) to uint8 grey (H, W, 1) with the ITU-R 601 luma weights, as Pillow's
    ``convert("L")``, for classifiers of grey images (decoders all produce RGB)."""
    luma = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return np.round(luma).astype(np.uint8)[..., None]


def _resize_and_crop(image: np.ndarray, mode: str, resize_to: int, crop: int) -> np.ndarray:
    return center_crop(resize(image, mode, resize_to), crop)


def decode_and_resize(
    encoded: bytes, variant: SystemNoiseVariant, resize_to: int = 256, crop: int = 224
) -> Float[np.ndarray, "h w 3"]:
    """One image through one variant's pipeline: decode, resize, centre crop.

    Returns float32 (crop, crop, 3) in [0, 1].
    """
    if not isinstance(variant, SystemNoiseVariant):
        raise TypeError(f"variant must be a SystemNoiseVariant, got {type(variant).__name__}")
    _check_sizes(resize_to, crop)
    image = _resize_and_crop(decode(encoded, variant.decoder), variant.resize, resize_to, crop)
    return image.astype(np.float32) / 255.0


@dataclasses.dataclass(frozen=True)
class SystemNoiseReport:
    """Accuracy per variant name and its summary over variants.

    Attributes:
      accuracy: variant name -> top-1 accuracy in [0, 1].
      mean: mean accuracy over the variants.
      std: population standard deviation of the accuracies.
      negative_std: ``-std``, RobustART's score (higher is more robust).
      correct: variant name -> per-image correctness (bool), when it was recorded.
    """

    accuracy: dict[str, float]
    mean: float
    std: float
    negative_std: float
    correct: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def summarize(accuracy: dict[str, float], correct: dict[str, np.ndarray] | None = None) -> SystemNoiseReport:
    """Mean, population standard deviation and negative standard deviation over variants."""
    if not accuracy:
        raise ValueError("accuracy is empty: evaluate at least one variant")
    values = np.asarray(list(accuracy.values()), np.float64)
    std = float(np.std(values))
    return SystemNoiseReport(dict(accuracy), float(np.mean(values)), std, -std, dict(correct or {}))


@jax.jit
def _predict(classifier: Classifier, x: jax.Array) -> jax.Array:
    return jnp.argmax(classifier(x), axis=-1)


def _padded(images: list[np.ndarray], batch_size: int) -> np.ndarray:
    batch = np.stack(images).astype(np.float32) / 255.0
    pad = batch_size - len(images)
    return np.concatenate([batch, np.repeat(batch[:1], pad, axis=0)]) if pad else batch


def evaluate_system_noise(
    classifier: Classifier,
    encoded_images: Sequence[bytes],
    labels: Int[Array, " n"],
    variants: Sequence[SystemNoiseVariant] | None = None,
    *,
    batch_size: int = 64,
    resize_to: int | None = None,
    crop: int | None = None,
    workers: int = 1,
) -> SystemNoiseReport:
    """Top-1 accuracy of ``classifier`` under each system-noise variant, and the summary.

    Args:
      classifier: expects RGB images (crop, crop, 3).
      encoded_images: encoded image files (JPEG, PNG, ...) as bytes.
      labels: int class labels, one per image.
      variants: the variants to run; default ``variants()``.
      batch_size: images per forward pass (the last batch is padded, never recompiled).
      resize_to, crop: pipeline sizes; default ``crop`` from the classifier's input shape
        and ``resize_to = int(crop * 8 / 7)``.
      workers: host threads that decode and resize (Pillow and OpenCV release the GIL).
    """
    variants = _all_variants() if variants is None else list(dict.fromkeys(variants))  # unique, in order
    if not variants:
        raise ValueError("variants is empty")
    for variant in variants:
        if not isinstance(variant, SystemNoiseVariant):
            raise TypeError(f"variants must hold SystemNoiseVariant, got {type(variant).__name__}")
    crop = classifier.input_shape[0] if crop is None else crop
    resize_to = default_resize(crop) if resize_to is None else resize_to
    _check_sizes(resize_to, crop)
    if tuple(classifier.input_shape) not in ((crop, crop, 3), (crop, crop, 1)):
        raise ValueError(f"the pipeline makes images of ({crop}, {crop}, 3) (or grey: 1), the classifier "
                         f"expects {tuple(classifier.input_shape)}")
    if isinstance(encoded_images, (bytes, bytearray)) or len(encoded_images) == 0:
        raise ValueError("encoded_images must be a non-empty sequence of encoded images (bytes)")
    labels = np.asarray(labels)
    check_labels(labels, num_classes=classifier.num_classes, batch_size=len(encoded_images), name="labels")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(workers, "workers")

    by_decoder: dict[str, list[str]] = {}
    for variant in variants:
        by_decoder.setdefault(variant.decoder, []).append(variant.resize)
    correct: dict[str, list[np.ndarray]] = {variant.name: [] for variant in variants}

    def decode_one(index: int, decoder: str) -> np.ndarray:
        try:
            return decode(encoded_images[index], decoder)
        except (TypeError, ValueError) as error:
            raise type(error)(f"encoded_images[{index}]: {error}") from error

    with ThreadPoolExecutor(workers) as pool:
        for decoder, modes in by_decoder.items():
            for start in range(0, len(encoded_images), batch_size):
                indices = range(start, min(start + batch_size, len(encoded_images)))
                decoded = list(pool.map(decode_one, indices, itertools.repeat(decoder)))
                y = labels[indices.start:indices.stop]
                for mode in modes:
                    resized = functools.partial(_resize_and_crop, mode=mode, resize_to=resize_to, crop=crop)
                    images = list(pool.map(resized, decoded))
                    if classifier.input_shape[-1] == 1:
                        images = [to_grey(image) for image in images]
                    predictions = np.asarray(_predict(classifier, _padded(images, batch_size)))[:len(indices)]
                    correct[SystemNoiseVariant(decoder, mode).name].append(predictions == y)
    correct = {name: np.concatenate(parts) for name, parts in correct.items()}
    return summarize({name: float(c.mean()) for name, c in correct.items()}, correct)
