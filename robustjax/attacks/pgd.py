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

import jax

from robustjax.attacks import threat
from robustjax.attacks.base import register_attack
from robustjax.attacks.loop import GradientAscent


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
      eot_samples: noise draws each step's gradient averages over, for a randomized
        classifier (:mod:`robustjax.attacks.eot`); each draw is a query.
      unroll: ``lax.fori_loop`` unrolling (``True``, ``False`` or a factor); ``None``
        chooses per backend (full unrolling on CPU). Rolled by default: with the zoo's and
        :mod:`robustjax.fast_conv`'s convolution backward, a rolled loop runs as fast as an
        unrolled one on XLA's CPU and compiles in a fraction of the time (benchmarks/README.md).
    """

    traceable = ("eps", "step_size")

    eps: float | jax.Array = 8 / 255
    norm: str = "linf"
    steps: int = 10
    step_size: float | jax.Array | None = None
    random_start: bool = True
    early_stop: bool = True
    l1_sparsity: float = 0.05
    eot_samples: int = 1
    unroll: int | bool | None = False

    def __post_init__(self):
        self.check_fields()

    @property
    def alpha(self) -> float | jax.Array:
        return 2.5 * self.eps / self.steps if self.step_size is None else self.step_size

    def initial_carry(self, x):
        return ()

    def update(self, x, step, x_adv, grad, carry):
        l1_k = threat.l1_count(self.l1_sparsity, x) if self.norm == "l1" else None
        return threat.ascent_step(x, x_adv, grad, self.alpha, self.eps, self.norm, l1_k), carry
