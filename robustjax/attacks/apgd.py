"""Auto-PGD (Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of
diverse parameter-free attacks", ICML 2020) and l1-APGD (Croce & Hein, "Mind the box: l1-APGD
for sparse adversarial attacks on image classifiers", ICML 2021).

APGD is PGD with momentum, ``x_{k+1} = P(x_k + alpha (z_{k+1} - x_k) + (1 - alpha)(x_k - x_{k-1}))``
with ``z_{k+1} = P(x_k + eta_k * ascent(grad))``, and a per-example step size ``eta`` that
starts at ``2 eps`` and is halved at the checkpoints ``w_j = p_j * steps``
(``p_0 = 0``, ``p_1 = 0.22``, ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``) when

1. the loss increased in at most ``rho * (w_j - w_{j-1})`` of the steps since the last
   checkpoint, or
2. the step size was not halved at the last checkpoint and the best loss has not
   improved since then;

an example whose step size is halved restarts from its highest-loss point. For l1 the step
is the sparse ascent direction of :mod:`robustjax.attacks.l1` (no momentum, as in the
authors' code), the projection is onto the l1 ball intersected with the box, and every
``0.04 * steps`` iterations the sparsity ``k`` becomes the sparsity of the best point / 1.5,
while the step size resets to ``eps`` (with a restart from the best point) when that
sparsity fell by more than 5%, and is divided by 1.5 (down to ``eps / 10``) otherwise.

Each example stops at its first successful iterate, which is returned (the per-example
worst case); an example that never succeeds returns its highest-loss point. On a randomized
classifier a draw that misclassifies an iterate does not settle it: as in the authors' code,
every example runs every step and returns the last iterate a draw misclassified.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from robustjax.attacks import eot, threat
from robustjax.attacks.base import Attack, AttackResult, finalize, register_attack
from robustjax.attacks.l1 import l1_random_start
from robustjax.attacks.loop import resolve_unroll
from robustjax.checks import (
    check_choice,
    check_in_interval,
    check_nonnegative_float,
    check_positive_int,
    check_unroll,
)
from robustjax.losses import attack_margin, cross_entropy, dlr, targeted_dlr
from robustjax.sharding import varying_like

LOSSES = ("ce", "dlr")


def checkpoint_schedule(steps: int, norm: str = "linf") -> np.ndarray:
    """Length of the interval ending at each iteration that is a checkpoint, 0 elsewhere.

    linf/l2: intervals ``max(int(0.22 N), 1)``, then each ``max(int(0.03 N), 1)`` shorter,
    down to ``max(int(0.06 N), 1)`` (the paper's ``p_j`` rounded as in AutoAttack's code).
    l1: every ``max(int(0.04 N), 1)`` iterations.
    """
    if norm == "l1":
        first = minimum = max(int(0.04 * steps), 1)
        decrease = 0
    else:
        first, minimum, decrease = (max(int(f * steps), 1) for f in (0.22, 0.06, 0.03))
    lengths = np.zeros(steps, np.int32)
    length, end = first, first
    while end <= steps:
        lengths[end - 1] = length
        length = max(length - decrease, minimum)
        end += length
    return lengths


class _State(NamedTuple):
    x_adv: jax.Array
    x_prev: jax.Array
    grad: jax.Array
    loss: jax.Array
    step_size: jax.Array
    x_best: jax.Array
    grad_best: jax.Array
    loss_best: jax.Array
    x_found: jax.Array
    done: jax.Array
    queries: jax.Array
    increases: jax.Array  # loss increases since the last checkpoint
    loss_best_last: jax.Array  # best loss at the last checkpoint
    halved_last: jax.Array  # step size halved at the last checkpoint
    sparsity: jax.Array  # l1: fraction of coordinates in the sparse step
    sparsity_last: jax.Array  # l1: nonzero coordinates of the best point at the last checkpoint


@register_attack("apgd")
@dataclasses.dataclass(frozen=True)
class APGD(Attack):
    """APGD in the linf, l2 or l1 ball of radius ``eps`` (the l1 ball intersected with [0, 1]).

    Attributes:
      eps: radius of the threat ball.
      norm: ``"linf"``, ``"l2"`` or ``"l1"`` (l1-APGD).
      loss: ``"ce"`` or ``"dlr"``. With a target: ``-CE`` of the target, or the targeted
        DLR loss (APGD-T). DLR needs >= 3 classes, targeted DLR >= 4.
      steps: iterations after the gradient at the start point.
      rho: condition 1 threshold, in (0, 1).
      alpha: momentum weight of the new step, in (0, 1] (1: no momentum). The first
        iteration always uses 1.
      random_start: start on the sphere of radius ``eps`` (linf, l2) or from
        :func:`~robustjax.attacks.l1.l1_random_start` (l1) instead of at ``x``.
      eot_samples: noise draws each gradient averages over, for a randomized classifier
        (AutoAttack's ``eot_iter``; :mod:`robustjax.attacks.eot`); each draw is a query.
      unroll: ``lax.fori_loop`` unrolling (``True``, ``False`` or a factor); ``None``
        chooses per backend as PGD does (full unrolling on CPU). Rolled by default: at
        100 steps on the digits CNN (CPU) full unrolling compiled for ~2 minutes instead
        of ~6 s and ran no faster.
    """

    traceable = ("eps",)

    eps: float | jax.Array = 8 / 255
    norm: str = "linf"
    loss: str = "ce"
    steps: int = 100
    rho: float = 0.75
    alpha: float = 0.75
    random_start: bool = True
    eot_samples: int = 1
    unroll: int | bool | None = False

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)
        check_choice(self.norm, threat.NORMS, "norm")
        check_choice(self.loss, LOSSES, "loss")
        check_positive_int(self.steps, "steps")
        check_in_interval(self.rho, "rho", 0.0, 1.0)
        check_in_interval(self.alpha, "alpha", 0.0, 1.0, closed_high=True)
        check_unroll(self.unroll)
        eot.check_eot_samples(self.eot_samples)

    def validate(self, classifier, x, y, key, target) -> None:
        super().validate(classifier, x, y, key, target)
        eot.warn_if_deterministic(classifier, self.eot_samples, self.name)
        needed = 3 if target is None else 4
        if self.loss == "dlr" and classifier.num_classes < needed:
            kind = "untargeted" if target is None else "targeted"
            raise ValueError(f"{kind} DLR loss needs >= {needed} classes, the classifier has {classifier.num_classes}")

    def objective(self, logits, y, target):
        """Per-example loss that APGD maximises."""
        if target is None:
            return cross_entropy(logits, y) if self.loss == "ce" else dlr(logits, y)
        return -cross_entropy(logits, target) if self.loss == "ce" else targeted_dlr(logits, y, target)

    @property
    def initial_step_size(self) -> float | jax.Array:
        """``2 eps`` (linf, l2) or ``eps`` (l1), as in AutoAttack."""
        return (1.0 if self.norm == "l1" else 2.0) * self.eps

    def start(self, key, x):
        """The first iterate: ``x``, or a random point of the threat set (AutoAttack's choice)."""
        if not self.random_start:
            return x
        if self.norm == "l1":
            return l1_random_start(key, x, self.eps)
        return threat.point_at_distance(key, x, self.eps, self.norm)

    def ascend(self, x, x_adv, x_prev, grad, step_size, sparsity, momentum):
        """One APGD step from ``x_adv``, projected onto the threat set and the box."""
        if self.norm == "l1":
            dim = threat.example_size(x)
            k = dim - jnp.clip(jnp.floor((1.0 - sparsity) * dim), 0, dim - 1).astype(jnp.int32)
            return threat.ascent_step(x, x_adv, grad, step_size, self.eps, "l1", k)
        z = threat.ascent_step(x, x_adv, grad, step_size, self.eps, self.norm, None)
        moved = x_adv + momentum * (z - x_adv) + (1.0 - momentum) * (x_adv - x_prev)
        return threat.into_threat_set(x, moved, self.eps, self.norm)

    def run(self, classifier, x, y, key, target) -> AttackResult:
        batch, shape = x.shape[0], (-1,) + (1,) * (x.ndim - 1)
        intervals = jnp.asarray(checkpoint_schedule(self.steps, self.norm))

        def objective(images, model):
            logits = model(images)
            values = self.objective(logits, y, target)
            return values.sum(), (values, attack_margin(logits, y, target) < 0)

        def evaluate(images, draw):
            grad, (loss, success) = eot.expected_gradient(objective, images, classifier, draw, self.eot_samples)
            return loss, grad, success

        def pick(mask, new, old):
            return jnp.where(mask.reshape(shape) if new.ndim > 1 else mask, new, old)

        def step(i, s: _State) -> _State:
            momentum = jnp.where(i == 0, 1.0, self.alpha)
            x_new = self.ascend(x, s.x_adv, s.x_prev, s.grad, s.step_size, s.sparsity, momentum)
            loss, grad, success = evaluate(x_new, i + 1)
            active = jnp.ones_like(s.done) if classifier.is_randomized else ~s.done
            improved = loss > s.loss_best
            x_best, grad_best = pick(improved, x_new, s.x_best), pick(improved, grad, s.grad_best)
            loss_best = jnp.maximum(loss, s.loss_best)
            increases = s.increases + (loss > s.loss)

            length = intervals[i]
            at_checkpoint = length > 0
            step_size, sparsity, sparsity_last = s.step_size, s.sparsity, s.sparsity_last
            loss_best_last, halved_last = s.loss_best_last, s.halved_last
            if self.norm == "l1":
                nonzero = threat.per_example_norm(x_best - x, "l0")
                sparser = nonzero < 0.95 * s.sparsity_last
                top = self.initial_step_size
                adapted = jnp.clip(jnp.where(sparser, top, s.step_size / 1.5), top / 10.0, top)
                step_size = jnp.where(at_checkpoint, adapted, s.step_size)
                sparsity = jnp.where(at_checkpoint, nonzero / threat.example_size(x) / 1.5, s.sparsity)
                sparsity_last = jnp.where(at_checkpoint, nonzero, s.sparsity_last)
                restart = at_checkpoint & sparser
            else:
                oscillating = increases <= self.rho * length
                stalled = ~s.halved_last & (s.loss_best_last >= loss_best)
                halve = oscillating | stalled
                restart = at_checkpoint & halve
                step_size = jnp.where(restart, s.step_size / 2.0, s.step_size)
                halved_last = jnp.where(at_checkpoint, halve, s.halved_last)
                loss_best_last = jnp.where(at_checkpoint, loss_best, s.loss_best_last)
            return _State(
                x_adv=pick(restart, x_best, x_new),
                x_prev=s.x_adv,
                grad=pick(restart, grad_best, grad),
                loss=loss,
                step_size=step_size,
                x_best=x_best,
                grad_best=grad_best,
                loss_best=loss_best,
                x_found=pick(active & success, x_new, s.x_found),
                done=s.done | success,
                queries=s.queries + active.astype(jnp.int32) * self.eot_samples,
                increases=jnp.where(at_checkpoint, 0, increases),
                loss_best_last=loss_best_last,
                halved_last=halved_last,
                sparsity=sparsity,
                sparsity_last=sparsity_last,
            )

        x_adv = self.start(key, x)
        loss, grad, success = evaluate(x_adv, 0)
        dim = float(threat.example_size(x))
        init = _State(
            x_adv=x_adv,
            x_prev=x_adv,
            grad=grad,
            loss=loss,
            step_size=jnp.full(batch, self.initial_step_size, x.dtype),
            x_best=x_adv,
            grad_best=grad,
            loss_best=loss,
            x_found=x_adv,
            done=success,
            queries=jnp.full(batch, self.eot_samples, jnp.int32),
            increases=jnp.zeros(batch, jnp.int32),
            loss_best_last=loss,
            halved_last=jnp.ones(batch, bool),
            sparsity=jnp.full(batch, 0.2, x.dtype),
            sparsity_last=jnp.full(batch, dim, x.dtype),
        )
        s = jax.lax.fori_loop(0, self.steps, step, varying_like(init, x), unroll=resolve_unroll(self.unroll))
        return finalize(classifier, pick(s.done, s.x_found, s.x_best), y, target, s.queries)
