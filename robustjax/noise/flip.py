"""Prediction stability along ImageNet-P sequences (Hendrycks & Dietterich, ICLR 2019).

For a sequence of frames x_1 .. x_T and a classifier f, each frame j is compared with a
reference frame: the first frame for noise sequences (independent draws around one clean
image), otherwise the frame ``step`` before it (``step`` is ImageNet-P's difficulty):

- flip probability: FP = mean over sequences of mean_j 1[f(x_j) != f(x_ref(j))];
- top-5 distance: T5D = mean over sequences of mean_j d(tau(x_ref), tau(x_j)), where
  sigma = tau(x_ref)^-1 tau(x_j) sends the class ranked i on the reference frame to its rank
  on frame j and d = sum_{i=1..5} sum_{l=min(i, sigma(i))+1}^{max(i, sigma(i))} 1[1 <= l-1 <= 5]
  = sum_{i=1..5} |i - min(sigma(i), 6)|, the number of adjacent transpositions that
  reorder the top five (ties ranked by class index, as ``rankdata(method='ordinal')``).

mFR and mT5D average FP and T5D over perturbations, optionally each divided by AlexNet's.
These functions are pure and jit/vmap-able; :class:`FlipStats` streams them over batches.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from robustjax.checks import check_positive_int
from robustjax.noise import sequences


def _pairs(values: jax.Array, noise_sequence: bool, step: int) -> tuple[jax.Array, jax.Array]:
    """(reference, compared) frames along axis 1, the ImageNet-P comparison rule."""
    if noise_sequence:
        if step != 1:
            raise ValueError(f"noise sequences compare every frame with the first, step must be 1, got {step}")
        return values[:, :1], values[:, 1:]
    return values[:, :-step], values[:, step:]


def _check_rule(num_frames: int, step) -> None:
    check_positive_int(step, "step")
    if num_frames <= step:
        raise ValueError(f"sequences need more than step={step} frames, got {num_frames}")


def sequence_flip_rates(
    predictions: Int[Array, "b t"], *, noise_sequence: bool, step: int = 1
) -> Float[Array, " b"]:
    """Per sequence: the fraction of compared frames whose prediction differs from the reference."""
    if predictions.ndim != 2:
        raise ValueError(f"predictions must have shape (B, T), got {tuple(predictions.shape)}")
    _check_rule(predictions.shape[1], step)
    reference, compared = _pairs(predictions, noise_sequence, step)
    return jnp.mean(compared != reference, axis=1, dtype=jnp.float32)


def flip_probability(predictions: Int[Array, "b t"], *, noise_sequence: bool, step: int = 1) -> Float[Array, ""]:
    """ImageNet-P flip probability of predicted labels (B sequences, T frames)."""
    return jnp.mean(sequence_flip_rates(predictions, noise_sequence=noise_sequence, step=step))


def top_k_distance(reference_top: Int[Array, "... k"], compared_top: Int[Array, "... k"]) -> Float[Array, "..."]:
    """ImageNet-P's top-k distance between two rankings, given each one's top-k classes.

    ``sum_i |i - min(sigma(i), k + 1)|`` with sigma(i) the rank, on the compared ranking, of
    the class ranked i on the reference ranking (k + 1 when outside its top k).
    """
    k = reference_top.shape[-1]
    ranks = jnp.arange(1, k + 1)
    match = reference_top[..., :, None] == compared_top[..., None, :]
    sigma = jnp.where(jnp.any(match, -1), jnp.sum(match * ranks, -1), k + 1)
    return jnp.sum(jnp.abs(ranks - sigma), axis=-1).astype(jnp.float32)


def sequence_top5_distances(
    logits: Float[Array, "b t n"], *, noise_sequence: bool, step: int = 1, k: int = 5
) -> Float[Array, " b"]:
    """Per sequence: the mean top-k distance between each compared frame and its reference."""
    if logits.ndim != 3:
        raise ValueError(f"logits must have shape (B, T, classes), got {tuple(logits.shape)}")
    _check_rule(logits.shape[1], step)
    check_positive_int(k, "k")
    if k > logits.shape[2]:
        raise ValueError(f"k={k} exceeds the number of classes ({logits.shape[2]})")
    top = jax.lax.top_k(logits, k)[1]  # ties: lower class index first, as rankdata 'ordinal'
    reference, compared = _pairs(top, noise_sequence, step)
    return jnp.mean(top_k_distance(reference, compared), axis=1)


def top5_distance(
    logits: Float[Array, "b t n"], *, noise_sequence: bool, step: int = 1, k: int = 5
) -> Float[Array, ""]:
    """ImageNet-P top-5 distance (T5D) of logits (B sequences, T frames, classes)."""
    return jnp.mean(sequence_top5_distances(logits, noise_sequence=noise_sequence, step=step, k=k))


class FlipStats(NamedTuple):
    """Streaming FP and T5D: sums of per-sequence values and the number of sequences.

    ``FlipStats.empty().update(logits_a, ...).merge(other).compute()``; leaves can also be
    ``psum``-ed across devices. Per-sequence means are summed, so sequences of different
    lengths still weigh one each, as in the reference evaluation.
    """

    flips: jax.Array
    top5: jax.Array
    sequences: jax.Array

    @classmethod
    def empty(cls) -> FlipStats:
        return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    def update(self, logits: Float[Array, "b t n"], *, noise_sequence: bool, step: int = 1, k: int = 5) -> FlipStats:
        rule = dict(noise_sequence=noise_sequence, step=step)
        return self.merge(FlipStats(
            jnp.sum(sequence_flip_rates(jnp.argmax(logits, -1), **rule)),
            jnp.sum(sequence_top5_distances(logits, k=k, **rule)),
            jnp.asarray(logits.shape[0], jnp.float32),
        ))

    def merge(self, other: FlipStats) -> FlipStats:
        return jax.tree.map(jnp.add, self, other)

    def compute(self) -> dict[str, jax.Array]:
        """``{"flip_probability", "top5_distance"}``; NaN-free only after at least one update."""
        return {"flip_probability": self.flips / self.sequences, "top5_distance": self.top5 / self.sequences}


def evaluate_sequences(
    classifier,
    x: Float[ArrayLike, "b h w c"],
    name: str,
    key: jax.Array,
    *,
    length: int | None = None,
    difficulty: int = 1,
    preset: sequences.Preset | None = None,
    k: int = 5,
) -> dict[str, jax.Array]:
    """Flip probability and top-5 distance of ``classifier`` on ``name`` sequences of ``x``.

    Builds the sequences (:func:`robustjax.noise.sequences.perturbation_sequence`), runs the
    classifier on all B * T frames as one batch and compares predictions by ImageNet-P's rule:
    against the first frame for noise, else against the frame ``difficulty`` steps before.
    One jitted program per (classifier architecture, name, shape, length, difficulty, preset).

    Returns:
      ``flip_probability`` and ``top5_distance`` (scalars) and their per-sequence values
      ``flip_rate_per_sequence`` and ``top5_distance_per_sequence`` (B,), which sum across
      batches (or feed :class:`FlipStats`).
    """
    if not hasattr(classifier, "input_shape") or not hasattr(classifier, "num_classes"):
        raise TypeError(f"classifier must be a robustjax Classifier, got {type(classifier).__name__}")
    preset, length = sequences.check_arguments(x, name, key, length, difficulty, preset)
    if tuple(x.shape[1:]) != tuple(classifier.input_shape):
        raise ValueError(f"x has image shape {tuple(x.shape[1:])}, the classifier expects {classifier.input_shape}")
    check_positive_int(k, "k")
    if k > classifier.num_classes:
        raise ValueError(f"k={k} exceeds the number of classes ({classifier.num_classes})")
    step = 1 if sequences.is_noise(name) else difficulty
    _check_rule(length, step)
    return _evaluate(name, preset, length, difficulty, k, classifier, x, key)


def per_sequence_scores(classifier, frames: Float[Array, "b t h w c"], name: str, difficulty: int,
                        k: int = 5) -> tuple[Float[Array, " b"], Float[Array, " b"]]:
    """Per sequence of perturbation ``name``: the flip rate and the top-k distance of
    ``classifier`` on ``frames``, by ImageNet-P's comparison rule (all frames in one batch)."""
    b, t = frames.shape[:2]
    logits = classifier(frames.reshape(b * t, *frames.shape[2:])).reshape(b, t, -1)
    noise = sequences.is_noise(name)
    rule = dict(noise_sequence=noise, step=1 if noise else difficulty)
    return sequence_flip_rates(jnp.argmax(logits, -1), **rule), sequence_top5_distances(logits, k=k, **rule)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _evaluate(name, preset, length, difficulty, k, classifier, x, key) -> dict[str, jax.Array]:
    frames = sequences.sequence_frames(name, preset, length, difficulty, x, key)
    flips, top5 = per_sequence_scores(classifier, frames, name, difficulty, k)
    return {
        "flip_probability": jnp.mean(flips),
        "top5_distance": jnp.mean(top5),
        "flip_rate_per_sequence": flips,
        "top5_distance_per_sequence": top5,
    }
