"""Training-free robustness proxies of a network, from its derivatives: the input-Jacobian
norm, the input-Hessian's dominant eigenvalue, a CLEVER local Lipschitz score and the
condition number of the empirical neural tangent kernel.

NAS robustness studies rank architectures by such measures before (or instead of) training
and attacking them: Jung, Lukasik & Keuper ("Neural Architecture Design and Robustness: A
Dataset", ICLR 2023) compare input-Jacobian and input-Hessian measures with robust accuracy
over the NAS-Bench-201 cells; TE-NAS (Chen, Gong & Wang, ICLR 2021) ranks cells by the NTK's
condition number, and NAS-RobBench-201 (Wu et al., ICLR 2024) builds its robustness theory
on the NTK. Derivatives are taken with respect to the [0, 1] images (through the
classifier's normalisation) or, for the NTK, the parameters.

Every proxy but :func:`clever` is a jitted JAX function of one classifier, so a population
(a classifier whose parameters carry a leading network axis, :meth:`Classifier.stack
<robustjax.Classifier.stack>`) goes through ``jax.vmap``; :func:`population` does that and
also runs :func:`clever` (whose reverse-Weibull fit runs on the host) for every network::

    stack = Classifier.stack([net_a, net_b, net_c])
    norms = population(jacobian_norm, stack, x)                    # (3, B)
    curvature = population(hessian_eigenvalue, stack, x, y, key=key)  # (3, B)

A NAS :class:`~robustjax.nas.population.Population` maps them the same way:
``pop.map(functools.partial(hessian_eigenvalue, key=key), x, y)``.

Per-example proxies treat the examples of a batch as independent inputs (a classifier in
evaluation mode): they differentiate the batch's summed outputs, which gives every
example's own derivative only when no example's output depends on another's input (batch
norm with batch statistics breaks that).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from flax import nnx
from jaxtyping import Array, ArrayLike, Float, Int, Key

from robustjax.checks import (
    as_images,
    check_batch,
    check_choice,
    check_key,
    check_positive_float,
    check_positive_int,
    check_precision,
    check_unroll,
)
from robustjax.classifier import Classifier
from robustjax.losses import cross_entropy

Norm = Literal["l2", "linf"]
NORMS: tuple[str, ...] = ("l2", "linf")
DUAL_NORMS: dict[str, str] = {"l2": "l2", "linf": "l1"}
"""The norm a gradient is measured in for each perturbation norm (its dual)."""

WEIBULL_SHAPE_STARTS: tuple[float, ...] = (1.0, 2.0, 5.0)
"""The shape parameters the reverse-Weibull fit of :func:`reverse_weibull_location` starts from."""

_TINY = 1e-30  # floor of a norm that divides: a zero vector stays zero


# ----------------------------------------------------------------------------- validation


def _check_classifier(clf) -> None:
    if not isinstance(clf, Classifier):
        raise TypeError(f"clf must be a robustjax.Classifier, got {type(clf).__name__}")
    check_precision(clf)


def _images(clf, x) -> jax.Array:
    _check_classifier(clf)
    return as_images(x, input_shape=clf.input_shape)


def _check_class_batch(class_batch) -> None:
    if class_batch is not None:
        check_positive_int(class_batch, "class_batch")


def _resolve_unroll(unroll) -> int | bool:
    """None: unrolled on XLA's CPU backend (whose rolled loops are slow), rolled elsewhere."""
    check_unroll(unroll)
    return jax.default_backend() == "cpu" if unroll is None else unroll


# ----------------------------------------------------------------------------- helpers


def _flat(v: jax.Array) -> jax.Array:
    return v.reshape(v.shape[0], -1)


def _over_classes(fn: Callable[[jax.Array], jax.Array], cotangents: jax.Array, class_batch: int | None):
    """``fn`` of every class's cotangent (leading axis): all at once, or ``class_batch`` at a
    time (``lax.map``), which bounds the memory to ``class_batch`` input gradients."""
    if class_batch is None:
        return jax.vmap(fn)(cotangents)
    return jax.lax.map(fn, cotangents, batch_size=class_batch)


