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

import functools
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
                forward: Callable[[nnx.Module, jax.Array, Any], Any] | None = None, choice: Any = None) -> nnx.Module:
    """A copy of ``module`` (in eval mode) whose BatchNorm statistics are those of ``images``.

    ``images`` are what the module itself takes (already normalised); ``forward(module, x,
    choice)`` calls it (default ``module(x)``), e.g. ``lambda m, x, c: m(x, c)`` with a
    supernet's ``choice``. ``forward`` should be one function for all calls (not a new
    lambda each time), so that its compiled program is reused. The module passed in is not changed.
    """
    statistics = batch_norm_statistics(module, images, batch_size=batch_size, forward=forward, choices=choice)
    model = nnx.clone(module)
    for norm, (mean, var) in zip(_norms(model), statistics):
        norm.mean[...], norm.var[...] = mean, var
    model.eval()
    return model


def batch_norm_statistics(module: nnx.Module, images: np.ndarray, *, batch_size: int = 256,
                          forward: Callable[[nnx.Module, jax.Array, Any], Any] | None = None,
                          choices: Any = None, batched: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each BatchNorm's (mean, variance) over ``images``, in ``nnx.iter_modules`` order.

    ``forward(module, x, choices)`` runs the module. With ``batched``, ``choices`` is a
    pytree whose leaves carry a leading axis (one entry per subnet): the statistics of every
    subnet are computed in one vmapped program, and each array gains that leading axis.
    """
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or len(images) == 0:
        raise ValueError(f"calibration images must be a non-empty (N, H, W, C) batch, got shape {images.shape}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model = nnx.clone(module)
    model.train()
    norms = _norms(model)
    if not norms:
        raise ValueError(f"{type(module).__name__} has no BatchNorm layer to recalibrate")
    for norm in norms:
        norm.momentum = 0.0  # after a forward pass the running statistics are the batch's own
    graphdef, state = nnx.split(model)
    batch_statistics = _statistics_program(graphdef, forward or _call, batched)
    sums = None
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        moments = [(np.asarray(m, np.float64), np.asarray(v, np.float64)) for m, v in batch_statistics(state, batch, choices)]
        weighted = [(len(batch) * m, len(batch) * (v + m**2)) for m, v in moments]
        sums = weighted if sums is None else [(a + m, b + v) for (a, b), (m, v) in zip(sums, weighted)]
    statistics = []
    for mean_sum, square_sum in sums:
        mean = mean_sum / len(images)
        statistics.append((mean.astype(np.float32), np.maximum(square_sum / len(images) - mean**2, 0.0).astype(np.float32)))
    return statistics


def _call(module: nnx.Module, x: jax.Array, _choice: Any) -> jax.Array:
    return module(x)


@functools.cache
def _statistics_program(graphdef: Any, forward: Callable, batched: bool) -> Callable:
    """The jitted per-batch statistics of a module structure (cached: every subnet or
    population of one supernet reuses one compiled program)."""
    def one(state, x, choice):
        model = nnx.merge(graphdef, state)
        forward(model, x, choice)
        return [(norm.mean[...], norm.var[...]) for norm in _norms(model)]

    return jax.jit(jax.vmap(one, in_axes=(None, None, 0)) if batched else one)


def _norms(module: nnx.Module) -> list[nnx.BatchNorm]:
    return [m for _, m in nnx.iter_modules(module) if isinstance(m, nnx.BatchNorm)]
