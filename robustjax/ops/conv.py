"""A convolution with a CPU-friendly input gradient: the zoo's layers and NAS networks are
built on it, and :mod:`robustjax.fast_conv` puts it into any classifier."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count=1, precision=None, **kwargs):
    """``lax.conv_general_dilated`` (the zoo's ``nnx.Conv`` layers use it), with an input
    gradient that XLA's CPU backend runs fast inside loops.

    Inside a ``while`` body XLA's CPU backend computes the input gradient of a convolution
    from the kernel read with its in/out axes swapped (``dim_labels ..._01oi``), which its
    convolution kernels run about 3x slower than a transposed copy (benchmarks/README.md).
    On the CPU the backward pass here materialises that transposed kernel behind an
    ``optimization_barrier``; values and gradients are those of ``lax.conv_general_dilated``.
    """
    settings = dict(window_strides=tuple(window_strides), lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                    feature_group_count=feature_group_count, precision=precision, **kwargs)
    if isinstance(padding, str):
        settings["padding"] = padding
    else:
        settings["padding"] = tuple(tuple(pair) for pair in padding)
    if jax.default_backend() != "cpu" or feature_group_count != 1 or kwargs.get("out_sharding") is not None:
        return jax.lax.conv_general_dilated(lhs, rhs, dimension_numbers=dimension_numbers, **settings)
    numbers = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    return _cpu_conv(tuple(sorted({**settings, "dimension_numbers": numbers}.items(), key=lambda item: item[0])))(lhs, rhs)


@functools.cache
def _cpu_conv(settings: tuple):
    """The convolution of ``settings`` (sorted keyword items) with the CPU-friendly backward."""
    options = dict(settings)

    @jax.custom_vjp
    def conv(lhs, rhs):
        return jax.lax.conv_general_dilated(lhs, rhs, **options)

    def forward(lhs, rhs):
        # With symbolic zeros each primal says whether it is differentiated: an attack needs
        # only the input gradient, so the kernel gradient is not even traced (under nested
        # vmaps over sharded inputs its batching rule is not implemented in jax 0.10.2).
        # The flags are empty arrays or None, so the residuals' structure carries them.
        flags = tuple(jnp.zeros(0) if primal.perturbed else None for primal in (lhs, rhs))
        return jax.lax.conv_general_dilated(lhs.value, rhs.value, **options), (lhs.value, rhs.value, flags)

    def backward(residuals, grad):
        lhs, rhs, (lhs_flag, rhs_flag) = residuals
        if isinstance(grad, jax.custom_derivatives.SymbolicZero):
            return None, None
        lhs_grad = rhs_grad = None
        if lhs_flag is not None:
            numbers = options["dimension_numbers"]
            out_axis, in_axis = numbers.rhs_spec[:2]
            swapped = jax.lax.optimization_barrier(jnp.swapaxes(rhs, out_axis, in_axis))
            swapped_numbers = numbers._replace(rhs_spec=(in_axis, out_axis, *numbers.rhs_spec[2:]))
            _, lhs_vjp = jax.vjp(lambda x: jax.lax.conv_general_dilated(
                x, swapped, **{**options, "dimension_numbers": swapped_numbers}), lhs)
            lhs_grad = lhs_vjp(grad)[0]
        if rhs_flag is not None:
            _, rhs_vjp = jax.vjp(lambda kernel: jax.lax.conv_general_dilated(lhs, kernel, **options), rhs)
            rhs_grad = rhs_vjp(grad)[0]
        return lhs_grad, rhs_grad

    conv.defvjp(forward, backward, symbolic_zeros=True)
    return conv
