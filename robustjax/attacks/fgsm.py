"""Fast Gradient Sign Method (Goodfellow et al., "Explaining and Harnessing Adversarial
Examples", 2015): ``x_adv = clip(x + eps * sign(grad_x CE(f(x), y)), 0, 1)``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from robustjax.attacks import eot
from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.checks import check_nonnegative_float
from robustjax.losses import attack_cross_entropy


def objective_gradient(classifier, x, y, target, eot_samples: int = 1):
    """Gradient of the summed per-example cross-entropy objective with respect to ``x``,
    averaged over ``eot_samples`` noise draws (:mod:`robustjax.attacks.eot`)."""
    def loss(images, model):
        return attack_cross_entropy(model(images), y, target).sum(), ()

    return eot.expected_gradient(loss, x, classifier, 0, eot_samples)[0]


@register_attack("fgsm")
@dataclasses.dataclass(frozen=True)
class FGSM(Attack):
    """One signed-gradient step of size ``eps`` (L-infinity); targeted mode descends the
    cross-entropy of the target. ``eot_samples``: noise draws the gradient averages over,
    for a randomized classifier; each draw is a query."""

    traceable = ("eps",)

    eps: float | jax.Array = 8 / 255
    eot_samples: int = 1

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)
        eot.check_eot_samples(self.eot_samples)

    def validate(self, classifier, x, y, key, target) -> None:
        super().validate(classifier, x, y, key, target)
        eot.warn_if_deterministic(classifier, self.eot_samples, self.name)

    def run(self, classifier, x, y, key, target) -> AttackResult:
        del key  # deterministic
        grad = objective_gradient(classifier, x, y, target, self.eot_samples)
        x_adv = jnp.clip(x + self.eps * jnp.sign(grad), 0.0, 1.0)
        return finalize(classifier, x_adv, y, target, queries=jnp.full(x.shape[0], self.eot_samples, jnp.int32))
