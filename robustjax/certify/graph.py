"""A classifier's forward pass as a tape of primitive steps on its input, for bound propagation.

The classifier is traced to a jaxpr at one image; calls (``jit``, ``custom_jvp``,
``custom_vjp``) are inlined, and every step whose inputs do not depend on the image
(weights, batch-norm statistics folded into scales, normalisation constants) is evaluated
on the spot. What is left is the tape: the steps that carry the image, each one either
*affine* in the values it receives from the image (convolution, dense, batch norm in
evaluation mode, average pooling, residual adds, reshapes) or one of the few nonlinearities
the bounds relax (ReLU as ``max(x, c)``, ``min(x, c)``, max pooling as ``reduce_max``).
Any other step is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Var

# Steps affine in their image-carrying operands, as long as ``_affine_problem`` finds none.
AFFINE = frozenset({
    "add", "sub", "neg", "mul", "div", "dot_general", "conv_general_dilated", "reshape", "transpose",
    "broadcast_in_dim", "squeeze", "expand_dims", "reduce_sum", "pad", "slice", "concatenate",
    "convert_element_type", "copy", "copy_p", "reduce_window_sum", "rev", "select_n", "dynamic_slice",
    "reduce_precision",
})
# Operands scaled by the step: their absolute value scales a radius (interval propagation).
MULTIPLICATIVE = frozenset({"mul", "div", "dot_general", "conv_general_dilated"})
# Nonlinear steps nondecreasing in every operand: intervals map through their end points.
MONOTONE = frozenset({"max", "min", "reduce_max", "reduce_min", "reduce_window_max", "reduce_window_min",
                      "tanh", "logistic", "exp"})
# The nonlinear steps CROWN relaxes linearly.
RELAXED = frozenset({"max", "min", "reduce_max", "reduce_window_max"})
_CALL_PARAMS = ("call_jaxpr", "jaxpr", "fun_jaxpr")
IMAGE = 0  # the tape's id of the input image


@dataclasses.dataclass(frozen=True)
class Const:
    """A value that does not depend on the image."""

    value: Any


@dataclasses.dataclass(frozen=True)
class Step:
    """One primitive applied to image-carrying values (int ids) and constants; ``output`` is
    the id of the value it makes, ``shape`` that value's shape."""

    primitive: Any
    inputs: tuple[int | Const, ...]
    output: int
    shape: tuple[int, ...]
    params: dict

    @property
    def name(self) -> str:
        return self.primitive.name

    def bounded(self) -> list[int]:
        """Positions of the operands that carry the image."""
        return [i for i, a in enumerate(self.inputs) if not isinstance(a, Const)]

    def apply(self, operands: dict[int, jax.Array], replace=None):
        """The step on ``operands`` (position -> value) in its image-carrying positions;
        ``replace(position, value)``, when given, substitutes each constant operand."""
        args = [operands[position] if not isinstance(a, Const)
                else (a.value if replace is None else replace(position, a.value))
                for position, a in enumerate(self.inputs)]
        return self.primitive.bind(*args, **self.params)


@dataclasses.dataclass(frozen=True)
class Tape:
    """The steps from the image (id 0, of ``input_shape``) to the output (an id)."""

    steps: tuple[Step, ...]
    output: int
    input_shape: tuple[int, ...]


def trace(classifier, image_shape: tuple[int, ...], what: str) -> Tape:
    """The tape of ``classifier`` at one image of ``image_shape`` (1, H, W, C); ``what`` names
    the bound in refusals."""
    leaves, treedef = jax.tree.flatten(classifier.params)

    def logits(flat, x):
        return classifier.replace(params=jax.tree.unflatten(treedef, flat))(x)

    closed = jax.make_jaxpr(logits)(leaves, jax.ShapeDtypeStruct(image_shape, jnp.float32))
    steps: list[Step] = []
    inputs = [Const(leaf) for leaf in leaves] + [IMAGE]
    (output,) = _inline(closed, inputs, steps, classifier.name, what)
    if isinstance(output, Const):
        raise ValueError(f"{classifier.name}: its logits do not depend on the image; {what} has nothing to bound")
    return Tape(tuple(steps), output, tuple(image_shape))


def _inline(closed: ClosedJaxpr, inputs: list, steps: list[Step], model: str, what: str) -> list:
    jaxpr: Jaxpr = closed.jaxpr
    env: dict[Var, int | Const] = dict(zip(jaxpr.constvars, (Const(c) for c in closed.consts)))
    env.update(zip(jaxpr.invars, inputs))

    def read(atom):
        return Const(atom.val) if isinstance(atom, Literal) else env[atom]

    for eqn in jaxpr.eqns:
        args = [read(a) for a in eqn.invars]
        inner = next((eqn.params[p] for p in _CALL_PARAMS if p in eqn.params), None)
        if inner is not None:
            inner = inner if isinstance(inner, ClosedJaxpr) else ClosedJaxpr(inner, ())
            outs = _inline(inner, args, steps, model, what)
        elif all(isinstance(a, Const) for a in args):
            values = eqn.primitive.bind(*(a.value for a in args), **eqn.params)
            outs = [Const(v) for v in values] if eqn.primitive.multiple_results else [Const(values)]
        else:
            if eqn.primitive.multiple_results:
                raise ValueError(f"{model}: {what} cannot bound the step `{eqn.primitive.name}` "
                                 f"(several outputs)")
            step = Step(eqn.primitive, tuple(args), len(steps) + 1, tuple(eqn.outvars[0].aval.shape),
                        dict(eqn.params))
            _check_supported(step, model, what)
            steps.append(step)
            outs = [step.output]
        env.update(zip(eqn.outvars, outs))
    return [read(a) for a in jaxpr.outvars]


def _check_supported(step: Step, model: str, what: str) -> None:
    problem = None
    if step.name in AFFINE:
        problem = _affine_problem(step)
    elif step.name not in MONOTONE:
        problem = "a nonlinearity it has no relaxation for"
    elif what == "CROWN" and step.name not in RELAXED:
        problem = "a nonlinearity CROWN has no linear relaxation for (IBP bounds it)"
    elif what == "CROWN" and step.name in ("max", "min") and len(step.bounded()) > 1:
        problem = "the maximum or minimum of two image-carrying values"
    if problem:
        raise ValueError(
            f"{model}: {what} cannot bound the step `{step.name}` ({problem}); it bounds convolutions, "
            "dense layers, batch norm in evaluation mode, ReLU, max and average pooling and residual adds")


def _affine_problem(step: Step) -> str | None:
    bounded = step.bounded()
    if step.name in ("mul", "dot_general", "conv_general_dilated") and len(bounded) > 1:
        return "a product of two image-carrying values"
    if step.name == "div" and bounded != [0]:
        return "a division by an image-carrying value"
    if step.name == "select_n" and 0 in bounded:
        return "a selection that depends on the image"
    if step.name in ("pad", "dynamic_slice") and bounded != [0]:
        return "padding or slicing positions that depend on the image"
    return None
