"""Certified bounds on a classifier's logits over the L-infinity (or L2) ball of ``eps`` around
each image (intersected with the [0, 1] box), and the verified robust accuracy they give.

- **IBP**, interval bound propagation (Gowal et al., "On the Effectiveness of Interval Bound
  Propagation for Training Verifiably Robust Models", 2018): every value carries an
  interval; an affine step maps centre and radius (``|W|`` scales the radius), a monotone
  step maps the end points.
- **CROWN** (Zhang et al., "Efficient Neural Network Robustness Certification with General
  Activation Functions", NeurIPS 2018): a linear bound ``a . z`` on an output is carried back
  through the network to the input, where the box gives it a value. Affine steps transpose
  exactly (``jax.linear_transpose``); ReLU is relaxed by the line through ``(l, 0)`` and
  ``(u, u)`` above and by slope 0 or 1 below (1 when ``u > -l``, the adaptive choice of
  CROWN and auto_LiRPA); max pooling by the element that is largest at the lower bounds
  (below) and by that element when it dominates its window, else the largest upper bound
  (above). Each ReLU and pooling input is first bounded the same way, one pass per neuron.
  Every CROWN bound is intersected with IBP's (both are sound): CROWN's relaxations can be
  looser than intervals for large eps, and the intersection is never looser than either.
- **CROWN-IBP** (Zhang et al., "Towards Stable and Efficient Training of Verifiably Robust
  Neural Networks", ICLR 2020): IBP bounds the ReLU and pooling inputs and CROWN only the
  output, one backward pass per logit instead of one per neuron: between the two in
  tightness, close to IBP in cost.

The networks are read as jaxprs (:mod:`robustjax.certify.graph`), so any zoo model built
from convolutions, dense layers, batch norm in evaluation mode, ReLU, max and average
pooling and residual adds is bounded without a port; anything else is refused by name.
The cost of CROWN grows with the number of neurons times the network's size: it is meant
for the small networks certification works on, not for an ImageNet ResNet.
"""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from robustjax.certify.graph import AFFINE, IMAGE, MULTIPLICATIVE, Step, Tape, trace
from robustjax.checks import (
    as_images,
    check_batch,
    check_choice,
    check_nonnegative_float,
    check_positive_int,
)

METHODS = ("ibp", "crown-ibp", "crown")
NORMS = ("linf", "l2")


class Bounds(NamedTuple):
    """Element-wise lower and upper bounds, each (B, K)."""

    lower: jax.Array
    upper: jax.Array


def logit_bounds(
    classifier, x: Float[Array, "b h w c"], eps: float, *, method: Literal["ibp", "crown-ibp", "crown"] = "crown",
    norm: Literal["linf", "l2"] = "linf", rows_per_pass: int = 256,
) -> Bounds:
    """Bounds on every logit over the images within ``eps`` of ``x`` in ``norm`` and in [0, 1].

    An L2 ball lies in the L-infinity ball of the same radius, which IBP bounds; CROWN
    evaluates its linear bounds on the L2 ball itself (``a . x - eps ||a||_2``), and on the
    box when that is tighter. ``rows_per_pass``: how many neurons CROWN bounds at once per
    image; all images of ``x`` run together, so memory grows with ``rows_per_pass`` times
    the batch.
    """
    x = _check(classifier, x, None, eps, method, norm, rows_per_pass)
    eye = jnp.broadcast_to(jnp.eye(classifier.num_classes), (x.shape[0],) + (classifier.num_classes,) * 2)
    if method == "ibp":
        return Bounds(*_ibp_logits(classifier, x, eps))
    return _crown_specs(classifier, x, eps, eye, rows_per_pass, method == "crown", norm)


def margin_lower_bounds(
    classifier, x: Float[Array, "b h w c"], y: Int[Array, " b"], eps: float, *,
    method: Literal["ibp", "crown-ibp", "crown"] = "crown", norm: Literal["linf", "l2"] = "linf",
    rows_per_pass: int = 256,
) -> Float[Array, "b k"]:
    """Lower bounds on the margins ``z_y - z_j`` for every class j (0 at j = y).

    IBP subtracts the logits' intervals, ``l_y - u_j``; CROWN bounds each margin as one
    linear function of the logits, which is tighter.
    """
    x = _check(classifier, x, y, eps, method, norm, rows_per_pass)
    y = jnp.asarray(y, jnp.int32)
    if method == "ibp":
        lower, upper = _ibp_logits(classifier, x, eps)
        margins = jnp.take_along_axis(lower, y[:, None], axis=1) - upper
        return jnp.where(jax.nn.one_hot(y, classifier.num_classes) > 0, 0.0, margins)
    onehot = jax.nn.one_hot(y, classifier.num_classes)
    specs = onehot[:, None, :] - jnp.eye(classifier.num_classes)[None]
    return _crown_specs(classifier, x, eps, specs, rows_per_pass, method == "crown", norm).lower


