"""Fast Gradient Sign Method (Goodfellow et al., "Explaining and Harnessing Adversarial
Examples", 2015): ``x_adv = clip(x + eps * sign(grad_x CE(f(x), y)), 0, 1)``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.checks import check_nonnegative_float
from robustjax.losses import attack_cross_entropy


def objective_gradient(classifier, x, y, target):
    """Gradient of the summed per-example cross-entropy objective with respect to ``x``."""
    return jax.grad(lambda images: attack_cross_entropy(classifier(images), y, target).sum())(x)


@register_attack("fgsm")
@dataclasses.dataclass(frozen=True)
class FGSM(Attack):
    """One signed-gradient step of size ``eps`` (L-infinity); targeted mode descends the
    cross-entropy of the target."""

    traceable = ("eps",)

    eps: float | jax.Array = 8 / 255

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)

    def run(self, classifier, x, y, key, target) -> AttackResult:
        del key  # deterministic
        grad = objective_gradient(classifier, x, y, target)
        x_adv = jnp.clip(x + self.eps * jnp.sign(grad), 0.0, 1.0)
        return finalize(classifier, x_adv, y, target, queries=jnp.ones(x.shape[0], jnp.int32))
