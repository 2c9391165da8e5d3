"""RobustART's adversarial robustness and perturbation-stability summaries (Tang et al.,
"RobustART: Benchmarking Robustness on Architecture Design and Training Techniques",
arXiv 2109.05211; code DIG-Beihang/RobustART, ``metrics/AR_evaluator.py`` and
``WCAR_evaluator.py``).

- AR = |{x : f(x) = y and f(x_adv) = y}| / |{x : f(x) = y}|: accuracy under attack among the
  clean-correct samples (not plain robust accuracy; RobustART prints it in percent, here it is
  a fraction);
- WCAR: the same with f(x_adv_a) = y required for every attack a of a list (worst case per
  sample);
- mFR and mT5D (Hendrycks & Dietterich, ICLR 2019): the mean over ImageNet-P perturbations p
  of FR_p = FP_p / FP_p^baseline and of T5D_p / T5D_p^baseline, the baseline being AlexNet.
  Without a baseline they are plain means, which is what RobustART's code computes. FP_p and
  T5D_p per perturbation come from :mod:`robustjax.noise.flip`.

AlexNet's ImageNet-P flip probabilities and top-5 distances are not bundled: the benchmark's
authors distribute them only in a spreadsheet linked from hendrycks/robustness issue #49, not
in code (ImageNet-P/test.py evaluates a model, AlexNet included, without stored constants).
Pass them as ``baseline`` once measured, e.g. with the zoo's AlexNet on ImageNet-P.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from robustjax.checks import check_examples_seen, check_flags, check_positive_int, concrete_values
from robustjax.metrics.accumulator import batch_count, check_mergeable


def _check_correctness(clean_correct, adversarial_correct) -> None:
    check_flags(clean_correct, "clean_correct")
    if clean_correct.ndim != 1:
        raise ValueError(f"clean_correct must have shape (B,), got {tuple(clean_correct.shape)}")
    check_flags(adversarial_correct, "adversarial_correct")
    if adversarial_correct.ndim not in (1, 2) or adversarial_correct.shape[-1] != clean_correct.shape[0]:
        raise ValueError(
            f"adversarial_correct must have shape (B,) or (attacks, B) with B = {clean_correct.shape[0]}, "
            f"got {tuple(adversarial_correct.shape)}"
        )


def _check_some_clean_correct(clean_count) -> None:
    values = concrete_values(clean_count)
    if values is not None and not (values > 0).all():
        raise ValueError("no sample is classified correctly without attack: AR is undefined (0 / 0)")


def _by_attack(adversarial_correct: jax.Array) -> jax.Array:
    """Correctness under attack as (attacks, B)."""
    return adversarial_correct.reshape(-1, adversarial_correct.shape[-1]).astype(bool)


@jax.jit
def _counts(clean_correct, adversarial_correct):
    """Clean-correct count, per-attack robust count, worst-case robust count."""
    clean = clean_correct.astype(bool)
    robust = clean & _by_attack(adversarial_correct)
    return jnp.sum(clean, dtype=jnp.int32), jnp.sum(robust, axis=1, dtype=jnp.int32), jnp.sum(
        jnp.all(robust, axis=0), dtype=jnp.int32
    )


def adversarial_robustness(
    clean_correct: Bool[ArrayLike, " b"] | Int[ArrayLike, " b"],
    adversarial_correct: Bool[ArrayLike, "*attacks b"] | Int[ArrayLike, "*attacks b"],
) -> Float[Array, "*attacks"]:
    """AR: among samples correct without attack, the fraction still correct under attack.

    ``adversarial_correct`` may hold several attacks (attacks, B); AR is then per attack.
    Raises when no sample is clean-correct (AR undefined; NaN when traced).
    """
    _check_correctness(clean_correct, adversarial_correct)
    clean, robust, _ = _counts(clean_correct, adversarial_correct)
    _check_some_clean_correct(clean)
    return (robust / clean).reshape(adversarial_correct.shape[:-1])


def worst_case_adversarial_robustness(
    clean_correct: Bool[ArrayLike, " b"] | Int[ArrayLike, " b"],
    adversarial_correct: Bool[ArrayLike, "attacks b"] | Int[ArrayLike, "attacks b"],
) -> Float[Array, ""]:
    """WCAR: among clean-correct samples, the fraction correct under every attack of the list."""
    _check_correctness(clean_correct, adversarial_correct)
    clean, _, worst = _counts(clean_correct, adversarial_correct)
    _check_some_clean_correct(clean)
    return worst / clean


@struct.dataclass
class AdversarialRobustnessStats:
    """Streaming clean accuracy, AR per attack and WCAR: integer counts that add up across
    batches (``merge``) and devices (``psum`` of the leaves). ``robust_correct`` and
    ``worst_case_correct`` count the samples correct both clean and under attack (each
    attack; every attack), ``count`` all samples."""

    count: Int[Array, "..."]
    clean_correct: Int[Array, "..."]
    robust_correct: Int[Array, "..."]  # (attacks,)
    worst_case_correct: Int[Array, "..."]

    @classmethod
    def empty(cls, num_attacks: int = 1) -> AdversarialRobustnessStats:
        check_positive_int(num_attacks, "num_attacks")
        zero = jnp.zeros((), jnp.int32)
        return cls(zero, zero, jnp.zeros((num_attacks,), jnp.int32), zero)

    def update(
        self,
        clean_correct: Bool[ArrayLike, " b"] | Int[ArrayLike, " b"],
        adversarial_correct: Bool[ArrayLike, "*attacks b"] | Int[ArrayLike, "*attacks b"],
    ) -> AdversarialRobustnessStats:
        """Adds a batch; ``adversarial_correct`` is (B,) for one attack or (attacks, B)."""
        _check_correctness(clean_correct, adversarial_correct)
        attacks = int(np.prod(adversarial_correct.shape[:-1]))
        if attacks != self.robust_correct.shape[0]:
            raise ValueError(f"expected {self.robust_correct.shape[0]} attack(s), got {attacks}")
        clean, robust, worst = _counts(clean_correct, adversarial_correct)
        return self.replace(count=self.count + batch_count(clean_correct), clean_correct=self.clean_correct + clean,
                            robust_correct=self.robust_correct + robust, worst_case_correct=self.worst_case_correct + worst)

    def merge(self, other: AdversarialRobustnessStats) -> AdversarialRobustnessStats:
        check_mergeable(self, other)
        return jax.tree.map(jnp.add, self, other)

    def compute(self) -> dict[str, jax.Array]:
        """``{"clean_accuracy", "adversarial_robustness" (per attack), "worst_case_adversarial_robustness"}``."""
        check_examples_seen(self.count, "AdversarialRobustnessStats")
        _check_some_clean_correct(self.clean_correct)
        return {
            "clean_accuracy": self.clean_correct / self.count,
            "adversarial_robustness": self.robust_correct / self.clean_correct,
            "worst_case_adversarial_robustness": self.worst_case_correct / self.clean_correct,
        }


def normalized_mean(values: Float[ArrayLike, " p"], baseline: Float[ArrayLike, " p"] | None = None) -> Float[Array, ""]:
    """``mean_p values[p] / baseline[p]``, or ``mean_p values[p]`` without a baseline."""
    values = jnp.asarray(values, jnp.float32)
    return jnp.mean(values if baseline is None else values / jnp.asarray(baseline, jnp.float32))


def _summary(per_perturbation: Mapping[str, ArrayLike], baseline: Mapping[str, float] | None, what: str):
    if not isinstance(per_perturbation, Mapping) or not per_perturbation:
        raise ValueError(f"{what} must be a non-empty mapping perturbation name -> value, got {per_perturbation!r}")
    names = sorted(per_perturbation)
    values = jnp.stack([jnp.asarray(per_perturbation[n], jnp.float32).reshape(()) for n in names])
    concrete = concrete_values(values)
    if concrete is not None and not (np.isfinite(concrete).all() and (concrete >= 0).all()):
        raise ValueError(f"{what} must be finite and >= 0, got {dict(zip(names, concrete.tolist()))}")
    if baseline is None:
        return normalized_mean(values)
    if missing := [n for n in names if n not in baseline]:
        raise ValueError(f"baseline has no value for {missing}; it covers {sorted(baseline)}")
    reference = np.asarray([baseline[n] for n in names], np.float64)
    if not (np.isfinite(reference).all() and (reference > 0).all()):
        raise ValueError(f"baseline values must be finite and > 0, got {dict(zip(names, reference.tolist()))}")
    return normalized_mean(values, reference)


def mean_flip_rate(
    flip_probabilities: Mapping[str, ArrayLike], baseline: Mapping[str, float] | None = None
) -> Float[Array, ""]:
    """mFR: the mean over perturbations of ``FP_p / baseline[p]`` (AlexNet's FP in the paper),
    or of ``FP_p`` when ``baseline`` is None (RobustART's code). Lower is more stable."""
    return _summary(flip_probabilities, baseline, "flip_probabilities")


def mean_top5_distance(
    top5_distances: Mapping[str, ArrayLike], baseline: Mapping[str, float] | None = None
) -> Float[Array, ""]:
    """mT5D: the mean over perturbations of ``T5D_p / baseline[p]``, or of ``T5D_p`` without a
    baseline. Lower is more stable."""
    return _summary(top5_distances, baseline, "top5_distances")
