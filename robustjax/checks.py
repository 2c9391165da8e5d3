"""Host-side validation of the public contracts, run before anything is traced.

Every check raises ``ValueError`` or ``TypeError`` naming what was expected and what was
given. Checks run on concrete arrays only; inside a trace they check shapes and dtypes and
skip value checks (a traced array has no values to look at).
"""

from __future__ import annotations

import math

import jax
import numpy as np


def _concrete(a) -> np.ndarray | None:
    """The values of ``a``, or None when ``a`` is being traced."""
    if isinstance(a, jax.core.Tracer):
        return None
    return np.asarray(a)


def check_images(x, *, name: str = "x", input_shape: tuple[int, ...] | None = None) -> None:
    """Images must be float32 NHWC with values in [0, 1] and no NaN."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array of images, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name} must be a batch of images (B, H, W, C), got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {x.shape})")
    if x.dtype != np.float32:
        raise TypeError(f"{name} must be float32 in [0, 1], got dtype {x.dtype}")
    if input_shape is not None and tuple(x.shape[1:]) != tuple(input_shape):
        raise ValueError(
            f"{name} has image shape {tuple(x.shape[1:])}, the classifier expects {tuple(input_shape)}"
        )
    values = _concrete(x)
    if values is None:
        return
    if np.isnan(values).any():
        raise ValueError(f"{name} contains NaN")
    lo, hi = float(values.min()), float(values.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"{name} must have values in [0, 1], got range [{lo:.4g}, {hi:.4g}]")


def check_labels(y, *, num_classes: int, batch_size: int, name: str = "y") -> None:
    """Labels must be integers of shape (B,) in [0, num_classes)."""
    if not hasattr(y, "shape") or not hasattr(y, "dtype"):
        raise TypeError(f"{name} must be an int array of labels, got {type(y).__name__}")
    if y.shape != (batch_size,):
        raise ValueError(f"{name} must have shape ({batch_size},), got {tuple(y.shape)}")
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {y.dtype}")
    values = _concrete(y)
    if values is None or values.size == 0:
        return
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi >= num_classes:
        raise ValueError(
            f"{name} must be class indices in [0, {num_classes}), got range [{lo}, {hi}]"
        )


def check_batch(classifier, x, y, target=None) -> None:
    """Validates images, labels and optional attack targets against a classifier."""
    check_images(x, input_shape=classifier.input_shape)
    check_labels(y, num_classes=classifier.num_classes, batch_size=x.shape[0])
    if target is None:
        return
    check_labels(target, num_classes=classifier.num_classes, batch_size=x.shape[0], name="target")
    labels, targets = _concrete(y), _concrete(target)
    if labels is not None and targets is not None and (same := np.flatnonzero(labels == targets)).size:
        raise ValueError(
            f"target equals the true label for {same.size} example(s), first at index {same[0]}"
        )


def check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_nonnegative_float(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def check_positive_float(value, name: str) -> None:
    check_nonnegative_float(value, name)
    if value == 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_in_interval(
    value, name: str, low: float, high: float, *, closed_low: bool = False, closed_high: bool = False
) -> None:
    """``value`` must be a number in the interval from ``low`` to ``high`` (open unless closed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    above = value >= low if closed_low else value > low
    below = value <= high if closed_high else value < high
    if not (math.isfinite(value) and above and below):
        interval = f"{'[' if closed_low else '('}{low}, {high}{']' if closed_high else ')'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def check_choice(value, choices, name: str) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