def gradient_norm(gradient: Float[Array, "n ..."], norm: str) -> Float[Array, " n"]:
    """Per-row norm of gradients, ``"l1"``, ``"l2"`` or ``"linf"`` over all but the first axis."""
    flat = _flat(gradient)
    if norm == "l1":
        return jnp.sum(jnp.abs(flat), axis=1)
    if norm == "l2":
        return jnp.sqrt(jnp.sum(jnp.square(flat), axis=1))
    if norm == "linf":
        return jnp.max(jnp.abs(flat), axis=1)
    raise ValueError(f"norm must be one of ['l1', 'l2', 'linf'], got {norm!r}")


# ----------------------------------------------------------------------------- Jacobian


def jacobian_norm(
    clf: Classifier, x: Float[ArrayLike, "b h w c"], *, class_batch: int | None = None
) -> Float[Array, " b"]:
    """||J(x_i)||_F = sqrt(sum_k ||d f_k(x_i) / d x_i||_2^2) per example: the Frobenius norm
    of the Jacobian of the logits with respect to the [0, 1] image (the measure of Jung et
    al., ICLR 2023; Hoffman et al., "Robust Learning with Jacobian Regularization", 2019).
    Lower means a flatter, usually more robust, network.

    One forward pass and one backward pass per class (reverse mode over the batch's summed
    logits); ``class_batch`` classes at a time bound the memory for many classes (default:
    all at once).
    """
    x = _images(clf, x)
    _check_class_batch(class_batch)
    return _jacobian_norm(clf, x, class_batch)


@functools.partial(jax.jit, static_argnames="class_batch")
def _jacobian_norm(clf, x, class_batch):
    logits, pullback = jax.vjp(clf, x)

    def squared_norm(one_hot):
        (gradient,) = pullback(jnp.broadcast_to(one_hot, logits.shape))
        return jnp.sum(jnp.square(_flat(gradient)), axis=1)

    per_class = _over_classes(squared_norm, jnp.eye(logits.shape[-1], dtype=logits.dtype), class_batch)
    return jnp.sqrt(jnp.sum(per_class, axis=0))


# ----------------------------------------------------------------------------- Hessian


def hessian_eigenvalue(
    clf: Classifier,
    x: Float[ArrayLike, "b h w c"],
    y: Int[ArrayLike, " b"],
    *,
    key: Key[Array, ""],
    iterations: int = 20,
    unroll: int | bool | None = None,
) -> Float[Array, " b"]:
    """The dominant eigenvalue of H_i = d^2 CE(f(x_i), y_i) / d x_i^2, the Hessian of the
    cross-entropy loss with respect to the [0, 1] image, per example (Jung et al., ICLR 2023;
    Moosavi-Dezfooli et al., "Robustness via curvature regularization, and vice versa", CVPR
    2019). Lower magnitude means a flatter loss surface around x_i.

    Sign convention: the eigenvalue of largest magnitude, with its sign: the Rayleigh
    quotient v^T H_i v of the unit vector v that power iteration converges to. Positive: the
    loss curves upwards along v (always so for a linear model, whose input Hessian is
    positive semi-definite); negative: downwards. Take ``jnp.abs`` for the spectral norm.

    ``iterations`` Hessian-vector products (forward over reverse: ``jax.jvp`` of
    ``jax.grad``) from a Gaussian start drawn from ``key`` (the same key, the same start);
    the last one's Rayleigh quotient is returned, whose error shrinks as
    (lambda_2 / lambda_1)^(2 * iterations). Two eigenvalues of equal magnitude and opposite
    sign make the iteration oscillate: the value is then between them. ``unroll`` is the
    ``lax.fori_loop`` knob (None: unrolled on the CPU, rolled on accelerators).
    """
    _check_classifier(clf)
    check_batch(clf, x, y)
    x = jnp.asarray(x, jnp.float32)
    check_key(key)
    check_positive_int(iterations, "iterations")
    return _hessian_eigenvalue(clf, x, jnp.asarray(y, jnp.int32), key, iterations, _resolve_unroll(unroll))


def _unit(v: jax.Array) -> jax.Array:
    norm = jnp.sqrt(jnp.sum(jnp.square(_flat(v)), axis=1))
    return v / jnp.maximum(norm, _TINY).reshape((-1,) + (1,) * (v.ndim - 1))


