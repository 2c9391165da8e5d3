"""Corruption throughput, robustjax against imagecorruptions, for every registered corruption.

    python -m benchmarks.noise [--sizes 32,224] [--batch-size N] [--repeats N]
                               [--peer-images N] [--severity S] [--corruptions NAME,...]
                               [--quick] [--out DIR]

robustjax corrupts a batch of smooth random RGB images with one jitted
``robustjax.noise.corrupt`` call (compile time reported on its own, throughput from the
median of the later calls); imagecorruptions, the reference CPU implementation, corrupts
``--peer-images`` of the same images one at a time through its own API
(``imagecorruptions.corrupt(uint8 HWC, corruption_name=..., severity=...)``), after one
warm-up call. Both use the ImageNet-C constants at every size (imagecorruptions has no
CIFAR preset), so both do the same work. One row per (corruption, size); the ratio is
robustjax's images/s over imagecorruptions'.

imagecorruptions 1.1.2 predates numpy 2 and scikit-image 0.19+. Two minimal adapters make
it run, changing no arithmetic: ``skimage.filters.gaussian``'s removed ``multichannel=True``
becomes ``channel_axis=-1`` (glass_blur, gaussian_blur), and ``np.float_`` is aliased to
``np.float64`` (fog). A corruption that imagecorruptions lacks or still cannot run is
skipped, with the reason, under ``skipped`` in the JSON. Per size, two summaries: the
geometric mean of the per-corruption ratios, and the whole-suite ratio (the time each
library takes to apply every corruption once to an image, summed over corruptions, so the
slow corruptions weigh as much as they cost). Results: results/noise.BACKEND.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

import jax
import numpy as np
from scipy.ndimage import gaussian_filter

import robustjax as rj
from benchmarks.common import RESULTS, machine_facts, report, seconds_per_call

ADAPTERS = (
    "skimage.filters.gaussian: multichannel=True -> channel_axis=-1 (glass_blur, gaussian_blur)",
    "np.float_ = np.float64 (fog)",
)


def reference_corruptions():
    """imagecorruptions with the ``ADAPTERS`` applied; returns its module."""
    import imagecorruptions
    import imagecorruptions.corruptions as reference

    if not hasattr(np, "float_"):
        np.float_ = np.float64
    if not getattr(reference.gaussian, "adapted", False):
        original = reference.gaussian

        @functools.wraps(original)
        def gaussian(image, *args, multichannel=None, **kwargs):
            if multichannel:
                kwargs["channel_axis"] = -1
            return original(image, *args, **kwargs)

        gaussian.adapted = True
        reference.gaussian = gaussian
    return imagecorruptions


def smooth_images(count: int, size: int, seed: int = 0) -> np.ndarray:
    """uint8 (count, size, size, 3): blurred uniform noise stretched to [0, 255]."""
    noise = np.random.default_rng(seed).random((count, size, size, 3))
    smooth = gaussian_filter(noise, (0, size / 32, size / 32, 0))
    low, high = smooth.min(axis=(1, 2, 3), keepdims=True), smooth.max(axis=(1, 2, 3), keepdims=True)
    return np.round(255 * (smooth - low) / (high - low)).astype(np.uint8)


def time_robustjax(name: str, x: np.ndarray, severity: int, repeats: int) -> tuple[float, float]:
    """(first call, median later call) seconds of one batched ``corrupt`` call."""
    key = jax.random.key(0)
    return seconds_per_call(
        lambda: jax.block_until_ready(rj.noise.corrupt(x, name, severity, key, preset="imagenet")), repeats)


def time_reference(name: str, images: np.ndarray, severity: int, reference) -> float:
    """Seconds per image of imagecorruptions, one image at a time, after one warm-up call."""
    reference.corrupt(images[0], corruption_name=name, severity=severity)
    start = time.perf_counter()
    for image in images:
        reference.corrupt(image, corruption_name=name, severity=severity)
    return (time.perf_counter() - start) / len(images)


def geometric_mean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32,224", help="comma-separated square image sizes")
    parser.add_argument("--batch-size", type=int, default=64, help="robustjax images per call")
    parser.add_argument("--repeats", type=int, default=3, help="timed robustjax calls after the first (median)")
    parser.add_argument("--peer-images", type=int, default=8, help="images timed one by one in imagecorruptions")
    parser.add_argument("--severity", type=int, default=3, choices=range(1, 6))
    parser.add_argument("--corruptions", default=None, help="comma-separated subset (default: all registered)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: size 32, batch 4, 1 repeat, 2 peer images")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.batch_size, args.repeats, args.peer_images = "32", 4, 1, 2
    args.sizes = [int(size) for size in args.sizes.split(",")]
    if min(args.sizes) < 32:
        parser.error("imagecorruptions needs images of at least 32 x 32")
    registered = rj.noise.names()
    args.corruptions = registered if args.corruptions is None else args.corruptions.split(",")
    if unknown := sorted(set(args.corruptions) - set(registered)):
        parser.error(f"unknown corruptions {unknown}; registered: {registered}")
    if not 1 <= args.peer_images <= args.batch_size:
        parser.error("--peer-images must be between 1 and --batch-size")
    return args


def main() -> None:
    args = parse_arguments()
    reference = reference_corruptions()
    available = set(reference.get_corruption_names("all"))
    rows, skipped = [], {}
    for size in args.sizes:
        images = smooth_images(args.batch_size, size)
        for name in args.corruptions:
            if name not in available:
                skipped[f"{name}@{size}"] = "not in imagecorruptions"
                continue
            first, ours_s = time_robustjax(name, images.astype(np.float32) / 255.0, args.severity, args.repeats)
            try:
                peer_s = time_reference(name, images[:args.peer_images], args.severity, reference)
            except Exception as error:  # noqa: BLE001  (a reference that cannot run is recorded, not fatal)
                skipped[f"{name}@{size}"] = f"imagecorruptions failed: {type(error).__name__}: {error}"
                continue
            ours_per_image = ours_s / len(images)
            rows.append({
                "name": f"{name}@{size}", "corruption": name, "size": size,
                "robustjax_images_per_s": 1.0 / ours_per_image, "peer_images_per_s": 1.0 / peer_s,
                "ratio": peer_s / ours_per_image, "robustjax_compile_s": max(first - ours_s, 0.0),
            })
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    facts = machine_facts(("imagecorruptions", "scikit-image", "opencv-python-headless", "scipy", "pillow"))
    settings = {"sizes": args.sizes, "batch_size": args.batch_size, "repeats": args.repeats,
                "peer_images": args.peer_images, "severity": args.severity, "preset": "imagenet",
                "peer": "imagecorruptions", "peer_adapters": list(ADAPTERS)}
    path = report("noise", rows, facts, settings, args.out)
    payload = json.loads(path.read_text())
    payload["skipped"] = skipped
    payload.update(summaries(rows, args.sizes))
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print("geometric mean ratio per size:", payload["geometric_mean_ratio"])
    print("whole-suite ratio per size:", payload["whole_suite_ratio"])


def summaries(rows: list[dict], sizes) -> dict:
    """Per size: the geometric mean of the per-corruption ratios, and the whole-suite ratio
    (sum over corruptions of the peer's seconds per image over the sum of ours)."""
    def at(size):
        return [row for row in rows if row["size"] == size]

    return {
        "geometric_mean_ratio": {str(size): geometric_mean([row["ratio"] for row in at(size)]) for size in sizes},
        "whole_suite_ratio": {
            str(size): sum(1 / row["peer_images_per_s"] for row in at(size))
            / sum(1 / row["robustjax_images_per_s"] for row in at(size)) for size in sizes},
    }


if __name__ == "__main__":
    main()
