"""AutoAttack (Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble
of diverse parameter-free attacks", ICML 2020): a fixed ensemble run in order, each attack
on the examples that are still robust, keeping each example's first adversarial point.

Versions, with the settings of the authors' ``autoattack.py``:

- ``standard``: APGD-CE (100 steps), APGD-T (targeted DLR, the 9 highest-scoring wrong
  classes, 100 steps each), FAB-T (9 targets), Square (5,000 queries); for L1: APGD-CE and
  APGD-T.
- ``plus``: APGD-CE and APGD-DLR with 5 restarts each, FAB (untargeted, 5 restarts),
  Square (5,000 queries), APGD-T and FAB-T.

- ``rand``, for randomized defences (:meth:`~robustjax.Classifier.randomized`): APGD-CE
  and APGD-DLR, one restart each, every gradient averaged over 20 noise draws
  (``eot_samples``, the authors' ``eot_iter``; Expectation over Transformation).

Every call runs the original's checks on the model (``checks="warn"``, the default, warns
with :class:`~robustjax.attacks.flags.ModelCheckWarning`; ``"raise"`` raises
:class:`~robustjax.attacks.flags.ModelCheckError`; ``"off"``): outputs that are
probabilities, zero or vanishing input gradients and a random or batch-dependent forward
pass before the attack (``rand``, made for random models, warns on a deterministic one
instead), the class count (components left out, fewer target classes) and
Square fooling examples the white-box components left robust after it. Inside a trace the
checks on values cannot run: only the class count is checked there.

Called on concrete arrays, the ensemble runs as the original does: each component (and
each target class of the targeted ones) only on the examples still robust, gathered into
a batch of the next size of a fine ladder (multiples of a sixteenth of the batch, then
halving down to 1): the padding stays within a sixteenth of the batch above that, and a
component compiles once per size it meets (a few, as the robust examples thin out). Inside a trace (``jax.jit`` of user
code) :meth:`AutoAttack.run` runs instead: one compiled program with static shapes, every
component on the whole batch, an example's result from the first component that fooled
it, so compute goes to examples already broken. Either way ``queries`` charges each example
only for the components that ran while it was still robust, and each component draws its
randomness from the same key (a different batch composition gives different draws).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from robustjax.attacks import flags
from robustjax.attacks.apgd import APGD
from robustjax.attacks.base import (
    Attack,
    AttackResult,
    finalize,
    register_attack,
    split_traceable,
    with_traced_fields,
)
from robustjax.attacks.compaction import bucket, traced
from robustjax.attacks.fab import FAB
from robustjax.attacks.square import Square
from robustjax.checks import check_choice, check_nonnegative_float, check_positive_int
from robustjax.distributed import to_host
from robustjax.fast_conv import with_fast_convolutions
from robustjax.losses import attack_margin

VERSIONS = ("standard", "plus", "rand")
NORMS = ("linf", "l2", "l1")


@register_attack("autoattack")
@dataclasses.dataclass(frozen=True)
class AutoAttack(Attack):
    """AutoAttack's ``standard``, ``plus`` or ``rand`` ensemble in the ``norm`` ball of
    radius ``eps``.

    ``steps``, ``target_classes``, ``square_queries`` and ``eot_samples`` are the published
    budgets (100 iterations of APGD and FAB, 9 target classes, 5,000 Square queries, 20
    noise draws per gradient in ``rand``); smaller ones give a cheaper, weaker evaluation. ``checks`` (``"warn"``, ``"raise"`` or ``"off"``) says what
    a raised check on the model does; it never changes the result.
    """

    traceable = ("eps",)

    eps: float | jax.Array = 8 / 255
    norm: str = "linf"
    version: str = "standard"
    steps: int = 100
    target_classes: int = 9
    square_queries: int = 5000
    eot_samples: int = 20
    checks: str = dataclasses.field(default="warn", compare=False)

    supports_targeted = False

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)
        check_choice(self.norm, NORMS, "norm")
        check_choice(self.version, VERSIONS, "version")
        check_positive_int(self.steps, "steps")
        check_positive_int(self.target_classes, "target_classes")
        check_positive_int(self.square_queries, "square_queries")
        check_positive_int(self.eot_samples, "eot_samples")
        check_choice(self.checks, flags.MODES, "checks")

    def components(self, num_classes: int) -> tuple[tuple[Attack, int, int], ...]:
        """``(attack, restarts, targets)`` in order; ``targets`` > 0 runs the attack against
        each of that many highest-scoring wrong classes."""
        targets = min(self.target_classes, num_classes - 1)
        common = dict(eps=self.eps, norm=self.norm, steps=self.steps)
        apgd = APGD(**common)
        apgd_t = APGD(**common, loss="dlr") if num_classes >= 4 else None  # targeted DLR needs 4 classes
        fab_t = FAB(**common, num_target_classes=targets)
        square = Square(eps=self.eps, norm=self.norm, max_queries=self.square_queries) if self.norm != "l1" else None
        if self.version == "rand":
            draws = dict(common, eot_samples=self.eot_samples)
            parts = [(APGD(**draws), 1, 0), (APGD(**draws, loss="dlr") if num_classes >= 3 else None, 1, 0)]
        elif self.version == "standard":
            parts = [(apgd, 1, 0), (apgd_t, 1, targets)]
            if self.norm != "l1":
                parts += [(fab_t, 1, 0), (square, 1, 0)]
        else:
            apgd_dlr = APGD(**common, loss="dlr") if num_classes >= 3 else None
            fab = FAB(**common, num_target_classes=None, random_start=True)
            parts = [(apgd, 5, 0), (apgd_dlr, 5, 0), (fab, 5, 0), (square, 1, 0), (apgd_t, 1, targets), (fab_t, 1, 0)]
        return tuple(part for part in parts if part[0] is not None)

    def __call__(self, classifier, x, y, *, key: jax.Array | None = None, target=None) -> AttackResult:
        flags.report(flags.class_count(classifier.num_classes, self.target_classes, self.version), self.checks)
        if traced(classifier, x, y, key, self.eps):
            return super().__call__(classifier, x, y, key=key, target=target)
        self.validate(classifier, x, y, key, target)
        if self.checks != "off":
            flags.report(flags.randomness_matches(classifier, self.version)
                         + flags.model_flags(classifier, x, y, expect_randomness=self.version == "rand"), self.checks)
        return self._run_on_robust(classifier, x, y, key)

    def _run_on_robust(self, classifier, x, y, key) -> AttackResult:
        """The sequential ensemble on concrete arrays, each stage on the still-robust examples."""
        images, labels = to_host(x), to_host(y).astype(np.int32)
        robust, ranked = map(np.array, _clean_check(classifier, images, labels))  # writable copies
        x_adv, queries = images.copy(), np.ones(len(labels), np.int32)  # the clean check
        for index, (attack, restarts, targets) in enumerate(self.components(classifier.num_classes)):
            part_key, robust_before = jax.random.fold_in(key, index), robust.sum()
            stage_keys = jax.random.split(part_key, targets) if targets else part_key[None]
            for k, stage_key in enumerate(stage_keys):
                chosen = np.flatnonzero(robust)
                if not chosen.size:
                    break
                rows = np.resize(chosen, bucket(chosen.size, len(labels), parts=16))  # repeats fill the bucket
                goal = None if not targets else ranked[rows, ranked.shape[-1] - 1 - k]
                result = _stage(*split_traceable(attack), restarts, classifier, images[rows], labels[rows], goal,
                                stage_key)
                success = np.asarray(result.success)[:chosen.size]
                x_adv[chosen[success]] = np.asarray(result.x_adv)[:chosen.size][success]
                queries[chosen] += np.asarray(result.queries)[:chosen.size]
                robust[chosen[success]] = False
            if isinstance(attack, Square):
                flags.report([flags.square_beats_white_box(robust_before - robust.sum(), len(labels))], self.checks)
        result = _finish(classifier, x_adv, labels, queries)
        return AttackResult(x_adv=_placed_like(result.x_adv, x), success=_placed_like(result.success, y),
                            queries=_placed_like(result.queries, y), margin=_placed_like(result.margin, y))

    def run(self, classifier, x, y, key, target) -> AttackResult:
        robust, ranked = _clean_check(classifier, x, y)
        x_adv, queries = x, jnp.ones_like(y)  # the clean check
        for index, (attack, restarts, targets) in enumerate(self.components(classifier.num_classes)):
            part_key = jax.random.fold_in(key, index)
            if targets:
                result = _over_targets(attack, restarts, targets, classifier, x, y, ranked, part_key)
            else:
                result = _with_restarts(attack, restarts, classifier, x, y, None, part_key)
            newly = robust & result.success
            x_adv = jnp.where(newly.reshape(-1, 1, 1, 1), result.x_adv, x_adv)
            queries = queries + jnp.where(robust, result.queries, 0)
            robust = robust & ~result.success
        return finalize(classifier, x_adv, y, None, queries)


def _placed_like(value: jax.Array, reference) -> jax.Array:
    """``value`` with the sharding of ``reference`` (a batch sharded over devices stays so)."""
    return jax.device_put(value, reference.sharding) if isinstance(reference, jax.Array) else value


@jax.jit
def _clean_check(classifier, x, y):
    """Which examples are classified correctly, and the wrong classes by increasing logit
    (the last ones are APGD-T's and FAB-T's targets)."""
    logits = classifier(x)
    ranked = jnp.argsort(jnp.where(jax.nn.one_hot(y, logits.shape[-1], dtype=bool), -jnp.inf, logits), axis=-1)
    return attack_margin(logits, y, None) >= 0, ranked


def _against(attack: Attack, restarts: int, classifier, x, y, target, key) -> AttackResult:
    """One component (against one target class when ``target`` is given) with its restarts;
    success means fooled, whatever the class."""
    result = _with_restarts(attack, restarts, classifier, x, y, target, key)
    if target is None:
        return result
    return result._replace(success=attack_margin(classifier(result.x_adv), y, None) < 0)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _stage(attack: Attack, fields, restarts: int, classifier, x, y, target, key) -> AttackResult:
    """:func:`_against` compiled for the static half of a split component (see
    :func:`~robustjax.attacks.base.split_traceable`), its epsilon an argument."""
    return _against(with_traced_fields(attack, **fields), restarts, classifier, x, y, target, key)


@jax.jit
def _finish(classifier, x_adv, y, queries) -> AttackResult:
    return finalize(classifier, x_adv, y, None, queries)


def _with_restarts(attack: Attack, restarts: int, classifier, x, y, target, key) -> AttackResult:
    """Restarts run in order (vmapped); an example keeps its first successful restart and is
    charged for the restarts up to it."""
    keys = key[None] if restarts == 1 else jax.random.split(key, restarts)  # one run: the attack's own key
    classifier = with_fast_convolutions(classifier)  # the components' run, not their __call__, is called
    runs = jax.vmap(lambda k: attack.run(classifier, x, y, k, target))(keys)
    return _first_success(runs)


def _over_targets(attack: Attack, restarts: int, targets: int, classifier, x, y, ranked, key) -> AttackResult:
    """The attack against the k-th highest-scoring wrong class, k = 1..targets, in order."""
    def one(k, k_key):
        return _against(attack, restarts, classifier, x, y, jnp.take(ranked, ranked.shape[-1] - 1 - k, axis=-1), k_key)

    return _first_success(jax.vmap(one)(jnp.arange(targets), jax.random.split(key, targets)))


def _first_success(runs: AttackResult) -> AttackResult:
    """Collapses a leading axis of runs done in order: the first successful run's point (the
    last run's when none succeeded), and the queries of the runs up to it."""
    n = runs.success.shape[0]
    first = jnp.where(jnp.any(runs.success, axis=0), jnp.argmax(runs.success, axis=0), n - 1)
    pick = lambda values: jnp.take_along_axis(  # noqa: E731
        values, first.reshape((1, -1) + (1,) * (values.ndim - 2)), axis=0)[0]
    spent = jnp.sum(jnp.where(jnp.arange(n)[:, None] <= first[None], runs.queries, 0), axis=0)
    return AttackResult(x_adv=pick(runs.x_adv), success=pick(runs.success), queries=spent, margin=pick(runs.margin))