@functools.partial(jax.jit, static_argnames=("iterations", "unroll"))
def _hessian_eigenvalue(clf, x, y, key, iterations, unroll):
    gradient = jax.grad(lambda z: jnp.sum(cross_entropy(clf(z), y)))

    def step(_, state):
        v, _ = state
        hv = jax.jvp(gradient, (x,), (v,))[1]
        return _unit(hv), jnp.sum(_flat(v * hv), axis=1)

    start = _unit(jax.random.normal(key, x.shape, x.dtype))
    state = (start, jnp.zeros(x.shape[0], x.dtype))
    return jax.lax.fori_loop(0, iterations, step, state, unroll=unroll)[1]


# ----------------------------------------------------------------------------- CLEVER


def uniform_ball(
    key: Key[Array, ""], shape: tuple[int, ...], radius: float | Float[Array, ""], norm: Norm
) -> Float[Array, "n ..."]:
    """``shape[0]`` perturbations uniform in the ``norm`` ball of ``radius`` (each of shape
    ``shape[1:]``): uniform in the cube for linf; for l2 a uniform direction (a normalised
    Gaussian) at radius ``radius * U^(1/d)`` in d dimensions (a plain ``radius * U`` would
    crowd the centre)."""
    if norm == "linf":
        return jax.random.uniform(key, shape, jnp.float32, -1.0, 1.0) * radius
    if norm != "l2":
        raise ValueError(f"norm must be one of {list(NORMS)}, got {norm!r}")
    direction_key, radius_key = jax.random.split(key)
    direction = _unit(jax.random.normal(direction_key, shape, jnp.float32))
    dim = math.prod(shape[1:])
    lengths = radius * jnp.exp(jnp.log(jax.random.uniform(radius_key, shape[:1], jnp.float32)) / dim)
    return direction * lengths.reshape((-1,) + (1,) * (len(shape) - 1))


class CleverSamples(NamedTuple):
    """What CLEVER samples, before the fit (any leading axes, e.g. a network axis, before
    the example axis)."""

    maxima: Float[Array, "*n b batches k"]  # max over each batch of ||grad g_j||_dual; 0 at j = c
    margins: Float[Array, "*n b k"]  # g_j(x0) = f_c(x0) - f_j(x0); 0 at j = c
    predicted: Int[Array, "*n b"]  # c = argmax f(x0)


class CleverResult(NamedTuple):
    """Untargeted CLEVER scores and their parts (NumPy arrays, fitted on the host)."""

    score: Float[np.ndarray, "*n b"]  # min_j min(g_j(x0) / L_j, radius), L_j the Weibull fit
    cheap_score: Float[np.ndarray, "*n b"]  # the same with L_j the largest gradient norm seen
    lipschitz: Float[np.ndarray, "*n b k"]  # L_j, the fitted reverse-Weibull location; NaN at j = c
    max_gradient_norm: Float[np.ndarray, "*n b k"]  # the largest ||grad g_j||_dual seen; NaN at j = c
    predicted: Int[np.ndarray, "*n b"]


def clever_samples(
    clf: Classifier,
    x: Float[ArrayLike, "b h w c"],
    *,
    key: Key[Array, ""],
    radius: float,
    norm: Norm = "l2",
    batches: int = 100,
    samples: int = 128,
    clip: bool = True,
    class_batch: int | None = None,
) -> CleverSamples:
    """The sampling half of :func:`clever`, in JAX (jitted; maps over populations): for
    every example, ``batches`` batches of ``samples`` points uniform in the ``norm`` ball of
    ``radius`` around x0 (:func:`uniform_ball`; clipped to the [0, 1] image box when
    ``clip``), and per batch and class j the largest dual norm of grad g_j over its points,
    g_j = f_c - f_j with c the class predicted at x0. The same ``key`` draws the same
    points (for every network of a population alike). One batch is in memory at a time:
    ``samples`` x B points and their gradients for ``class_batch`` classes (default: all)."""
    x = _images(clf, x)
    check_key(key)
    check_positive_float(radius, "radius")
    check_choice(norm, NORMS, "norm")
    check_positive_int(batches, "batches")
    check_positive_int(samples, "samples")
    if not isinstance(clip, bool):
        raise TypeError(f"clip must be True or False, got {clip!r}")
    _check_class_batch(class_batch)
    return _clever_samples(clf, x, key, jnp.float32(radius), norm, batches, samples, clip, class_batch)