def verified(
    classifier, x: Float[Array, "b h w c"], y: Int[Array, " b"], eps: float, *,
    method: Literal["ibp", "crown-ibp", "crown"] = "crown", norm: Literal["linf", "l2"] = "linf",
    rows_per_pass: int = 256,
) -> Bool[Array, " b"]:
    """Whether every image within ``eps`` of ``x[i]`` is classified ``y[i]``: each margin's
    lower bound is positive. The verified accuracy is its mean, a lower bound on the robust
    accuracy any attack can measure."""
    margins = margin_lower_bounds(classifier, x, y, eps, method=method, norm=norm, rows_per_pass=rows_per_pass)
    others = jax.nn.one_hot(jnp.asarray(y), classifier.num_classes) == 0
    return jnp.all(jnp.where(others, margins > 0, True), axis=1)


def _check(classifier, x, y, eps, method, norm, rows_per_pass) -> jax.Array:
    check_choice(method, METHODS, "method")
    check_choice(norm, NORMS, "norm")
    check_positive_int(rows_per_pass, "rows_per_pass")
    eps = check_nonnegative_float(eps, "eps")
    diameter = 1.0 if norm == "linf" else math.sqrt(math.prod(classifier.input_shape))
    if eps >= diameter:
        raise ValueError(f"eps={eps:g} covers the whole [0, 1] image box ({norm} diameter {diameter:g}): every "
                         f"image is within it of every other, so no bound can certify anything; pass eps < {diameter:g}")
    if classifier.is_randomized:
        raise ValueError(f"{classifier.name} is randomized: its logits change from call to call and have no "
                         "deterministic bounds; certify it with robustjax.certify.smoothing")
    if y is None:
        return as_images(x, input_shape=classifier.input_shape)
    check_batch(classifier, x, y)
    return jnp.asarray(x, jnp.float32)


def _box(x, eps):
    return jnp.clip(x - eps, 0.0, 1.0), jnp.clip(x + eps, 0.0, 1.0)


# --- IBP ------------------------------------------------------------------------------------------

@jax.jit
def _ibp_logits(classifier, x, eps):
    tape = trace(classifier, x.shape, "IBP")
    return interval_propagation(tape, *_box(x, eps))[tape.output]


def interval_propagation(tape: Tape, lower: jax.Array, upper: jax.Array) -> dict[int, tuple]:
    """Interval bounds of every value on ``tape`` from the image's ``[lower, upper]``."""
    bounds = {IMAGE: (lower, upper)}
    for step in tape.steps:
        ends = {p: bounds[step.inputs[p]] for p in step.bounded()}
        if step.name in AFFINE:
            centre = step.apply({p: (lo + hi) / 2 for p, (lo, hi) in ends.items()})
            radius = _radius(step, {p: (hi - lo) / 2 for p, (lo, hi) in ends.items()})
            bounds[step.output] = (centre - radius, centre + radius)
        else:
            bounds[step.output] = (step.apply({p: lo for p, (lo, _) in ends.items()}),
                                   step.apply({p: hi for p, (_, hi) in ends.items()}))
    return bounds


def _radius(step: Step, radii: dict[int, jax.Array]) -> jax.Array:
    """``|L| r``: the radius an affine step's linear part ``L`` gives to operand radii ``r``."""
    if step.name == "neg":
        return radii[step.bounded()[0]]
    if step.name == "sub":  # |x - y| spreads as r_x + r_y
        step = Step(jax.lax.add_p, step.inputs, step.output, step.shape, step.params)
    return step.apply(radii, replace=functools.partial(_linear_operand, step.name, absolute=True))


def _linear_operand(name: str, position: int, value, *, absolute: bool):
    """A constant operand of the affine step ``name`` in its linear part: a scale stays (its
    absolute value for a radius), an offset becomes 0, a selector or index stays."""
    if name in MULTIPLICATIVE:
        return jnp.abs(value) if absolute else value
    if name in ("select_n", "dynamic_slice"):
        return value
    return jnp.zeros_like(value)


