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

import jax.numpy as jnp

from robustjax.attacks import threat
from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.attacks.loop import gradient_ascent, resolve_unroll  # noqa: F401  (re-exported)
from robustjax.checks import check_choice, check_nonnegative_float, check_positive_int


def check_unroll(unroll) -> None:
    if unroll is None or isinstance(unroll, bool):
        return
    check_positive_int(unroll, "unroll")


def check_iterative(attack) -> None:
    """Validates the fields PGD-like attacks share: eps, norm, steps, step_size, unroll."""
    check_nonnegative_float(attack.eps, "eps")
    check_choice(attack.norm, threat.NORMS, "norm")
    check_positive_int(attack.steps, "steps")
    if attack.step_size is not None:
        check_nonnegative_float(attack.step_size, "step_size")
    check_unroll(attack.unroll)


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
        check_iterative(self)

    @property
    def alpha(self) -> float:
        return 2.5 * self.eps / self.steps if self.step_size is None else self.step_size

    def run(self, classifier, x, y, key, target) -> AttackResult:
        x_start = threat.random_start(key, x, self.eps, self.norm) if self.random_start else x

        def update(_, x_adv, grad, carry):
            moved = x_adv + self.alpha * threat.ascent_direction(grad, self.norm)
            return jnp.clip(x + threat.project(moved - x, self.eps, self.norm), 0.0, 1.0), carry

        x_adv, queries = gradient_ascent(
            classifier, x, y, target, x_start, steps=self.steps, update=update, carry=(),
            early_stop=self.early_stop, unroll=self.unroll,
        )
        return finalize(classifier, x_adv, y, target, queries)
