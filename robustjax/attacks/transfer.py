"""Transfer attacks (Papernot et al. 2016): adversarial examples crafted with white-box
access to a surrogate model, then shown to the target model, which is only queried for
its predictions. The target's accuracy on them is AAB, the black-box adversarial accuracy
of the comprehensive evaluation framework."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from robustjax.attacks.base import Attack
from robustjax.classifier import Classifier


class TransferResult(NamedTuple):
    """Per example: the crafted images, whether they fool the surrogate and the target."""

    x_adv: Float[Array, "b h w c"]
    surrogate_success: Bool[Array, " b"]
    success: Bool[Array, " b"]


@jax.jit
def _fooled(classifier: Classifier, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.argmax(classifier(x), axis=-1) != y


def transfer(
    attack: Attack,
    surrogate: Classifier,
    target: Classifier,
    x: Float[Array, "b h w c"],
    y: Int[Array, " b"],
    *,
    key: jax.Array,
) -> TransferResult:
    """Crafts ``attack`` on ``surrogate`` and evaluates the result on ``target`` (untargeted)."""
    if not isinstance(target, Classifier):
        raise TypeError(f"target must be a robustjax.Classifier, got {type(target).__name__}")
    if tuple(surrogate.input_shape) != tuple(target.input_shape) or surrogate.num_classes != target.num_classes:
        raise ValueError(
            f"surrogate {surrogate.name!r} takes {surrogate.input_shape} images and predicts {surrogate.num_classes} "
            f"classes, target {target.name!r} takes {target.input_shape} and predicts {target.num_classes}: "
            "a transfer attack needs the same inputs and classes"
        )
    crafted = attack(surrogate, x, y, key=key)
    return TransferResult(crafted.x_adv, crafted.success, _fooled(target, crafted.x_adv, jnp.asarray(y)))
