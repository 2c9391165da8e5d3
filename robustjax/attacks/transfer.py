"""Transfer attacks (Papernot et al. 2016): adversarial examples crafted with white-box
access to a surrogate model, then shown to the victim model, which is only queried for
its predictions. The victim's accuracy on them is AAB, the black-box adversarial accuracy
of the comprehensive evaluation framework. (The victim is not called ``target``: every
attack's ``target=`` is a batch of target labels.)"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from robustjax.attacks.base import Attack
from robustjax.classifier import Classifier


class TransferResult(NamedTuple):
    """Per example: the crafted images, whether they fool the surrogate and the victim."""

    x_adv: Float[Array, "b h w c"]
    surrogate_success: Bool[Array, " b"]
    success: Bool[Array, " b"]


@jax.jit
def _fooled(classifier: Classifier, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.argmax(classifier(x), axis=-1) != y


def transfer(
    attack: Attack,
    surrogate: Classifier,
    victim: Classifier,
    x: Float[ArrayLike, "b h w c"],
    y: Int[ArrayLike, " b"],
    *,
    key: jax.Array,
) -> TransferResult:
    """Crafts ``attack`` on ``surrogate`` and evaluates the result on ``victim`` (untargeted)."""
    if not isinstance(victim, Classifier):
        raise TypeError(f"victim must be a robustjax.Classifier, got {type(victim).__name__}")
    if tuple(surrogate.input_shape) != tuple(victim.input_shape) or surrogate.num_classes != victim.num_classes:
        raise ValueError(
            f"surrogate {surrogate.name!r} takes {surrogate.input_shape} images and predicts {surrogate.num_classes} "
            f"classes, victim {victim.name!r} takes {victim.input_shape} and predicts {victim.num_classes}: "
            "a transfer attack needs the same inputs and classes"
        )
    crafted = attack(surrogate, x, y, key=key)
    return TransferResult(crafted.x_adv, crafted.success, _fooled(victim, crafted.x_adv, jnp.asarray(y)))
