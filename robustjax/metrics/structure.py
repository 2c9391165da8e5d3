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

Accumulators (:mod:`robustjax.metrics.accumulator`) compute ``"ebd"``, ``"ebd2"`` and
``"capped_fraction"``, ``"eni"``, ``"neuron_sensitivity"`` and ``"neuron_uncertainty"`` (the
per-neuron metrics averaged over every neuron; ``per_neuron()`` gives them per layer).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int, Key

from robustjax.checks import (
    as_images,
    check_batch,
    check_bool,
    check_choice,
    check_examples_seen,
    check_layer_widths,
    check_positive_float,
    check_positive_int,
    concrete_values,
)
from robustjax.losses import cross_entropy
from robustjax.metrics.accumulator import Ratio, batch_count, check_mergeable, setting
from robustjax.metrics.behaviour import check_logits_and_labels
from robustjax.metrics.coverage import ConvNeuron, neuron_values
from robustjax.ops.pending import while_pending

EBD_MAGNITUDES = tuple(float(m) for m in np.arange(0, 127, 2) / 255)  # the toolkit's grid


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

    def step(index, state, inputs):
        distance, done = state
        x, y = inputs
        magnitude = magnitudes[index]

        def flips(direction):
            return jnp.argmax(classifier(jnp.clip(x + magnitude * direction, 0.0, 1.0)), -1) != y

        flipped = jnp.any(jax.lax.map(flips, directions, batch_size=direction_batch), axis=0) & ~done
        return jnp.where(flipped, magnitude, distance), done | flipped

    start = (jnp.full(y.shape, magnitudes[-1]), jnp.zeros(y.shape, bool))
    return while_pending(step, lambda state: ~state[1], start, (x, y), magnitudes.shape[0])[0]


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

    Magnitudes are scanned in ascending order for all directions at once, and an image leaves
    the scan once resolved, which gives min_j of each direction's first flip exactly. The
    images still scanning move on in batches of half the size
    (:func:`ops.pending.while_pending`), so the work follows each image's own distance, not
    the batch's largest. The same ``key`` gives the same directions, shared by every image
    of the call. ``direction_batch`` directions go through the network together (memory
    knob).
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
    """EBD = mean_i EBD_i over one batch (stream with :class:`BoundaryDistanceStats`)."""
    return jnp.mean(boundary_distances(classifier, x, y, key=key, **options))


@struct.dataclass
class BoundaryDistanceStats(Ratio):
    """Streaming EBD: the mean of the per-image distances of :func:`boundary_distances`."""

    metric = "ebd"

    def update(self, distances: Float[Array, " b"]) -> BoundaryDistanceStats:
        if not hasattr(distances, "ndim") or distances.ndim != 1 or distances.shape[0] == 0:
            raise ValueError(f"distances must have shape (B,) with B >= 1, got {getattr(distances, 'shape', distances)!r}")
        return self.add(jnp.sum(distances, dtype=jnp.float32), batch_count(distances))


# --------------------------------------------------------------------------- EBD-2


