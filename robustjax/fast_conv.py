"""Any classifier's convolutions with the CPU-friendly input gradient of :mod:`robustjax.ops.conv`.

Inside a ``while`` body XLA's CPU backend computes a convolution's input gradient from the
kernel read with its in/out axes swapped, about 3x slower than from a transposed copy
(benchmarks/README.md). The zoo's layers avoid it with their own convolution
(:func:`robustjax.ops.conv.conv_general_dilated`); a user's model (a plain ``lax``
function, a Flax NNX or linen module) does not. :func:`with_fast_convolutions` gives any
classifier the same backward pass without changing its code: its ``apply_fn`` is traced to
a jaxpr and evaluated again with every ``conv_general_dilated`` replaced by that one
(values and gradients are XLA's own), recursing into nested ``jit`` calls. Convolutions
inside other higher-order primitives (``custom_vjp``, ``scan``, ``remat``) are left as
they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core

from robustjax.classifier import Classifier
from robustjax.ops.conv import conv_general_dilated


@dataclasses.dataclass(frozen=True)
class FastInputGradients:
    """``apply_fn`` with its convolutions rewritten (hashes and compares as ``apply_fn``
    wrapped, so classifiers of one architecture still share compiled programs)."""

    apply_fn: Callable[[Any, jax.Array], jax.Array]

    def __call__(self, params: Any, x: jax.Array) -> jax.Array:
        closed, out_shape = jax.make_jaxpr(self.apply_fn, return_shape=True)(params, x)
        outputs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves((params, x)))
        return jax.tree.unflatten(jax.tree.structure(out_shape), outputs)


def with_fast_convolutions(classifier: Classifier) -> Classifier:
    """``classifier`` with :class:`FastInputGradients` on the CPU (elsewhere unchanged)."""
    if jax.default_backend() != "cpu" or isinstance(classifier.apply_fn, FastInputGradients):
        return classifier
    return classifier.replace(apply_fn=FastInputGradients(classifier.apply_fn))


def _convolution(params: dict, lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    return conv_general_dilated(
        lhs, rhs, params["window_strides"], params["padding"], params["lhs_dilation"], params["rhs_dilation"],
        params["dimension_numbers"], params["feature_group_count"], params["precision"],
        preferred_element_type=params["preferred_element_type"], out_sharding=params["out_sharding"])


def _evaluate(jaxpr: core.Jaxpr, consts, args) -> list:
    """Evaluates ``jaxpr`` in the current trace, convolutions replaced by :mod:`robustjax.ops.conv`'s."""
    env: dict = {}

    def read(var):
        return var.val if isinstance(var, core.Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        inputs = [read(var) for var in eqn.invars]
        name = eqn.primitive.name
        if name == "conv_general_dilated" and eqn.params["batch_group_count"] == 1:
            outputs = [_convolution(eqn.params, *inputs)]
        elif name in ("jit", "pjit", "closed_call"):
            inner = eqn.params["jaxpr" if name != "closed_call" else "call_jaxpr"]
            outputs = _evaluate(inner.jaxpr, inner.consts, inputs)
        else:
            with eqn.ctx.manager:
                outputs = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outputs = [outputs]
        for var, value in zip(eqn.outvars, outputs):
            if not isinstance(var, core.DropVar):
                env[var] = value
    return [read(var) for var in jaxpr.outvars]
