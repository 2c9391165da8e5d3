"""Robustness metrics: pure functions on arrays, with streaming accumulators.

Grouped as the papers group them: ``coverage`` and ``imperceptibility`` (data),
``behaviour`` and ``structure`` (model) from the comprehensive evaluation framework;
``robustart`` and ``calibration`` from RobustART; ``corruption`` (CE, mCE) from ImageNet-C.
"""

from robustjax.metrics import behaviour, calibration, corruption, coverage, imperceptibility, robustart, structure
from robustjax.metrics.corruption import (
    ALEXNET_CLEAN_ERROR,
    ALEXNET_IMAGENET_C_ERRORS,
    corruption_error,
    mean_corruption_error,
    relative_corruption_error,
)

__all__ = [
    "ALEXNET_CLEAN_ERROR",
    "ALEXNET_IMAGENET_C_ERRORS",
    "behaviour",
    "calibration",
    "corruption",
    "corruption_error",
    "coverage",
    "imperceptibility",
    "mean_corruption_error",
    "relative_corruption_error",
    "robustart",
    "structure",
]
