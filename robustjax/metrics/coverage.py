"""Neuron coverage of a test set (DeepGauge: Ma et al., "DeepGauge: Multi-Granularity Testing
Criteria for Deep Learning Systems", ASE 2018).

A neuron n has a value phi(x, n) per input x. Its training range [low_n, high_n] is the
minimum and maximum of phi over the WHOLE training set (:class:`NeuronBounds`, streamed).
For a test set T, with N the set of neurons:

- KMNC(T, k) = sum_n |{sections S^n_i hit by some x in T}| / (k |N|), the range of each
  neuron split into k equal closed sections (a neuron with low = high has k coinciding
  sections, all hit by the value low);
- NBC(T) = (|Upper| + |Lower|) / (2 |N|), Upper = {n : exists x, phi(x, n) > high_n} and
  Lower = {n : exists x, phi(x, n) < low_n};
- SNAC(T) = |Upper| / |N|;
- TKNC(T, k) = |union over x and layers l of top_k(x, l)| / |N|;
- TKNP(T, k) = |{(top_k(x, 1), ..., top_k(x, L)) : x in T}|, a count of distinct patterns,
  top_k(x, l) taken as a set (ties, -0.0 = +0.0 included, go to the lower neuron index; k
  is capped at the width).

Higher is better for all five: the test set exercises more of what the network learned.

What a neuron is: activations are a dict ``{layer: (B, ..., C)}`` (``classifier.features``);
:func:`neuron_values` picks the layers and, for layers with spatial axes, either
``conv_neuron="channel"`` (a neuron is a channel, its value the spatial mean, as DeepGauge
does for convolutions; the default) or ``conv_neuron="unit"`` (every element is a neuron).
The coverage functions then take ``{layer: (B, n_layer)}``.

Deviations from the AISafety toolkit (see reference/aisafety.md): bounds and coverage use
every batch, not only the first; SNAC is not halved; NBC counts a neuron that crosses both
bounds twice; the toolkit's elementwise any-position rule for KMNC/NBC/SNAC is not offered.
TKNP is streamed exactly: :class:`TopKPatterns` keeps the distinct patterns themselves in a
table of fixed ``capacity`` rows (merge = sorted union) and refuses to report once more than
``capacity`` distinct patterns were seen.

Streaming: :class:`NeuronBounds` profiles the training ranges (an input of the coverage
accumulators, not a metric: it has no ``compute``); :class:`KMultisectionCoverage`,
:class:`BoundaryCoverage`, :class:`TopKCoverage` and :class:`TopKPatterns` follow the
protocol of :mod:`robustjax.metrics.accumulator` and compute ``"kmnc"``, ``"nbc"`` and
``"snac"``, ``"tknc"``, ``"tknp"``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from robustjax.checks import (
    as_images,
    check_choice,
    check_examples_seen,
    check_layer_widths,
    check_positive_int,
    concrete_values,
)
from robustjax.metrics.accumulator import batch_count, check_mergeable, setting

ConvNeuron = Literal["channel", "unit"]
Activations = Mapping[str, Float[Array, "b n"]]
_EMPTY_ROW = np.iinfo(np.int32).max  # fills unused TKNP table rows; sorts after every pattern


# --------------------------------------------------------------------------- neurons


def neuron_values(
    features: Mapping[str, jax.Array],
    layers: Sequence[str] | None = None,
    *,
    conv_neuron: ConvNeuron = "channel",
) -> dict[str, Float[Array, "b n"]]:
    """Per-neuron values ``{layer: (B, n_layer)}`` from per-layer activations ``(B, ..., C)``.

    ``layers``: names to keep, in order (default: every layer but ``"logits"``).
    ``conv_neuron``: for activations with axes between batch and channels, ``"channel"``
    averages them (one neuron per channel, DeepGauge's rule for convolutions) and
    ``"unit"`` flattens them (one neuron per element).
    """
    check_choice(conv_neuron, ("channel", "unit"), "conv_neuron")
    names = [name for name in features if name != "logits"] if layers is None else list(layers)
    if not names:
        raise ValueError("no layers selected for neuron coverage")
    if missing := [name for name in names if name not in features]:
        raise ValueError(f"unknown layers {missing}; available: {sorted(features)}")
    values = {}
    for name in names:
        a = jnp.asarray(features[name])
        if a.ndim < 2:
            raise ValueError(f"layer {name!r} activations must be (B, ..., C), got shape {a.shape}")
        if a.ndim > 2:
            a = a.mean(axis=tuple(range(1, a.ndim - 1))) if conv_neuron == "channel" else a.reshape(a.shape[0], -1)
        values[name] = a.astype(jnp.float32)
    return values


@functools.partial(jax.jit, static_argnames=("layers", "conv_neuron"))
def _classifier_neurons(classifier, x, layers, conv_neuron):
    return neuron_values(classifier.features(x), layers, conv_neuron=conv_neuron)


def classifier_neurons(
    classifier,
    x: Float[Array, "b h w c"],
    layers: Sequence[str] | None = None,
    *,
    conv_neuron: ConvNeuron = "channel",
) -> dict[str, Float[Array, "b n"]]:
    """:func:`neuron_values` of ``classifier.features(x)``, validated and jitted."""
    x = as_images(x, input_shape=classifier.input_shape)
    check_choice(conv_neuron, ("channel", "unit"), "conv_neuron")
    return _classifier_neurons(classifier, x, None if layers is None else tuple(layers), conv_neuron)


def _check_values(values: Activations, widths: Mapping[str, int] | None = None) -> None:
    """Host checks of ``{layer: (B, n)}``: non-empty, consistent batch, widths, no NaN."""
    if not isinstance(values, Mapping) or not values:
        raise TypeError("activations must be a non-empty dict {layer: (B, n) array}")
    if widths is not None and list(values) != list(widths):
        raise ValueError(f"activations have layers {list(values)}, expected {list(widths)}")
    batch = None
    for name, a in values.items():
        if a.ndim != 2:
            raise ValueError(f"layer {name!r} must be (B, n) neuron values, got shape {a.shape}; use neuron_values")
        if a.shape[0] == 0:
            raise ValueError(f"layer {name!r} is an empty batch")
        if batch is not None and a.shape[0] != batch:
            raise ValueError(f"layers disagree on the batch size: {batch} and {a.shape[0]} ({name!r})")
        batch = a.shape[0]
        if widths is not None and a.shape[1] != widths[name]:
            raise ValueError(f"layer {name!r} has {a.shape[1]} neurons, expected {widths[name]}")
        concrete = concrete_values(a)
        if concrete is not None and np.isnan(concrete).any():
            raise ValueError(f"layer {name!r} activations contain NaN")


def _widths(values: Activations) -> dict[str, int]:
    return {name: int(a.shape[1]) for name, a in values.items()}


def _total(tree) -> jax.Array:
    """How many entries are set, over every layer of a dict of bool arrays (exact)."""
    return sum(jnp.sum(leaf, dtype=jnp.int32) for leaf in jax.tree.leaves(tree))


def _size(tree) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(tree))


# --------------------------------------------------------------------------- bounds


def _batch_size(values: Activations) -> jax.Array:
    return batch_count(next(iter(values.values())))


@struct.dataclass
class NeuronBounds:
    """Streaming per-neuron minimum and maximum over a (training) set: DeepGauge's
    [low_n, high_n]. ``merge`` takes the elementwise min and max, so batches and devices
    combine in any order. The profile is read from ``low`` and ``high`` ({layer: (n,)}).

    ``NeuronBounds.empty(widths).update(values)...``, ``widths = {layer: n_layer}``.
    """

    low: dict[str, Float[Array, "..."]]
    high: dict[str, Float[Array, "..."]]
    count: Int[Array, "..."]

    @classmethod
    def empty(cls, widths: Mapping[str, int]) -> NeuronBounds:
        check_layer_widths(widths)
        return cls(
            {name: jnp.full((width,), jnp.inf, jnp.float32) for name, width in widths.items()},
            {name: jnp.full((width,), -jnp.inf, jnp.float32) for name, width in widths.items()},
            jnp.zeros((), jnp.int32),
        )

    @property
    def widths(self) -> dict[str, int]:
        return {name: int(low.shape[0]) for name, low in self.low.items()}

    def update(self, values: Activations) -> NeuronBounds:
        _check_values(values, self.widths)
        return self.replace(
            low={name: jnp.minimum(self.low[name], a.min(axis=0)) for name, a in values.items()},
            high={name: jnp.maximum(self.high[name], a.max(axis=0)) for name, a in values.items()},
            count=self.count + _batch_size(values),
        )

    def merge(self, other: NeuronBounds) -> NeuronBounds:
        check_mergeable(self, other)
        return self.replace(
            low=jax.tree.map(jnp.minimum, self.low, other.low),
            high=jax.tree.map(jnp.maximum, self.high, other.high),
            count=self.count + other.count,
        )

    def check_profiled(self) -> None:
        """Raises ValueError when no training batch has been seen."""
        check_examples_seen(self.count, "neuron bounds are not profiled")


def _section_hits(v, low, high, k: int) -> jax.Array:
    """(n, k) bool: section i of neuron n is hit by some row of v (B, n)."""
    width = (high - low) / k
    degenerate = width == 0
    inside = (v >= low) & (v <= high)
    section = jnp.clip(jnp.floor((v - low) / jnp.where(degenerate, 1.0, width)), 0, k - 1).astype(jnp.int32)
    neuron = jnp.broadcast_to(jnp.arange(v.shape[1]), v.shape)
    hits = jnp.zeros((v.shape[1], k), bool).at[neuron, jnp.where(inside, section, k)].set(True, mode="drop")
    return hits | (degenerate & inside.any(axis=0))[:, None]


@struct.dataclass
class KMultisectionCoverage:
    """Streaming KMNC: which of the k sections of each neuron's training range were hit.

    ``KMultisectionCoverage.empty(bounds, k).update(values)...compute()``. The bounds are
    fixed by ``empty``; accumulators merged together must share them (``merge`` keeps
    ``self``'s).
    """

    low: dict[str, Float[Array, "..."]]
    high: dict[str, Float[Array, "..."]]
    hits: dict[str, Bool[Array, "..."]]  # (n, k) per layer
    count: Int[Array, "..."]

    @classmethod
    def empty(cls, bounds: NeuronBounds, k: int = 20) -> KMultisectionCoverage:
        bounds.check_profiled()
        check_positive_int(k, "k")
        hits = {name: jnp.zeros((low.shape[0], k), bool) for name, low in bounds.low.items()}
        return cls(dict(bounds.low), dict(bounds.high), hits, jnp.zeros((), jnp.int32))

    def update(self, values: Activations) -> KMultisectionCoverage:
        _check_values(values, {name: low.shape[0] for name, low in self.low.items()})
        k = next(iter(self.hits.values())).shape[1]
        hits = {name: self.hits[name] | _section_hits(a, self.low[name], self.high[name], k) for name, a in values.items()}
        return self.replace(hits=hits, count=self.count + _batch_size(values))

    def merge(self, other: KMultisectionCoverage) -> KMultisectionCoverage:
        check_mergeable(self, other)
        return self.replace(hits=jax.tree.map(jnp.logical_or, self.hits, other.hits), count=self.count + other.count)

    def compute(self) -> dict[str, jax.Array]:
        """``{"kmnc"}``."""
        check_examples_seen(self.count, "KMNC")
        return {"kmnc": _total(self.hits) / _size(self.hits)}


@struct.dataclass
class BoundaryCoverage:
    """Streaming NBC and SNAC: neurons pushed above their training maximum (upper corner)
    or below their minimum (lower corner) by some test input."""

    low: dict[str, Float[Array, "..."]]
    high: dict[str, Float[Array, "..."]]
    upper: dict[str, Bool[Array, "..."]]
    lower: dict[str, Bool[Array, "..."]]
    count: Int[Array, "..."]

    @classmethod
    def empty(cls, bounds: NeuronBounds) -> BoundaryCoverage:
        bounds.check_profiled()
        none = {name: jnp.zeros(low.shape, bool) for name, low in bounds.low.items()}
        return cls(dict(bounds.low), dict(bounds.high), none, dict(none), jnp.zeros((), jnp.int32))

    def update(self, values: Activations) -> BoundaryCoverage:
        _check_values(values, {name: low.shape[0] for name, low in self.low.items()})
        return self.replace(
            upper={name: self.upper[name] | (a > self.high[name]).any(axis=0) for name, a in values.items()},
            lower={name: self.lower[name] | (a < self.low[name]).any(axis=0) for name, a in values.items()},
            count=self.count + _batch_size(values),
        )

    def merge(self, other: BoundaryCoverage) -> BoundaryCoverage:
        check_mergeable(self, other)
        return self.replace(
            upper=jax.tree.map(jnp.logical_or, self.upper, other.upper),
            lower=jax.tree.map(jnp.logical_or, self.lower, other.lower),
            count=self.count + other.count,
        )

    def compute(self) -> dict[str, jax.Array]:
        """``{"nbc": (|Upper| + |Lower|) / 2|N|, "snac": |Upper| / |N|}``."""
        check_examples_seen(self.count, "NBC/SNAC")
        neurons = _size(self.upper)
        upper = _total(self.upper)
        return {"nbc": (upper + _total(self.lower)) / (2 * neurons), "snac": upper / neurons}


def _top_k(a: jax.Array, k: int) -> jax.Array:
    """(B, min(k, n)) indices of the largest values per row; ties go to the lower index.

    ``lax.top_k`` orders -0.0 below +0.0 (GELU and other activations give both), so zeros
    are made +0.0 first: equal values tie.
    """
    return jax.lax.top_k(jnp.where(a == 0, 0.0, a), min(k, a.shape[1]))[1]


@struct.dataclass
class TopKCoverage:
    """Streaming TKNC: the union over inputs of each layer's top-k neurons."""

    covered: dict[str, Bool[Array, "..."]]
    count: Int[Array, "..."]
    k: int = setting()

    @classmethod
    def empty(cls, widths: Mapping[str, int], k: int = 3) -> TopKCoverage:
        check_positive_int(k, "k")
        check_layer_widths(widths)
        return cls({name: jnp.zeros((width,), bool) for name, width in widths.items()}, jnp.zeros((), jnp.int32), k)

    def update(self, values: Activations) -> TopKCoverage:
        _check_values(values, {name: c.shape[0] for name, c in self.covered.items()})
        covered = {name: self.covered[name].at[_top_k(a, self.k)].set(True) for name, a in values.items()}
        return self.replace(covered=covered, count=self.count + _batch_size(values))

    def merge(self, other: TopKCoverage) -> TopKCoverage:
        check_mergeable(self, other)
        return self.replace(covered=jax.tree.map(jnp.logical_or, self.covered, other.covered), count=self.count + other.count)

    def compute(self) -> dict[str, jax.Array]:
        """``{"tknc"}``."""
        check_examples_seen(self.count, "TKNC")
        return {"tknc": _total(self.covered) / _size(self.covered)}


def top_k_patterns(values: Activations, k: int = 2) -> Int[Array, "b p"]:
    """Each input's top-k pattern: per layer the sorted indices of its top-k neurons
    (a set), concatenated over layers; p = sum over layers of min(k, n_layer)."""
    return jnp.concatenate([jnp.sort(_top_k(a, k), axis=1) for a in values.values()], axis=1).astype(jnp.int32)


def _distinct_rows(rows: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """(the first ``capacity`` distinct rows sorted, padded with empty rows; how many distinct)."""
    unique = jnp.unique(rows, axis=0, size=rows.shape[0], fill_value=_EMPTY_ROW)
    return unique[:capacity], jnp.sum(unique[:, 0] != _EMPTY_ROW)


@struct.dataclass
class TopKPatterns:
    """Streaming TKNP, exact: a table of the distinct patterns seen, at most ``capacity``.

    ``merge`` is the sorted union of two tables. Seeing more than ``capacity`` distinct
    patterns sets ``overflowed``; ``compute`` then raises (NaN when traced): raise the
    capacity.
    """

    table: Int[Array, "..."]  # (capacity, pattern length)
    overflowed: Bool[Array, "..."]
    count: Int[Array, "..."]
    k: int = setting()

    @classmethod
    def empty(cls, widths: Mapping[str, int], k: int = 2, capacity: int = 16384) -> TopKPatterns:
        check_positive_int(k, "k")
        check_positive_int(capacity, "capacity")
        check_layer_widths(widths)
        length = sum(min(k, width) for width in widths.values())
        table = jnp.full((capacity, length), _EMPTY_ROW, jnp.int32)
        return cls(table, jnp.zeros((), bool), jnp.zeros((), jnp.int32), k)

    def _union(self, rows: jax.Array, count: jax.Array, overflowed: jax.Array) -> TopKPatterns:
        capacity = self.table.shape[0]
        table, distinct = _distinct_rows(jnp.concatenate([self.table, rows]), capacity)
        return self.replace(table=table, overflowed=self.overflowed | overflowed | (distinct > capacity),
                            count=self.count + count)

    def update(self, values: Activations) -> TopKPatterns:
        _check_values(values)
        patterns = top_k_patterns(values, self.k)
        if patterns.shape[1] != self.table.shape[1]:
            raise ValueError(f"patterns have length {patterns.shape[1]}, the table expects {self.table.shape[1]}: "
                             "the layers or their widths differ from those given to empty()")
        return self._union(patterns, _batch_size(values), jnp.zeros((), bool))

    def merge(self, other: TopKPatterns) -> TopKPatterns:
        check_mergeable(self, other)
        return self._union(other.table, other.count, other.overflowed)

    def compute(self) -> dict[str, jax.Array]:
        """``{"tknp"}``: the number of distinct top-k patterns seen."""
        check_examples_seen(self.count, "TKNP")
        overflowed = concrete_values(self.overflowed)
        if overflowed is not None and bool(overflowed):
            raise ValueError(f"more than capacity={self.table.shape[0]} distinct patterns; raise the capacity")
        distinct = jnp.sum(self.table[:, 0] != _EMPTY_ROW, dtype=jnp.int32).astype(jnp.float32)
        return {"tknp": jnp.where(self.overflowed, jnp.nan, distinct)}


# --------------------------------------------------------------------------- one-shot


def kmnc(values: Activations, bounds: NeuronBounds, k: int = 20) -> Float[Array, ""]:
    """k-multisection neuron coverage of one set of neuron values (see the module docstring)."""
    return KMultisectionCoverage.empty(bounds, k).update(values).compute()["kmnc"]


def nbc(values: Activations, bounds: NeuronBounds) -> Float[Array, ""]:
    """Neuron boundary coverage (|Upper| + |Lower|) / (2 |N|)."""
    return BoundaryCoverage.empty(bounds).update(values).compute()["nbc"]


def snac(values: Activations, bounds: NeuronBounds) -> Float[Array, ""]:
    """Strong neuron activation coverage |Upper| / |N| (not halved)."""
    return BoundaryCoverage.empty(bounds).update(values).compute()["snac"]


def tknc(values: Activations, k: int = 3) -> Float[Array, ""]:
    """Top-k neuron coverage: the fraction of neurons in some input's per-layer top k."""
    return TopKCoverage.empty(_widths(values), k).update(values).compute()["tknc"]


def tknp(values: Activations, k: int = 2) -> Int[Array, ""]:
    """Top-k neuron patterns: the number of distinct per-input pattern tuples."""
    check_positive_int(k, "k")
    _check_values(values)
    patterns = top_k_patterns(values, k)
    return _distinct_rows(patterns, patterns.shape[0])[1]