@functools.partial(jax.jit, static_argnames=("norm", "batches", "samples", "clip", "class_batch"))
def _clever_samples(clf, x, key, radius, norm, batches, samples, clip, class_batch):
    size = x.shape[0]
    logits = clf(x)
    num_classes = logits.shape[-1]
    predicted = jnp.argmax(logits, axis=-1)
    margins = jnp.take_along_axis(logits, predicted[:, None], axis=-1) - logits
    # cotangent of g_j for every class j: e_c - e_j per example, (K, B, K)
    cotangents = jax.nn.one_hot(predicted, num_classes, dtype=logits.dtype)[None] - jnp.eye(
        num_classes, dtype=logits.dtype)[:, None, :]
    dual = DUAL_NORMS[norm]

    def batch_maxima(batch_key):
        delta = uniform_ball(batch_key, (size * samples, *x.shape[1:]), radius, norm)
        points = jnp.repeat(x, samples, axis=0) + delta  # example-major: rows i*samples ... of x_i
        if clip:
            points = jnp.clip(points, 0.0, 1.0)
        _, pullback = jax.vjp(clf, points)

        def largest_norm(cotangent):
            (gradient,) = pullback(jnp.repeat(cotangent, samples, axis=0))
            return jnp.max(gradient_norm(gradient, dual).reshape(size, samples), axis=1)

        return _over_classes(largest_norm, cotangents, class_batch).T  # (B, K)

    maxima = jax.lax.map(batch_maxima, jax.random.split(key, batches))  # (batches, B, K)
    return CleverSamples(jnp.moveaxis(maxima, 0, 1), margins, predicted)


def reverse_weibull_location(maxima: Float[ArrayLike, " n"]) -> float:
    """The location (right end point) of a reverse Weibull distribution fitted by maximum
    likelihood to batch maxima (``scipy.stats.weibull_max.fit``): CLEVER's estimate of the
    largest gradient norm, hence of the local Lipschitz constant.

    The three-parameter likelihood has poor local optima (and is unbounded as the shape
    falls below 1 with the location at the largest maximum), so the fit starts from each
    shape of :data:`WEIBULL_SHAPE_STARTS`, on standardised values, and keeps the fit
    closest to the data (smallest Kolmogorov-Smirnov statistic). Maxima that (nearly) all
    coincide, as for a model whose gradient is constant in the ball, are a point mass at
    their value, returned without a fit; so is the largest maximum when no fit succeeds or
    the fit ends below it.
    """
    values = np.asarray(maxima, np.float64).ravel()
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError("maxima must be a non-empty array of finite numbers")
    top = float(values.max())
    spread = float(values.std())
    if spread <= 1e-6 * max(abs(top), _TINY):
        return top
    mean = float(values.mean())
    standard = (values - mean) / spread
    best, location = math.inf, top
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for shape in WEIBULL_SHAPE_STARTS:
            try:
                fitted = scipy.stats.weibull_max.fit(standard, shape)
            except (ValueError, RuntimeError, FloatingPointError):
                continue
            distance = scipy.stats.kstest(standard, "weibull_max", fitted).statistic
            if np.all(np.isfinite(fitted)) and distance < best:
                best, location = distance, mean + float(fitted[1]) * spread
    return location if math.isfinite(location) and location >= top else top


