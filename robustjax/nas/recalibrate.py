"""Batch-norm recalibration: the statistics a weight-shared subnet needs before evaluation.

A subnet inherits its supernet's weights but not usable batch-norm statistics (the supernet's
running averages mix every subnet it trained). As in Once-for-All, BigNAS and RobustART
(``ofa_calib_bn``, 4,096 training images), the subnet runs forward in training mode over
calibration images, each batch normalised with its own statistics; each BatchNorm's running
mean and variance become the mean and (biased) variance of its input over all the images:
``mean = sum_b n_b m_b / N`` and ``var = sum_b n_b (v_b + m_b^2) / N - mean^2`` from the batch
means ``m_b`` and variances ``v_b``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from robustjax.data import ImageDataset

DEFAULT_IMAGES = 4096  # RobustART's calibration set size


def calibration_subset(source: np.ndarray | ImageDataset, n: int = DEFAULT_IMAGES, *, seed: int = 0) -> np.ndarray:
    """A seeded random subset of ``n`` images (all of them when there are fewer) of an array
    or of a dataset (only those images are read)."""
    total = source.num_examples if isinstance(source, ImageDataset) else len(source)
    indices = np.sort(np.random.default_rng(seed).permutation(total)[:n])
    return source.take(indices)[0] if isinstance(source, ImageDataset) else np.asarray(source)[indices]


def recalibrate(module: nnx.Module, images: np.ndarray, *, batch_size: int = 256,
                forward: Callable[[nnx.Module, jax.Array], Any] | None = None) -> nnx.Module:
    """A copy of ``module`` (in eval mode) whose BatchNorm statistics are those of ``images``.

    ``images`` are what the module itself takes (already normalised); ``forward(module, x)``
    calls it (default ``module(x)``), e.g. ``lambda m, x: m(x, choice)`` for a supernet.
    The module passed in is not changed.
    """
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or len(images) == 0:
        raise ValueError(f"calibration images must be a non-empty (N, H, W, C) batch, got shape {images.shape}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    forward = forward or (lambda m, x: m(x))
    model = nnx.clone(module)
    model.train()
    norms = _norms(model)
    if not norms:
        raise ValueError(f"{type(module).__name__} has no BatchNorm layer to recalibrate")
    for norm in norms:
        norm.momentum = 0.0  # after a forward pass the running statistics are the batch's own
    graphdef, state = nnx.split(model)

    @jax.jit
    def batch_statistics(state, x):
        model = nnx.merge(graphdef, state)
        forward(model, x)
        return [(norm.mean[...], norm.var[...]) for norm in _norms(model)]

    sums = [(np.zeros(n.mean.shape, np.float64), np.zeros(n.var.shape, np.float64)) for n in norms]
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        for (mean_sum, square_sum), (mean, var) in zip(sums, batch_statistics(state, batch)):
            mean, var = np.asarray(mean, np.float64), np.asarray(var, np.float64)
            mean_sum += len(batch) * mean
            square_sum += len(batch) * (var + mean**2)
    for original, norm, (mean_sum, square_sum) in zip(_norms(module), norms, sums):
        mean = mean_sum / len(images)
        norm.mean[...] = mean.astype(np.float32)
        norm.var[...] = np.maximum(square_sum / len(images) - mean**2, 0.0).astype(np.float32)
        norm.momentum = original.momentum
    model.eval()
    return model


def _norms(module: nnx.Module) -> list[nnx.BatchNorm]:
    return [m for _, m in nnx.iter_modules(module) if isinstance(m, nnx.BatchNorm)]