@functools.partial(jax.jit, static_argnames=("max_steps",))
def _boundary_steps(classifier, x, y, step_size, max_steps):
    def loss(z, y):
        logits = classifier(z)
        return jnp.sum(cross_entropy(logits, y)), logits

    def step(index, state, inputs):
        z, steps, done = state
        clean, y = inputs
        (_, logits), grad = jax.value_and_grad(loss, has_aux=True)(z, y)
        changed = (jnp.argmax(logits, -1) != clean) & ~done
        done = done | changed
        moved = jnp.clip(z + step_size * jnp.sign(grad), 0.0, 1.0)
        return jnp.where(done[:, None, None, None], z, moved), jnp.where(changed, index, steps), done

    start = (x, jnp.full(y.shape, max_steps, jnp.int32), jnp.zeros(y.shape, bool))
    clean = jnp.argmax(classifier(x), -1)
    _, steps, done = while_pending(step, lambda state: ~state[2], start, (clean, y), max_steps + 1)
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

    Capped images (no change within ``max_steps``) report ``max_steps``. An image stops
    stepping once its prediction changes, and the images still stepping move on in batches
    of half the size (:func:`ops.pending.while_pending`).
    """
    check_batch(classifier, x, y)
    check_positive_float(step_size, "step_size")
    check_positive_int(max_steps, "max_steps")
    return _boundary_steps(classifier, jnp.asarray(x), jnp.asarray(y), jnp.float32(step_size), max_steps)


@struct.dataclass
class BoundaryStepStats:
    """Streaming EBD-2: step sums and counts over the images that reached the boundary and
    over all of them. ``include_capped=False`` drops capped images from the mean, as the
    toolkit does; ``True`` counts them as ``max_steps`` (a lower bound)."""

    reached_steps: Int[Array, "..."]
    reached: Int[Array, "..."]
    steps: Int[Array, "..."]
    count: Int[Array, "..."]
    include_capped: bool = setting()

    @classmethod
    def empty(cls, *, include_capped: bool = False) -> BoundaryStepStats:
        check_bool(include_capped, "include_capped")
        return cls(*(jnp.zeros((), jnp.int32) for _ in range(4)), include_capped)

    def update(self, steps: Int[Array, " b"], capped: Bool[Array, " b"]) -> BoundaryStepStats:
        if steps.shape != capped.shape or steps.ndim != 1:
            raise ValueError(f"steps and capped must both have shape (B,), got {steps.shape} and {capped.shape}")
        steps = steps.astype(jnp.int32)
        return self.replace(
            reached_steps=self.reached_steps + jnp.sum(jnp.where(capped, 0, steps)),
            reached=self.reached + jnp.sum(~capped, dtype=jnp.int32),
            steps=self.steps + jnp.sum(steps),
            count=self.count + batch_count(steps),
        )

    def merge(self, other: BoundaryStepStats) -> BoundaryStepStats:
        check_mergeable(self, other)
        return jax.tree.map(jnp.add, self, other)

    def compute(self) -> dict[str, jax.Array]:
        """``{"ebd2", "capped_fraction"}``."""
        check_examples_seen(self.count, "EBD-2")
        if not self.include_capped:
            check_examples_seen(self.reached, "EBD-2 (every image hit max_steps; use include_capped=True)")
        ebd2 = self.steps / self.count if self.include_capped else self.reached_steps / self.reached
        return {"ebd2": ebd2, "capped_fraction": 1.0 - self.reached / self.count}


# --------------------------------------------------------------------------- ENI


def _check_pair(x, x_noisy, logits, logits_noisy, y) -> tuple[jax.Array, jax.Array]:
    """Validates ENI's inputs; returns the images as float32 (``checks.as_images``)."""
    x, x_noisy = as_images(x), as_images(x_noisy, name="x_noisy")
    if x.shape != x_noisy.shape:
        raise ValueError(f"x and x_noisy must have the same shape, got {x.shape} and {x_noisy.shape}")
    check_logits_and_labels(y, logits=logits, logits_noisy=logits_noisy)
    if logits.shape[0] != x.shape[0]:
        raise ValueError(f"logits have {logits.shape[0]} examples, x has {x.shape[0]}")
    return x, x_noisy


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
    x, x_noisy = _check_pair(x, x_noisy, logits, logits_noisy, y)
    return _eni_terms(x, x_noisy, logits, logits_noisy, y)[0]