def fit_clever(samples: CleverSamples, *, radius: float) -> CleverResult:
    """The fitting half of :func:`clever`, on the host: L_j by :func:`reverse_weibull_location`
    for every example and class j != c, then the scores. Takes the ``samples`` of one
    network or of a population (leading network axis)."""
    check_positive_float(radius, "radius")
    maxima = np.asarray(samples.maxima, np.float64)
    margins = np.asarray(samples.margins, np.float64)
    predicted = np.asarray(samples.predicted)
    num_classes = margins.shape[-1]
    if maxima.shape[:-2] != margins.shape[:-1] or maxima.shape[-1] != num_classes \
            or predicted.shape != margins.shape[:-1]:
        raise ValueError(f"samples do not fit together: maxima {maxima.shape}, margins {margins.shape}, "
                         f"predicted {predicted.shape}")
    others = np.arange(num_classes) != predicted[..., None]
    seen = np.where(others, maxima.max(axis=-2), np.nan)
    lipschitz = np.full(margins.shape, np.nan)
    for index in zip(*np.nonzero(others)):
        lipschitz[index] = reverse_weibull_location(maxima[index[:-1] + (slice(None), index[-1])])

    def score(constants):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(constants > 0, margins / constants, np.inf)
        return np.min(np.minimum(np.where(others, ratio, np.inf), radius), axis=-1).astype(np.float32)

    return CleverResult(score(lipschitz), score(seen), lipschitz.astype(np.float32), seen.astype(np.float32),
                        predicted)


def clever(
    clf: Classifier,
    x: Float[ArrayLike, "b h w c"],
    *,
    key: Key[Array, ""],
    radius: float,
    norm: Norm = "l2",
    batches: int = 100,
    samples: int = 128,
    clip: bool = True,
    class_batch: int | None = None,
) -> CleverResult:
    """Untargeted CLEVER score per example (Weng et al., "Evaluating the Robustness of Neural
    Networks: An Extreme Value Theory Approach", ICLR 2018): an estimate of the smallest
    ``norm`` perturbation that changes the prediction c = argmax f(x0), capped at ``radius``.

    For each other class j, g_j = f_c - f_j; by the mean value theorem no perturbation of
    norm below g_j(x0) / L_j reaches g_j = 0, L_j the largest dual norm (l2 for l2, l1 for
    linf) of grad g_j in the ball. L_j is estimated by extreme value theory: the maxima of
    ``batches`` batches of ``samples`` random points (:func:`clever_samples`) are fitted
    with a reverse Weibull distribution, whose location is L_j
    (:func:`reverse_weibull_location`). score = min_j min(g_j(x0) / L_j, radius). Higher is
    more robust. ``cheap_score`` uses the largest sampled norm in place of the fit.

    Weng et al. sample 500 batches of 1024 points (and report 2 norms and targeted forms);
    the defaults here are lighter. The fit runs on the host, one per example and class.
    """
    drawn = clever_samples(clf, x, key=key, radius=radius, norm=norm, batches=batches, samples=samples,
                           clip=clip, class_batch=class_batch)
    return fit_clever(drawn, radius=radius)


# ----------------------------------------------------------------------------- NTK


def _trainable_flags(params: Any) -> list[bool]:
    """Per leaf of ``params`` (``jax.tree.leaves`` order): whether it is a trainable
    parameter. Batch statistics (NNX ``BatchStat`` variables, a Linen ``batch_stats``
    collection), other NNX variables than ``Param`` and non-float leaves (PRNG keys) are not."""
    flags = []
    nodes = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda v: isinstance(v, nnx.Variable))[0]
    for path, node in nodes:
        if isinstance(node, nnx.Variable):
            keep = isinstance(node, nnx.Param)
        else:
            keep = not any(getattr(entry, "key", None) == "batch_stats" for entry in path)
        for leaf in jax.tree.leaves(node):
            flags.append(keep and jnp.issubdtype(jnp.result_type(leaf), jnp.floating))
    return flags


def _check_trainable(clf) -> None:
    if not any(_trainable_flags(clf.params)):
        raise ValueError(f"classifier {clf.name!r} has no trainable (floating-point) parameters")


