"""Projected Gradient Descent (Madry et al., "Towards Deep Learning Models Resistant to
Adversarial Attacks", 2018), also known as BIM/I-FGSM without the random start.

Each step moves ``step_size`` along the steepest-ascent direction of the cross-entropy
(sign of the gradient for linf, normalised gradient for l2), projects onto the eps-ball
around ``x`` and clips to [0, 1]. With ``early_stop`` an example stops at its first
successful iterate, which is the one returned (the per-example worst case); without it the
last iterate is returned, as in torchattacks.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from robustjax.attacks import threat
from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.checks import check_choice, check_nonnegative_float, check_positive_int
from robustjax.losses import attack_cross_entropy, attack_margin


def resolve_unroll(unroll: int | bool | None) -> int | bool:
    """``None`` picks the faster loop for the backend: XLA's CPU backend runs an unrolled
    loop several times faster than a rolled one (see benchmarks/), accelerators do not
    need it and compile faster rolled."""
    if unroll is None:
        return jax.default_backend() == "cpu"
    return unroll


def check_unroll(unroll) -> None:
    if unroll is None or isinstance(unroll, bool):
        return
    check_positive_int(unroll, "unroll")


@register_attack("pgd")
@dataclasses.dataclass(frozen=True)
class PGD(Attack):
    """PGD in the linf or l2 ball of radius ``eps``.

    Attributes:
      eps: radius of the threat ball.
      norm: ``"linf"`` or ``"l2"``.
      steps: number of gradient steps.
      step_size: step length; ``None`` means ``2.5 * eps / steps``.
      random_start: start from a uniform point in the ball instead of ``x``.
      early_stop: freeze each example at its first successful iterate.
      unroll: ``lax.fori_loop`` unrolling (``True``, ``False`` or a factor); ``None``
        chooses per backend.
    """

    eps: float = 8 / 255
    norm: str = "linf"
    steps: int = 10
    step_size: float | None = None
    random_start: bool = True
    early_stop: bool = True
    unroll: int | bool | None = None

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps")
        check_choice(self.norm, threat.NORMS, "norm")
        check_positive_int(self.steps, "steps")
        if self.step_size is not None:
            check_nonnegative_float(self.step_size, "step_size")
        check_unroll(self.unroll)

    @property
    def alpha(self) -> float:
        return 2.5 * self.eps / self.steps if self.step_size is None else self.step_size

    def run(self, classifier, x, y, key, target) -> AttackResult:
        x_adv = threat.random_start(key, x, self.eps, self.norm) if self.random_start else x

        def objective(images):
            logits = classifier(images)
            return attack_cross_entropy(logits, y, target).sum(), logits

        def step(_, state):
            x_adv, done, queries = state
            grad, logits = jax.grad(objective, has_aux=True)(x_adv)
            queries = queries + (~done).astype(jnp.int32)
            if self.early_stop:
                done = done | (attack_margin(logits, y, target) < 0)
            moved = x_adv + self.alpha * threat.ascent_direction(grad, self.norm)
            moved = jnp.clip(x + threat.project(moved - x, self.eps, self.norm), 0.0, 1.0)
            keep = done.reshape((-1,) + (1,) * (x.ndim - 1))
            return jnp.where(keep, x_adv, moved), done, queries

        batch = x.shape[0]
        init = (x_adv, jnp.zeros(batch, bool), jnp.zeros(batch, jnp.int32))
        x_adv, _, queries = jax.lax.fori_loop(0, self.steps, step, init, unroll=resolve_unroll(self.unroll))
        return finalize(classifier, x_adv, y, target, queries)
