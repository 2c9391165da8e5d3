"""Momentum Iterative FGSM (Dong et al., "Boosting Adversarial Attacks with Momentum",
CVPR 2018).

``g_{t+1} = decay * g_t + grad_t / ||grad_t||_1`` and ``x_{t+1} = Proj(x_t + alpha *
dir(g_{t+1}))``, with ``dir`` the steepest-ascent direction of the norm (see ``threat.ascent_step``).
Dividing by the L1 norm instead of torchattacks' mean absolute value changes every g_t by
the same factor, so the steps are identical.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from robustjax.attacks import threat
from robustjax.attacks.base import register_attack
from robustjax.attacks.loop import GradientAscent
from robustjax.checks import check_nonnegative_float

_TINY = 1e-12


@register_attack("mifgsm")
@dataclasses.dataclass(frozen=True)
class MIFGSM(GradientAscent):
    """MI-FGSM in the linf, l2 or l1 ball of radius ``eps``.

    Attributes:
      eps, norm, steps: the threat ball and the number of steps.
      step_size: step length; ``None`` means ``eps / steps`` (the paper's choice).
      decay: momentum factor mu (1.0 in the paper).
      random_start, early_stop, l1_sparsity, eot_samples, unroll: as in
        :class:`robustjax.attacks.PGD`.
    """

    traceable = ("eps", "step_size")

    eps: float | jax.Array = 8 / 255
    norm: str = "linf"
    steps: int = 10
    step_size: float | jax.Array | None = None
    decay: float = 1.0
    random_start: bool = False
    early_stop: bool = True
    l1_sparsity: float = 0.05
    eot_samples: int = 1
    unroll: int | bool | None = False

    def __post_init__(self):
        self.check_fields()
        check_nonnegative_float(self.decay, "decay")

    @property
    def alpha(self) -> float | jax.Array:
        return self.eps / self.steps if self.step_size is None else self.step_size

    def initial_carry(self, x):
        return jnp.zeros_like(x)

    def update(self, x, step, x_adv, grad, momentum):
        l1 = jnp.sum(jnp.abs(grad), axis=tuple(range(1, grad.ndim)), keepdims=True)
        momentum = self.decay * momentum + grad / (l1 + _TINY)
        return threat.ascent_step(
            x, x_adv, momentum, self.alpha, self.eps, self.norm,
            threat.l1_count(self.l1_sparsity, x) if self.norm == "l1" else None), momentum