def empirical_ntk(clf: Classifier, x: Float[ArrayLike, "b h w c"]) -> Float[Array, "b b"]:
    """The empirical neural tangent kernel (Jacot et al., NeurIPS 2018) of the summed logits
    on a batch: K = J J^T with J_i = d (sum_k f_k(x_i)) / d theta over every trainable
    parameter (batch statistics excluded), a B x B matrix.

    Summed logits, as TE-NAS (Chen et al., ICLR 2021) computes its indicator, so condition
    numbers compare with the published ones. The full (B*K) x (B*K) kernel costs K times the
    backward passes and a K^3 times larger eigenproblem, and adds little to a ranking: in
    the infinite-width limit it is a B x B kernel times the identity over classes (Jacot et
    al.), and this one is K times that B x B kernel, with the same condition number.
    The classifier runs as given (TE-NAS runs batch norm with batch statistics:
    ``Classifier.from_nnx(..., batch_statistics=True)``). The products are float32 at full
    precision (no TF32).
    """
    x = _images(clf, x)
    _check_trainable(clf)
    return _empirical_ntk(clf, x)


@jax.jit
def _empirical_ntk(clf, x):
    leaves, treedef = jax.tree.flatten(clf.params)
    chosen = [i for i, keep in enumerate(_trainable_flags(clf.params)) if keep]

    def summed_logits(trainable):
        full = list(leaves)
        for i, leaf in zip(chosen, trainable):
            full[i] = leaf
        return jnp.sum(clf.replace(params=jax.tree.unflatten(treedef, full))(x), axis=-1)

    jacobians = jax.jacrev(summed_logits)([leaves[i] for i in chosen])
    return sum(jnp.matmul(_flat(j), _flat(j).T, precision=jax.lax.Precision.HIGHEST) for j in jacobians)


def ntk_condition_number(clf: Classifier, x: Float[ArrayLike, "b h w c"]) -> Float[Array, ""]:
    """lambda_max / lambda_min of :func:`empirical_ntk` (``jnp.linalg.eigvalsh``): TE-NAS's
    trainability indicator (Chen et al., ICLR 2021); lower means better conditioned. ``inf``
    when the kernel is singular to its precision (lambda_min <= B eps lambda_max, the rank
    threshold of ``numpy.linalg.matrix_rank``), as when two images are equal or the batch
    exceeds the number of parameters."""
    x = _images(clf, x)
    _check_trainable(clf)
    return _ntk_condition_number(clf, x)


@jax.jit
def _ntk_condition_number(clf, x):
    eigenvalues = jnp.linalg.eigvalsh(_empirical_ntk(clf, x))
    resolution = x.shape[0] * jnp.finfo(eigenvalues.dtype).eps * eigenvalues[-1]
    return jnp.where(eigenvalues[0] > resolution, eigenvalues[-1] / eigenvalues[0], jnp.inf)


# ----------------------------------------------------------------------------- populations


def population(proxy: Callable[..., Any], classifiers: Classifier, *args: Any, axes: Any = 0, **kwargs: Any) -> Any:
    """``proxy(network, *args, **kwargs)`` for every network of ``classifiers``, a classifier
    whose parameters carry a leading network axis (:meth:`Classifier.stack
    <robustjax.Classifier.stack>`); ``axes`` is ``jax.vmap``'s ``in_axes`` for the
    parameters (a prefix: 0 per network, None shared). The networks run side by side in one
    compiled program (``jax.vmap``); every output gains a leading network axis, and the
    inputs and keys are shared (every network sees the same start vectors and samples).

    :func:`clever` samples for every network at once in JAX and fits on the host::

        population(jacobian_norm, stack, x)                     # (N, B)
        population(clever, stack, x, key=key, radius=0.5)       # CleverResult, fields (N, B, ...)
    """
    if not isinstance(classifiers, Classifier):
        raise TypeError(f"classifiers must be a robustjax.Classifier, got {type(classifiers).__name__}")
    if not callable(proxy):
        raise TypeError(f"proxy must be a function of a classifier, got {type(proxy).__name__}")
    if axes == 0:
        sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree.leaves(classifiers.params)}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(f"classifiers' parameters must share a leading network axis (Classifier.stack); "
                             f"found leading sizes {sorted(map(str, sizes))}")
    if proxy is clever:
        radius = kwargs.get("radius")
        drawn = population(clever_samples, classifiers, *args, axes=axes, **kwargs)
        return fit_clever(drawn, radius=radius)
    template = classifiers
    return jax.vmap(lambda params: proxy(template.replace(params=params), *args, **kwargs),
                    in_axes=(axes,))(classifiers.params)