@struct.dataclass
class NoiseInsensitivityStats:
    """Streaming ENI in both forms: the ratio sum (canonical); the loss sums and the largest
    L_inf distance (the toolkit's form, ``toolkit_compat=True``); the count."""

    ratio_total: Float[Array, "..."]
    clean_loss_total: Float[Array, "..."]
    noisy_loss_total: Float[Array, "..."]
    max_linf: Float[Array, "..."]
    count: Int[Array, "..."]
    toolkit_compat: bool = setting()

    @classmethod
    def empty(cls, *, toolkit_compat: bool = False) -> NoiseInsensitivityStats:
        check_bool(toolkit_compat, "toolkit_compat")
        return cls(*(jnp.zeros((), jnp.float32) for _ in range(4)), jnp.zeros((), jnp.int32), toolkit_compat)

    def update(self, x, x_noisy, logits, logits_noisy, y) -> NoiseInsensitivityStats:
        x, x_noisy = _check_pair(x, x_noisy, logits, logits_noisy, y)
        ratio, clean, noisy, linf = _eni_terms(x, x_noisy, logits, logits_noisy, y)
        return self.merge(self.replace(ratio_total=jnp.sum(ratio), clean_loss_total=jnp.sum(clean),
                                       noisy_loss_total=jnp.sum(noisy), max_linf=jnp.max(linf), count=batch_count(x)))

    def merge(self, other: NoiseInsensitivityStats) -> NoiseInsensitivityStats:
        check_mergeable(self, other)
        return self.replace(
            ratio_total=self.ratio_total + other.ratio_total,
            clean_loss_total=self.clean_loss_total + other.clean_loss_total,
            noisy_loss_total=self.noisy_loss_total + other.noisy_loss_total,
            max_linf=jnp.maximum(self.max_linf, other.max_linf),
            count=self.count + other.count,
        )

    def compute(self) -> dict[str, jax.Array]:
        """``{"eni"}``."""
        check_examples_seen(self.count, "ENI")
        if not self.toolkit_compat:
            return {"eni": self.ratio_total / self.count}
        gap = jnp.abs(self.clean_loss_total - self.noisy_loss_total)
        linf = jnp.where(self.max_linf > 0, self.max_linf, 1.0)
        return {"eni": jnp.where(self.max_linf > 0, gap / (self.count * linf), 0.0)}


def empirical_noise_insensitivity(x, x_noisy, logits, logits_noisy, y, *, toolkit_compat: bool = False) -> Float[Array, ""]:
    """ENI of one batch (see the module docstring)."""
    stats = NoiseInsensitivityStats.empty(toolkit_compat=toolkit_compat)
    return stats.update(x, x_noisy, logits, logits_noisy, y).compute()["eni"]


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


def _zeros_per_layer(widths: Mapping[str, int]) -> dict[str, jax.Array]:
    check_layer_widths(widths)
    return {name: jnp.zeros((width,), jnp.float32) for name, width in widths.items()}


@struct.dataclass
class NeuronSensitivityStats:
    """Streaming neuron sensitivity: per-neuron sums of the mean |F(x) - F(x')| and a count.
    ``update`` takes the clean and perturbed activations ``{layer: (B, ..., C)}``; neurons are
    as :func:`~robustjax.metrics.coverage.neuron_values` with ``conv_neuron``."""

    total: dict[str, Float[Array, "..."]]
    count: Int[Array, "..."]
    conv_neuron: str = setting()

    @classmethod
    def empty(cls, widths: Mapping[str, int], *, conv_neuron: ConvNeuron = "channel") -> NeuronSensitivityStats:
        check_choice(conv_neuron, ("channel", "unit"), "conv_neuron")
        return cls(_zeros_per_layer(widths), jnp.zeros((), jnp.int32), conv_neuron)

    def update(self, features, features_noisy) -> NeuronSensitivityStats:
        names = _check_features(features, features_noisy, list(self.total))
        gaps = neuron_values({n: jnp.abs(features[n] - features_noisy[n]) for n in names}, names,
                             conv_neuron=self.conv_neuron)
        for name, gap in gaps.items():
            if gap.shape[1] != self.total[name].shape[0]:
                raise ValueError(f"layer {name!r} has {gap.shape[1]} neurons, expected {self.total[name].shape[0]}")
        return self.replace(total={n: self.total[n] + g.sum(axis=0) for n, g in gaps.items()},
                            count=self.count + batch_count(next(iter(gaps.values()))))

    def merge(self, other: NeuronSensitivityStats) -> NeuronSensitivityStats:
        check_mergeable(self, other)
        return jax.tree.map(jnp.add, self, other)

    def per_neuron(self) -> dict[str, Float[Array, " n"]]:
        """Per-neuron sensitivity ``{layer: (n,)}``."""
        check_examples_seen(self.count, "neuron sensitivity")
        return {name: total / self.count for name, total in self.total.items()}

    def compute(self) -> dict[str, jax.Array]:
        """``{"neuron_sensitivity"}``: the mean over every neuron."""
        return {"neuron_sensitivity": mean_over_neurons(self.per_neuron())}


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
    stats = NeuronSensitivityStats.empty(widths, conv_neuron=conv_neuron)
    return stats.update(features, features_noisy).per_neuron()


