"""Projected Gradient Descent (Madry et al., "Towards Deep Learning Models Resistant to
Adversarial Attacks", 2018), also known as BIM/I-FGSM without the random start.

Each step moves ``step_size`` along the steepest-ascent direction of the cross-entropy
(sign of the gradient for linf, normalised gradient for l2, a sparse signed step on the
largest gradient coordinates for l1, as in Croce & Hein 2021), projects onto the
eps-ball around ``x`` and clips to [0, 1] (for l1: projects exactly onto the ball
intersected with the box). With ``early_stop`` an example stops at its first
successful iterate, which is the one returned (the per-example worst case); without it the
last iterate is returned, as in torchattacks.
"""

from __future__ import annotations

import dataclasses

from robustjax.attacks import threat
from robustjax.attacks.base import register_attack
from robustjax.attacks.loop import GradientAscent
from robustjax.checks import check_choice, check_in_interval, check_nonnegative_float, check_positive_int


def check_unroll(unroll) -> None:
    if unroll is None or isinstance(unroll, bool):
        return
    check_positive_int(unroll, "unroll")


def check_iterative(attack) -> None:
    """Validates the fields PGD-like attacks share: eps, norm, steps, step_size, l1_sparsity, unroll."""
    check_nonnegative_float(attack.eps, "eps")
    check_choice(attack.norm, threat.NORMS, "norm")
    check_positive_int(attack.steps, "steps")
    if attack.step_size is not None:
        check_nonnegative_float(attack.step_size, "step_size")
    check_unroll(attack.unroll)
    check_in_interval(attack.l1_sparsity, "l1_sparsity", 0, 1, closed_high=True)


@register_attack("pgd")
@dataclasses.dataclass(frozen=True)
class PGD(GradientAscent):
    """PGD in the linf, l2 or l1 ball of radius ``eps``.

    Attributes:
      eps: radius of the threat ball.
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      steps: number of gradient steps.
      step_size: step length; ``None`` means ``2.5 * eps / steps``.
      random_start: start from a uniform point in the ball instead of ``x``.
      early_stop: freeze each example at its first successful iterate.
      l1_sparsity: for l1, the fraction of coordinates one step moves.
      unroll: ``lax.fori_loop`` unrolling (``True``, ``False`` or a factor); ``None``
        chooses per backend.
    """

    eps: float = 8 / 255
    norm: str = "linf"
    steps: int = 10
    step_size: float | None = None
    random_start: bool = True
    early_stop: bool = True
    l1_sparsity: float = 0.05
    unroll: int | bool | None = None

    def __post_init__(self):
        check_iterative(self)

    @property
    def alpha(self) -> float:
        return 2.5 * self.eps / self.steps if self.step_size is None else self.step_size

    def initial_carry(self, x):
        return ()

    def update(self, x, step, x_adv, grad, carry):
        return threat.ascent_step(x, x_adv, grad, self.alpha, self.eps, self.norm, threat.l1_count(self.l1_sparsity, x)), carry