# --- CROWN ----------------------------------------------------------------------------------------

class _Ball(NamedTuple):
    """The perturbation set: the ``norm`` ball of radius ``eps`` around ``centre``, in [0, 1]."""

    centre: jax.Array
    eps: jax.Array
    norm: str

    def lowest(self, a: jax.Array, box: tuple[jax.Array, jax.Array]) -> jax.Array:
        """The minimum of ``a . x`` over the set, or below it: over the ``box`` around the
        set, and for an L2 ball over the ball too, whichever is higher."""
        lower, upper = box
        over_box = jnp.sum(jnp.maximum(a, 0) * lower + jnp.minimum(a, 0) * upper)
        if self.norm == "linf":
            return over_box
        return jnp.maximum(over_box, jnp.sum(a * self.centre) - self.eps * jnp.sqrt(jnp.sum(a * a)))


@functools.partial(jax.jit, static_argnames=("rows_per_pass", "full", "norm"))
def _crown_specs(classifier, x, eps, specs, rows_per_pass, full, norm):
    """Lower and upper bounds of ``specs[i] . logits`` for each image i; specs (B, S, K).
    ``full``: CROWN bounds the relaxed steps' inputs too (else IBP does: CROWN-IBP)."""
    def one(image, spec):
        tape = trace(classifier, (1,) + image.shape, "CROWN")
        ball = _Ball(image[None], eps, norm)
        intervals = interval_propagation(tape, *_box(image[None], eps))
        bounds = _intermediate_bounds(tape, intervals, ball, rows_per_pass) if full else intervals
        rows = jnp.concatenate([spec, -spec])[:, None, :]
        lowers = _lower_bounds(tape, bounds, ball, tape.output, rows, rows_per_pass)
        logits_lower, logits_upper = intervals[tape.output]
        ibp = jnp.sum(jnp.maximum(rows, 0) * logits_lower + jnp.minimum(rows, 0) * logits_upper, axis=(1, 2))
        lowers = jnp.maximum(lowers, ibp)
        return lowers[: len(spec)], -lowers[len(spec):]

    return Bounds(*jax.vmap(one)(x, specs))


def _intermediate_bounds(tape: Tape, intervals: dict[int, tuple], ball: _Ball, rows_per_pass) -> dict[int, tuple]:
    """Bounds of every value a relaxed step reads (CROWN, one pass per neuron) and of
    every relaxed step's output (its monotone image), each intersected with its IBP
    ``intervals``: both are sound, so the intersection is, and CROWN is never looser."""
    bounds = {IMAGE: intervals[IMAGE]}
    shapes = _shapes(tape)
    for step in tape.steps:
        if step.name in AFFINE:
            continue
        for p in step.bounded():
            source = step.inputs[p]
            if source not in bounds:
                size = math.prod(shapes[source])
                rows = jnp.eye(size).reshape((size,) + shapes[source])
                lowers = _lower_bounds(tape, bounds, ball, source, jnp.concatenate([rows, -rows]), rows_per_pass)
                bounds[source] = _intersect((lowers[:size].reshape(shapes[source]),
                                             -lowers[size:].reshape(shapes[source])), intervals[source])
        ends = {p: bounds[step.inputs[p]] for p in step.bounded()}
        bounds[step.output] = _intersect((step.apply({p: lo for p, (lo, _) in ends.items()}),
                                          step.apply({p: hi for p, (_, hi) in ends.items()})),
                                         intervals[step.output])
    return bounds


def _intersect(bounds, other):
    return jnp.maximum(bounds[0], other[0]), jnp.minimum(bounds[1], other[1])


def _lower_bounds(tape: Tape, bounds, ball: _Ball, target: int, rows, rows_per_pass) -> jax.Array:
    """CROWN's lower bound of ``row . value[target]`` over ``ball`` for each of ``rows``."""
    shapes = _shapes(tape)
    upto = next(i for i, s in enumerate(tape.steps) if s.output == target) + 1 if target != IMAGE else 0

    def lower_bound(row):
        coefficients = {target: row}
        offset = jnp.zeros((), row.dtype)
        for step in reversed(tape.steps[:upto]):
            a = coefficients.pop(step.output, None)
            if a is None:
                continue
            if step.name in AFFINE:
                inputs, extra = _transpose_affine(step, a, shapes)
            else:
                inputs, extra = _relax(step, a, bounds, shapes)
            offset = offset + extra
            for p, g in inputs.items():
                source = step.inputs[p]
                coefficients[source] = coefficients[source] + g if source in coefficients else g
        return offset + ball.lowest(coefficients.get(IMAGE, jnp.zeros(shapes[IMAGE])), bounds[IMAGE])

    return jax.lax.map(lower_bound, rows, batch_size=rows_per_pass)


