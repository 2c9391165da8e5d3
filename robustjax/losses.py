"""Per-example attack objectives on logits: cross-entropy and the CW margin.

All functions map logits (B, K) and integer classes (B,) to one value per example.
Attacks maximise their objective.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int


def cross_entropy(logits: Float[Array, "b k"], labels: Int[Array, " b"]) -> Float[Array, " b"]:
    """Softmax cross-entropy ``-log softmax(z)_y``."""
    return optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels)


def margin(logits: Float[Array, "b k"], labels: Int[Array, " b"]) -> Float[Array, " b"]:
    """CW margin ``z_y - max_{j != y} z_j``: negative exactly when ``y`` is not predicted.

    Carlini & Wagner, "Towards Evaluating the Robustness of Neural Networks", 2017.
    """
    true = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    others = jnp.where(jnp.arange(logits.shape[-1]) == labels[:, None], -jnp.inf, logits)
    return true - others.max(axis=-1)


def attack_margin(logits: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None) -> Float[Array, " b"]:
    """Distance from success: negative exactly when an attack has succeeded.

    Untargeted: the margin of the true label. Targeted: ``max_{j != t} z_j - z_t``, the
    negated margin of the target ``t``.
    """
    return margin(logits, labels) if target is None else -margin(logits, target)


def attack_cross_entropy(logits: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"] | None) -> Float[Array, " b"]:
    """Cross-entropy objective: CE of the true label (untargeted), minus CE of the target (targeted)."""
    return cross_entropy(logits, labels) if target is None else -cross_entropy(logits, target)


def dlr(logits: Float[Array, "b k"], labels: Int[Array, " b"]) -> Float[Array, " b"]:
    """Difference of Logits Ratio loss (Croce & Hein, "Reliable evaluation of adversarial
    robustness with an ensemble of diverse parameter-free attacks", ICML 2020):
    ``-(z_y - max_{j != y} z_j) / (z_pi1 - z_pi3)``, with ``z_pi`` the logits sorted in
    decreasing order. Invariant to shifting and scaling the logits. Needs >= 3 classes.
    """
    ordered = jnp.sort(logits, axis=-1)
    scale = ordered[:, -1] - ordered[:, -3] + 1e-12
    return -margin(logits, labels) / scale


def targeted_dlr(logits: Float[Array, "b k"], labels: Int[Array, " b"], target: Int[Array, " b"]) -> Float[Array, " b"]:
    """Targeted DLR (Croce & Hein 2020): ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``.
    Needs >= 4 classes."""
    ordered = jnp.sort(logits, axis=-1)
    scale = ordered[:, -1] - 0.5 * (ordered[:, -3] + ordered[:, -4]) + 1e-12
    true = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    aimed = jnp.take_along_axis(logits, target[:, None], axis=-1)[:, 0]
    return -(true - aimed) / scale
