"""Robustness metrics: pure functions on arrays."""

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
    "corruption_error",
    "mean_corruption_error",
    "relative_corruption_error",
]