@struct.dataclass
class NeuronUncertaintyStats:
    """Streaming per-neuron variance (Chan et al.'s pairwise update): count, mean, M2."""

    count: Int[Array, "..."]
    mean: dict[str, Float[Array, "..."]]
    m2: dict[str, Float[Array, "..."]]

    @classmethod
    def empty(cls, widths: Mapping[str, int]) -> NeuronUncertaintyStats:
        zeros = _zeros_per_layer(widths)
        return cls(jnp.zeros((), jnp.int32), zeros, dict(zeros))

    def update(self, values: Mapping[str, Float[Array, "b n"]]) -> NeuronUncertaintyStats:
        """``values``: neuron values ``{layer: (B, n)}`` from :func:`neuron_values`."""
        if list(values) != list(self.mean):
            raise ValueError(f"values have layers {list(values)}, expected {list(self.mean)}")
        for name, a in values.items():
            if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] != self.mean[name].shape[0]:
                raise ValueError(f"layer {name!r} must be (B>0, {self.mean[name].shape[0]}), got {a.shape}")
            concrete = concrete_values(a)
            if concrete is not None and np.isnan(concrete).any():
                raise ValueError(f"layer {name!r} values contain NaN")
        mean = {n: a.mean(axis=0) for n, a in values.items()}
        m2 = {n: jnp.sum((a - mean[n]) ** 2, axis=0) for n, a in values.items()}
        return self._combine(batch_count(next(iter(values.values()))), mean, m2)

    def merge(self, other: NeuronUncertaintyStats) -> NeuronUncertaintyStats:
        check_mergeable(self, other)
        return self._combine(other.count, other.mean, other.m2)

    def _combine(self, count: jax.Array, mean: dict, m2: dict) -> NeuronUncertaintyStats:
        """Chan et al.'s pairwise combination with another (count, mean, M2)."""
        total = self.count + count
        mine, weight = self.count.astype(jnp.float32), count / jnp.maximum(total, 1)
        delta = jax.tree.map(jnp.subtract, mean, self.mean)
        return self.replace(
            count=total,
            mean=jax.tree.map(lambda m, d: m + d * weight, self.mean, delta),
            m2=jax.tree.map(lambda a, b, d: a + b + d**2 * mine * weight, self.m2, m2, delta),
        )

    def per_neuron(self) -> dict[str, Float[Array, " n"]]:
        """Per-neuron population variance ``{layer: (n,)}``."""
        check_examples_seen(self.count, "neuron uncertainty")
        return {name: m2 / self.count for name, m2 in self.m2.items()}

    def compute(self) -> dict[str, jax.Array]:
        """``{"neuron_uncertainty"}``: the mean over every neuron."""
        return {"neuron_uncertainty": mean_over_neurons(self.per_neuron())}


def neuron_uncertainty(values: Mapping[str, Float[Array, "b n"]]) -> dict[str, Float[Array, " n"]]:
    """Per-neuron variance over the batch of neuron values ``{layer: (B, n)}``."""
    widths = {name: a.shape[-1] for name, a in values.items()}
    return NeuronUncertaintyStats.empty(widths).update(values).per_neuron()


def mean_over_neurons(per_neuron: Mapping[str, jax.Array]) -> Float[Array, ""]:
    """The mean of a per-neuron metric over every neuron of every layer (a report scalar)."""
    leaves = jax.tree.leaves(dict(per_neuron))
    if not leaves:
        raise ValueError("no neurons")
    return jnp.concatenate([jnp.ravel(leaf) for leaf in leaves]).mean()
