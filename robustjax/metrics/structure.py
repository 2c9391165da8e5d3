"""Model-structure metrics of "A Comprehensive Evaluation Framework for Deep Model Robustness"
(Guo, Liu et al., arXiv 2101.09617; the AISafety toolkit's definitions, bugs left out).

- EBD, empirical boundary distance: for image x_i with label y_i and M random orthonormal
  directions d_j (per-pixel RMS 1), bd_ij = the first magnitude m of an ascending grid
  (default {0, 2, ..., 126} / 255) with argmax f(clip(x_i + m d_j, 0, 1)) != y_i, else the
  largest magnitude; EBD_i = min_j bd_ij and EBD = mean_i EBD_i. Higher is more robust.
- EBD-2: the number of sign-gradient steps x <- clip(x + s sign grad_x CE(f(x), y), 0, 1)
  (s = 0.0005, no projection) until the prediction leaves the clean prediction, capped at
  ``max_steps``; capped images are dropped from the mean by default. Higher is more robust.
- ENI, empirical noise insensitivity: mean_i |CE(x_i, y_i) - CE(x'_i, y_i)| / ||x_i - x'_i||_inf
  (0 where x'_i = x_i). Lower is more robust. The toolkit's form
  |sum_i CE(x_i) - sum_i CE(x'_i)| / (N max_i ||x_i - x'_i||_inf) is ``toolkit_compat=True``.
- Neuron sensitivity (Zhang, Liu et al., "Interpreting and Improving Adversarial Robustness of
  Deep Neural Networks with Neuron Sensitivity", IEEE TIP 2021): per neuron,
  sigma = mean_i mean over the neuron's map of |F(x_i) - F(x'_i)|. Lower is more robust.
- Neuron uncertainty: per neuron, the (population) variance over inputs of its value
  (a channel's value is its spatial mean, as in :mod:`robustjax.metrics.coverage`). The
  toolkit pools every channel of a layer (a bug) and defines no direction; lower (a more
  stable neuron) is taken as more robust here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key

from robustjax.checks import (
    _concrete,
    check_batch,
    check_images,
    check_labels,
    check_positive_float,
    check_positive_int,
)
from robustjax.losses import cross_entropy
from robustjax.metrics.coverage import ConvNeuron, neuron_values

HIGHER_IS_BETTER = {
    "ebd": True,
    "ebd2": True,
    "eni": False,
    "neuron_sensitivity": False,
    "neuron_uncertainty": False,
}
EBD_MAGNITUDES = tuple(float(m) for m in np.arange(0, 127, 2) / 255)  # the toolkit's grid


def _check_count(count, what: str) -> None:
    concrete = _concrete(count)
    if concrete is not None and float(concrete) == 0:
        raise ValueError(f"{what}: no examples seen yet (update it with at least one batch)")


class MeanStats(NamedTuple):
    """Streaming mean of per-example values (EBD_i): a sum and a count."""

    total: Float[Array, ""]
    count: Float[Array, ""]

    @classmethod
    def empty(cls) -> MeanStats:
        return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    def update(self, values: Float[Array, " b"]) -> MeanStats:
        return self.merge(MeanStats(jnp.sum(values, dtype=jnp.float32), jnp.asarray(values.shape[0], jnp.float32)))

    def merge(self, other: MeanStats) -> MeanStats:
        return jax.tree.map(jnp.add, self, other)

    def compute(self) -> Float[Array, ""]:
        _check_count(self.count, "mean")
        return self.total / self.count


# --------------------------------------------------------------------------- EBD


def random_directions(key: Key[Array, ""], num_directions: int, shape: tuple[int, ...]) -> Float[Array, "m ..."]:
    """``num_directions`` orthonormal directions of ``shape`` (QR of a Gaussian matrix),
    scaled by sqrt(D) so that each has a per-pixel RMS of 1."""
    size = int(np.prod(shape))
    q, _ = jnp.linalg.qr(jax.random.normal(key, (size, num_directions), jnp.float32))
    return (q.T * jnp.sqrt(jnp.float32(size))).reshape(num_directions, *shape)


@functools.partial(jax.jit, static_argnames=("num_directions", "direction_batch"))
def _boundary_distances(classifier, x, y, key, magnitudes, num_directions, direction_batch):
    directions = random_directions(key, num_directions, x.shape[1:])

    def any_flip(magnitude):
        def flips(direction):
            return jnp.argmax(classifier(jnp.clip(x + magnitude * direction, 0.0, 1.0)), -1) != y

        return jnp.any(jax.lax.map(flips, directions, batch_size=direction_batch), axis=0)

    def cond(state):
        index, _, done = state
        return (index < magnitudes.shape[0]) & ~jnp.all(done)

    def body(state):
        index, distance, done = state
        flipped = any_flip(magnitudes[index]) & ~done
        return index + 1, jnp.where(flipped, magnitudes[index], distance), done | flipped

    start = (0, jnp.full(y.shape, magnitudes[-1]), jnp.zeros(y.shape, bool))
    return jax.lax.while_loop(cond, body, start)[1]


def boundary_distances(
    classifier,
    x: Float[Array, "b h w c"],
    y: Int[Array, " b"],
    *,
    key: Key[Array, ""],
    num_directions: int = 1000,
    magnitudes: Sequence[float] = EBD_MAGNITUDES,
    direction_batch: int = 100,
) -> Float[Array, " b"]:
    """EBD_i per image: the smallest grid magnitude at which some random direction changes
    the prediction away from the label (the largest magnitude when none does).

    Magnitudes are scanned in ascending order for all directions at once and the scan stops
    once every image is resolved, which gives min_j of each direction's first flip exactly.
    The same ``key`` gives the same directions, shared by every image of the call.
    ``direction_batch`` directions go through the network together (memory knob).
    """
    check_batch(classifier, x, y)
    check_positive_int(num_directions, "num_directions")
    check_positive_int(direction_batch, "direction_batch")
    size = int(np.prod(x.shape[1:]))
    if num_directions > size:
        raise ValueError(f"num_directions={num_directions} exceeds the {size} dimensions of an image")
    grid = np.asarray(magnitudes, np.float32)
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)) or grid.min() < 0 or np.any(np.diff(grid) <= 0):
        raise ValueError(f"magnitudes must be a non-empty, strictly increasing sequence of numbers >= 0, got {magnitudes!r}")
    return _boundary_distances(classifier, jnp.asarray(x), jnp.asarray(y), key, jnp.asarray(grid),
                               num_directions, min(direction_batch, num_directions))


def empirical_boundary_distance(classifier, x, y, *, key, **options) -> Float[Array, ""]:
    """EBD = mean_i EBD_i over one batch (stream with :class:`MeanStats`)."""
    return jnp.mean(boundary_distances(classifier, x, y, key=key, **options))


# --------------------------------------------------------------------------- EBD-2


@functools.partial(jax.jit, static_argnames=("max_steps",))
def _boundary_steps(classifier, x, y, step_size, max_steps):
    def loss(z):
        logits = classifier(z)
        return jnp.sum(cross_entropy(logits, y)), logits

    clean = jnp.argmax(classifier(x), -1)

    def cond(state):
        step, _, _, done = state
        return (step <= max_steps) & ~jnp.all(done)

    def body(state):
        step, z, steps, done = state
        (_, logits), grad = jax.value_and_grad(loss, has_aux=True)(z)
        changed = (jnp.argmax(logits, -1) != clean) & ~done
        steps = jnp.where(changed, step, steps)
        done = done | changed
        moved = jnp.clip(z + step_size * jnp.sign(grad), 0.0, 1.0)
        return step + 1, jnp.where(done[:, None, None, None], z, moved), steps, done

    start = (0, x, jnp.full(y.shape, max_steps, jnp.int32), jnp.zeros(y.shape, bool))
    _, _, steps, done = jax.lax.while_loop(cond, body, start)
    return steps, ~done


def boundary_steps(
    classifier,
    x: Float[Array, "b h w c"],
    y: Int[Array, " b"],
    *,
    step_size: float = 0.0005,
    max_steps: int = 1000,
) -> tuple[Int[Array, " b"], Bool[Array, " b"]]:
    """EBD-2 per image: (sign-gradient steps until the prediction changes, capped mask).

    Capped images (no change within ``max_steps``) report ``max_steps``.
    """
    check_batch(classifier, x, y)
    check_positive_float(step_size, "step_size")
    check_positive_int(max_steps, "max_steps")
    return _boundary_steps(classifier, jnp.asarray(x), jnp.asarray(y), jnp.float32(step_size), max_steps)


class BoundaryStepStats(NamedTuple):
    """Streaming EBD-2: step sums and counts over images that reached the boundary and overall."""

    reached_total: Float[Array, ""]
    reached: Float[Array, ""]
    total: Float[Array, ""]
    count: Float[Array, ""]

    @classmethod
    def empty(cls) -> BoundaryStepStats:
        return cls(*(jnp.zeros((), jnp.float32) for _ in range(4)))

    def update(self, steps: Int[Array, " b"], capped: Bool[Array, " b"]) -> BoundaryStepStats:
        if steps.shape != capped.shape or steps.ndim != 1:
            raise ValueError(f"steps and capped must both have shape (B,), got {steps.shape} and {capped.shape}")
        steps = steps.astype(jnp.float32)
        return self.merge(BoundaryStepStats(
            jnp.sum(jnp.where(capped, 0.0, steps)), jnp.sum(~capped, dtype=jnp.float32),
            jnp.sum(steps), jnp.asarray(steps.shape[0], jnp.float32)))

    def merge(self, other: BoundaryStepStats) -> BoundaryStepStats:
        return jax.tree.map(jnp.add, self, other)

    def compute(self, *, include_capped: bool = False) -> dict[str, Float[Array, ""]]:
        """``{"ebd2", "capped_fraction"}``. By default capped images are dropped, as in the
        toolkit; ``include_capped=True`` counts them as ``max_steps`` (a lower bound)."""
        _check_count(self.count, "EBD-2")
        if not include_capped:
            _check_count(self.reached, "EBD-2 (every image hit max_steps; use include_capped=True)")
        ebd2 = self.total / self.count if include_capped else self.reached_total / self.reached
        return {"ebd2": ebd2, "capped_fraction": 1.0 - self.reached / self.count}


# --------------------------------------------------------------------------- ENI


def _check_pair(x, x_noisy, logits, logits_noisy, y) -> None:
    check_images(x)
    check_images(x_noisy, name="x_noisy")
    if x.shape != x_noisy.shape:
        raise ValueError(f"x and x_noisy must have the same shape, got {x.shape} and {x_noisy.shape}")
    if logits.ndim != 2 or logits.shape != logits_noisy.shape or logits.shape[0] != x.shape[0]:
        raise ValueError(f"logits and logits_noisy must both be (B={x.shape[0]}, K), got {logits.shape} and {logits_noisy.shape}")
    for name, a in (("logits", logits), ("logits_noisy", logits_noisy)):
        concrete = _concrete(a)
        if concrete is not None and np.isnan(concrete).any():
            raise ValueError(f"{name} contain NaN")
    check_labels(y, num_classes=logits.shape[1], batch_size=x.shape[0])


def _eni_terms(x, x_noisy, logits, logits_noisy, y):
    clean, noisy = cross_entropy(logits, y), cross_entropy(logits_noisy, y)
    linf = jnp.max(jnp.abs(x - x_noisy).reshape(x.shape[0], -1), axis=1)
    ratio = jnp.where(linf > 0, jnp.abs(clean - noisy) / jnp.where(linf > 0, linf, 1.0), 0.0)
    return ratio, clean, noisy, linf


def noise_insensitivity(
    x: Float[Array, "b h w c"],
    x_noisy: Float[Array, "b h w c"],
    logits: Float[Array, "b k"],
    logits_noisy: Float[Array, "b k"],
    y: Int[Array, " b"],
) -> Float[Array, " b"]:
    """Per example |CE(x, y) - CE(x', y)| / ||x - x'||_inf (0 where x' = x)."""
    _check_pair(x, x_noisy, logits, logits_noisy, y)
    return _eni_terms(x, x_noisy, logits, logits_noisy, y)[0]


class NoiseInsensitivityStats(NamedTuple):
    """Streaming ENI in both forms: ratio sum (canonical), loss sums and the largest L_inf
    distance (toolkit form), and the count."""

    ratio_total: Float[Array, ""]
    clean_loss_total: Float[Array, ""]
    noisy_loss_total: Float[Array, ""]
    max_linf: Float[Array, ""]
    count: Float[Array, ""]

    @classmethod
    def empty(cls) -> NoiseInsensitivityStats:
        return cls(*(jnp.zeros((), jnp.float32) for _ in range(5)))

    def update(self, x, x_noisy, logits, logits_noisy, y) -> NoiseInsensitivityStats:
        _check_pair(x, x_noisy, logits, logits_noisy, y)
        ratio, clean, noisy, linf = _eni_terms(x, x_noisy, logits, logits_noisy, y)
        return self.merge(NoiseInsensitivityStats(
            jnp.sum(ratio), jnp.sum(clean), jnp.sum(noisy), jnp.max(linf), jnp.asarray(x.shape[0], jnp.float32)))

    def merge(self, other: NoiseInsensitivityStats) -> NoiseInsensitivityStats:
        return NoiseInsensitivityStats(
            self.ratio_total + other.ratio_total,
            self.clean_loss_total + other.clean_loss_total,
            self.noisy_loss_total + other.noisy_loss_total,
            jnp.maximum(self.max_linf, other.max_linf),
            self.count + other.count,
        )

    def compute(self, *, toolkit_compat: bool = False) -> Float[Array, ""]:
        _check_count(self.count, "ENI")
        if not toolkit_compat:
            return self.ratio_total / self.count
        gap = jnp.abs(self.clean_loss_total - self.noisy_loss_total)
        return jnp.where(self.max_linf > 0, gap / (self.count * jnp.where(self.max_linf > 0, self.max_linf, 1.0)), 0.0)


def empirical_noise_insensitivity(x, x_noisy, logits, logits_noisy, y, *, toolkit_compat: bool = False) -> Float[Array, ""]:
    """ENI of one batch (see the module docstring)."""
    return NoiseInsensitivityStats.empty().update(x, x_noisy, logits, logits_noisy, y).compute(toolkit_compat=toolkit_compat)


# --------------------------------------------------------------------------- neurons


def _check_features(features, features_noisy, layers) -> list[str]:
    names = [name for name in features if name != "logits"] if layers is None else list(layers)
    for name in names:
        if name not in features or name not in features_noisy:
            raise ValueError(f"layer {name!r} missing from the clean or the noisy features")
        if features[name].shape != features_noisy[name].shape:
            raise ValueError(f"layer {name!r}: clean {features[name].shape} and noisy {features_noisy[name].shape} differ")
        if features[name].shape[0] == 0:
            raise ValueError(f"layer {name!r} is an empty batch")
    return names


class NeuronSensitivityStats(NamedTuple):
    """Streaming neuron sensitivity: per-neuron sums of the mean |F(x) - F(x')| and a count."""

    total: dict[str, Float[Array, " n"]]
    count: Float[Array, ""]

    @classmethod
    def empty(cls, widths: Mapping[str, int]) -> NeuronSensitivityStats:
        return cls({name: jnp.zeros((int(width),), jnp.float32) for name, width in widths.items()}, jnp.zeros((), jnp.float32))

    def update(self, features, features_noisy, *, conv_neuron: ConvNeuron = "channel") -> NeuronSensitivityStats:
        names = _check_features(features, features_noisy, list(self.total))
        gaps = neuron_values({n: jnp.abs(features[n] - features_noisy[n]) for n in names}, names, conv_neuron=conv_neuron)
        for name, gap in gaps.items():
            if gap.shape[1] != self.total[name].shape[0]:
                raise ValueError(f"layer {name!r} has {gap.shape[1]} neurons, expected {self.total[name].shape[0]}")
        batch = next(iter(gaps.values())).shape[0]
        return self.merge(NeuronSensitivityStats({n: g.sum(axis=0) for n, g in gaps.items()}, jnp.asarray(batch, jnp.float32)))

    def merge(self, other: NeuronSensitivityStats) -> NeuronSensitivityStats:
        return jax.tree.map(jnp.add, self, other)

    def compute(self) -> dict[str, Float[Array, " n"]]:
        """Per-neuron sensitivity ``{layer: (n,)}``."""
        _check_count(self.count, "neuron sensitivity")
        return {name: total / self.count for name, total in self.total.items()}


def neuron_sensitivity(
    features: Mapping[str, jax.Array],
    features_noisy: Mapping[str, jax.Array],
    layers: Sequence[str] | None = None,
    *,
    conv_neuron: ConvNeuron = "channel",
) -> dict[str, Float[Array, " n"]]:
    """Per-neuron sensitivity of one batch of clean and perturbed activations."""
    names = _check_features(features, features_noisy, layers)
    widths = {n: v.shape[1] for n, v in neuron_values({n: features[n] for n in names}, names, conv_neuron=conv_neuron).items()}
    return NeuronSensitivityStats.empty(widths).update(features, features_noisy, conv_neuron=conv_neuron).compute()


class NeuronUncertaintyStats(NamedTuple):
    """Streaming per-neuron variance (Chan et al.'s pairwise update): count, mean, M2."""

    count: Float[Array, ""]
    mean: dict[str, Float[Array, " n"]]
    m2: dict[str, Float[Array, " n"]]

    @classmethod
    def empty(cls, widths: Mapping[str, int]) -> NeuronUncertaintyStats:
        zeros = {name: jnp.zeros((int(width),), jnp.float32) for name, width in widths.items()}
        return cls(jnp.zeros((), jnp.float32), zeros, dict(zeros))

    def update(self, values: Mapping[str, Float[Array, "b n"]]) -> NeuronUncertaintyStats:
        """``values``: neuron values ``{layer: (B, n)}`` from :func:`neuron_values`."""
        if list(values) != list(self.mean):
            raise ValueError(f"values have layers {list(values)}, expected {list(self.mean)}")
        for name, a in values.items():
            if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] != self.mean[name].shape[0]:
                raise ValueError(f"layer {name!r} must be (B>0, {self.mean[name].shape[0]}), got {a.shape}")
            concrete = _concrete(a)
            if concrete is not None and np.isnan(concrete).any():
                raise ValueError(f"layer {name!r} values contain NaN")
        mean = {n: a.mean(axis=0) for n, a in values.items()}
        m2 = {n: jnp.sum((a - mean[n]) ** 2, axis=0) for n, a in values.items()}
        return self.merge(NeuronUncertaintyStats(jnp.asarray(next(iter(values.values())).shape[0], jnp.float32), mean, m2))

    def merge(self, other: NeuronUncertaintyStats) -> NeuronUncertaintyStats:
        count = self.count + other.count
        weight = other.count / jnp.maximum(count, 1.0)
        delta = jax.tree.map(jnp.subtract, other.mean, self.mean)
        mean = jax.tree.map(lambda m, d: m + d * weight, self.mean, delta)
        m2 = jax.tree.map(lambda a, b, d: a + b + d**2 * self.count * weight, self.m2, other.m2, delta)
        return NeuronUncertaintyStats(count, mean, m2)

    def compute(self) -> dict[str, Float[Array, " n"]]:
        """Per-neuron population variance ``{layer: (n,)}``."""
        _check_count(self.count, "neuron uncertainty")
        return {name: m2 / self.count for name, m2 in self.m2.items()}


def neuron_uncertainty(values: Mapping[str, Float[Array, "b n"]]) -> dict[str, Float[Array, " n"]]:
    """Per-neuron variance over the batch of neuron values ``{layer: (B, n)}``."""
    widths = {name: a.shape[-1] for name, a in values.items()}
    return NeuronUncertaintyStats.empty(widths).update(values).compute()


def mean_over_neurons(per_neuron: Mapping[str, jax.Array]) -> Float[Array, ""]:
    """The mean of a per-neuron metric over every neuron of every layer (a report scalar)."""
    leaves = jax.tree.leaves(dict(per_neuron))
    if not leaves:
        raise ValueError("no neurons")
    return jnp.concatenate([jnp.ravel(leaf) for leaf in leaves]).mean()
