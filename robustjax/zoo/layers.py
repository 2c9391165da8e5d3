"""Layers shared by the zoo's architectures."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike


def _windows_2x2(x: ArrayLike) -> ArrayLike:
    """(B, H, W, C) -> (B, H/2, W/2, 4, C), each 2x2 window in row-major order."""
    batch, height, width, channels = x.shape
    if height % 2 or width % 2:
        raise ValueError(f"max_pool_2x2 needs even height and width, got {height}x{width}")
    windows = x.reshape(batch, height // 2, 2, width // 2, 2, channels)
    return windows.transpose(0, 1, 3, 2, 4, 5).reshape(batch, height // 2, width // 2, 4, channels)


@jax.custom_vjp
def max_pool_2x2(x: ArrayLike) -> jax.Array:
    """2x2 max pooling with stride 2 on NHWC (H and W even).

    Same values as ``nnx.max_pool(x, (2, 2), strides=(2, 2))`` and the same gradient as
    PyTorch and XLA's select-and-scatter: each window's gradient goes to its first maximum
    in row-major order (a plain ``max`` reduction would split it among tied maxima). The
    gradient is written as a one-hot selection because XLA's select-and-scatter is about
    10x slower on the CPU backend and dominated a gradient step of the digits CNN.
    """
    return _windows_2x2(x).max(axis=3)


def _forward(x):
    windows = _windows_2x2(x)
    return windows.max(axis=3), (jnp.argmax(windows, axis=3), x.shape)


def _backward(residuals, grad):
    first_max, (batch, height, width, channels) = residuals
    windows = jax.nn.one_hot(first_max, 4, axis=3, dtype=grad.dtype) * grad[:, :, :, None, :]
    windows = windows.reshape(batch, height // 2, width // 2, 2, 2, channels).transpose(0, 1, 3, 2, 4, 5)
    return (windows.reshape(batch, height, width, channels),)


max_pool_2x2.defvjp(_forward, _backward)