def _shapes(tape: Tape) -> dict[int, tuple[int, ...]]:
    return {IMAGE: tape.input_shape} | {step.output: step.shape for step in tape.steps}


def _transpose_affine(step: Step, a, shapes):
    """``a . f(v)`` as ``sum_p g_p . v_p + offset`` for the affine step ``f``."""
    positions = step.bounded()
    zeros = [jnp.zeros(shapes[step.inputs[p]]) for p in positions]
    linear_operand = functools.partial(_linear_operand, step.name, absolute=False)

    def linear(*values):
        return step.apply(dict(zip(positions, values)), replace=linear_operand)

    offset = jnp.sum(a * step.apply(dict(zip(positions, zeros))))
    return dict(zip(positions, jax.linear_transpose(linear, *zeros)(a))), offset


def _relax(step: Step, a, bounds, shapes):
    """A lower bound of ``a . step(v)`` linear in ``v``, from the bounds of ``v``."""
    (p,) = step.bounded()
    lower, upper = bounds[step.inputs[p]]
    if step.name in ("max", "min"):
        return _relax_clip(step, p, a, lower, upper, shapes)
    return _relax_max_pool(step, p, a, lower, upper)


def _relax_clip(step: Step, p, a, lower, upper, shapes):
    """``max(x, c) = c + relu(x - c)`` and ``min(x, c) = c - relu(c - x)``."""
    c = jnp.broadcast_to(step.inputs[1 - p].value, step.shape)
    sign = 1.0 if step.name == "max" else -1.0
    lz, uz = (lower - c, upper - c) if sign > 0 else (c - upper, c - lower)
    az, offset = _relu_lower(sign * a, lz, uz)
    coefficient = _unbroadcast(sign * az, shapes[step.inputs[p]])
    return {p: coefficient}, offset + jnp.sum(a * c) - jnp.sum(sign * az * c)


def _relu_lower(a, lower, upper):
    """``a . relu(z) >= az . z + offset`` for z in [lower, upper] (CROWN's relaxation)."""
    unstable = (lower < 0) & (upper > 0)
    width = jnp.where(unstable, upper - lower, 1.0)
    slope_above = jnp.where(unstable, upper / width, (lower >= 0).astype(a.dtype))
    slope_below = jnp.where(unstable, (upper > -lower).astype(a.dtype), (lower >= 0).astype(a.dtype))
    intercept_above = jnp.where(unstable, -slope_above * lower, 0.0)
    positive, negative = jnp.maximum(a, 0), jnp.minimum(a, 0)
    return positive * slope_below + negative * slope_above, jnp.sum(negative * intercept_above)


def _relax_max_pool(step: Step, p, a, lower, upper):
    """Below: the element largest at the lower bounds. Above: that element when its lower
    bound tops every other element's upper bound in the window (``reduce_max`` only),
    else the window's largest upper bound."""
    def pool(v):
        return step.apply({p: v})

    at_lower, select = jax.vjp(pool, lower)
    ceiling = pool(upper)
    if step.name == "reduce_max":
        (chosen,) = select(jnp.ones_like(at_lower))
        count = jnp.sum(chosen > 0, axis=step.params["axes"])
        runner_up = pool(jnp.where(chosen > 0, -jnp.inf, upper))
        exact = (count == 1) & (at_lower >= runner_up)
    else:
        exact = jnp.zeros(at_lower.shape, bool)
    negative = jnp.minimum(a, 0)
    coefficient = jnp.maximum(a, 0) + jnp.where(exact, negative, 0.0)
    (g,) = select(coefficient)
    return {p: g}, jnp.sum(jnp.where(exact, 0.0, negative * ceiling))


def _unbroadcast(g, shape):
    """Sums ``g`` over the axes an operand of ``shape`` was broadcast along."""
    axes = tuple(i for i, (n, m) in enumerate(zip(g.shape, shape)) if m == 1 and n != 1)
    return jnp.sum(g, axis=axes, keepdims=True).reshape(shape)
