"""DeepFool (Moosavi-Dezfooli, Fawzi & Frossard, "DeepFool: a simple and accurate method to
fool deep neural networks", CVPR 2016).

At each step the classifier is linearised around the current iterate ``x_i``: for every
candidate class ``k`` let ``f_k = z_k - z_y`` and ``w_k = grad_x f_k``. The closest
linearised boundary is ``l = argmin_k |f_k| / ||w_k||_q`` (``q`` the dual norm: 2 for l2,
1 for linf), reached by

    l2:   r_i = |f_l| / ||w_l||_2^2 * w_l,        linf: r_i = |f_l| / ||w_l||_1 * sign(w_l).

``x_i + r_i - x`` is the current estimate of the total perturbation to the boundary, and
the paper's final overshoot applies to it: ``x_{i+1} = clip(x + (1 + overshoot) *
(x_i + r_i - x), 0, 1)``; with ``overshoot=0`` this is the paper's ``x_{i+1} = x_i + r_i``.
An example freezes at its first misclassified iterate, which is returned. DeepFool is
untargeted and unbounded.

The authors' code, Foolbox and torchattacks instead evaluate ``x + (1 + overshoot) *
sum_i r_i``, which overshoots only each new step ``r_i``: on a curved boundary the iterates
then converge onto it from the clean side (torchattacks leaves 25 of the first 64 digits
test images within 1e-4 of the boundary, unfooled, after 50 steps).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.attacks.loop import resolve_unroll
from robustjax.checks import check_choice, check_nonnegative_float, check_positive_int, check_unroll
from robustjax.losses import margin
from robustjax.sharding import varying_like

NORMS = ("l2", "linf")
_TINY = 1e-12


def other_classes(y: Int[Array, " b"], num_classes: int) -> Int[Array, "b m"]:
    """All classes but ``y``, (B, num_classes - 1)."""
    return (y[:, None] + 1 + jnp.arange(num_classes - 1)) % num_classes


def top_other_classes(
    logits: Float[Array, "b k"], y: Int[Array, " b"], num_candidates: int,
) -> Int[Array, "b m"]:
    """The ``num_candidates - 1`` classes besides ``y`` with the highest ``logits``: with
    ``y`` predicted, the top ``num_candidates`` classes but ``y``."""
    others = jnp.where(jnp.arange(logits.shape[-1]) == y[:, None], -jnp.inf, logits)
    return jax.lax.top_k(others, min(num_candidates, logits.shape[-1]) - 1)[1]


def linearised_step(
    gaps: Float[Array, "b m"], jacobian: Float[Array, "b m ..."], norm: str,
) -> Float[Array, "b ..."]:
    """DeepFool's step to the closest linearised boundary, per example.

    Args:
      gaps: ``f_k = z_k - z_y`` for the candidates, (B, m).
      jacobian: their gradients ``w_k``, (B, m, H, W, C).
    """
    rows = jacobian.reshape(jacobian.shape[:2] + (-1,))
    dual = jnp.abs(rows).sum(-1) if norm == "linf" else jnp.sqrt(jnp.square(rows).sum(-1))
    closest = jnp.argmin(jnp.abs(gaps) / (dual + _TINY), axis=1)

    def pick(a):
        return jnp.take_along_axis(a, closest.reshape((-1,) + (1,) * (a.ndim - 1)), axis=1)[:, 0]

    gap, w, size = jnp.abs(pick(gaps)), pick(jacobian), pick(dual)
    scale = (gap / (size + _TINY)).reshape((-1,) + (1,) * (w.ndim - 1))
    if norm == "linf":
        return scale * jnp.sign(w)
    return scale * w / (size.reshape(scale.shape) + _TINY)


@register_attack("deepfool")
@dataclasses.dataclass(frozen=True)
class DeepFool(Attack):
    """Untargeted DeepFool in the l2 or linf geometry.

    Attributes:
      norm: ``"l2"`` or ``"linf"``.
      steps: maximum number of linearisation steps.
      overshoot: the estimated perturbation to the boundary is scaled by ``1 + overshoot``.
      num_candidates: classes considered, the true one included: ``None`` for all, else
        the top ``num_candidates`` by the clean logits (as in the authors' code and
        Foolbox), which costs one more query.
      unroll: ``lax.fori_loop`` unrolling (``True``, ``False`` or a factor; ``None``:
        per backend, as in PGD). Rolled by default: behind the ``lax.cond`` that skips a
        step once the whole batch is done, unrolling measured no faster on XLA's CPU
        backend (digits CNN, batch 64) and compiles 2-3x slower.
    """

    norm: str = "l2"
    steps: int = 50
    overshoot: float = 0.02
    num_candidates: int | None = None
    unroll: int | bool | None = False

    supports_targeted = False

    def __post_init__(self):
        check_choice(self.norm, NORMS, "norm")
        check_positive_int(self.steps, "steps")
        check_nonnegative_float(self.overshoot, "overshoot")
        k = self.num_candidates
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
            raise ValueError(f"num_candidates must be None or an integer >= 2, got {k!r}")
        check_unroll(self.unroll)

    def run(self, classifier, x, y, key, target) -> AttackResult:
        del key, target  # deterministic, untargeted
        batch = x.shape[0]
        per_image = (-1,) + (1,) * (x.ndim - 1)
        if self.num_candidates is None:
            candidates = other_classes(y, classifier.num_classes)
            queries = jnp.zeros(batch, jnp.int32)
        else:
            candidates = top_other_classes(classifier(x), y, self.num_candidates)
            queries = jnp.ones(batch, jnp.int32)  # the clean forward pass that ranks classes

        def gaps(images):
            logits = classifier(images)
            true = jnp.take_along_axis(logits, y[:, None], axis=1)
            gap = jnp.take_along_axis(logits, candidates, axis=1) - true
            return gap.sum(0), (gap, logits)

        def step(_, state):
            x_adv, done, queries = state
            jacobian, (gap, logits) = jax.jacrev(gaps, has_aux=True)(x_adv)
            queries = queries + (~done).astype(jnp.int32)
            done = done | (margin(logits, y) < 0)
            boundary = x_adv + linearised_step(gap, jnp.moveaxis(jacobian, 0, 1), self.norm)
            moved = jnp.clip(x + (1 + self.overshoot) * (boundary - x), 0.0, 1.0)
            return jnp.where(done.reshape(per_image), x_adv, moved), done, queries

        def step_unless_all_done(i, state):
            return jax.lax.cond(state[1].all(), lambda s: s, lambda s: step(i, s), state)

        init = (x, jnp.zeros(batch, bool), queries)
        x_adv, _, queries = jax.lax.fori_loop(
            0, self.steps, step_unless_all_done, varying_like(init, x), unroll=resolve_unroll(self.unroll))
        return finalize(classifier, x_adv, y, None, queries)
