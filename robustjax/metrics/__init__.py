"""Robustness metrics: pure functions on arrays, with streaming accumulators.

Grouped as the papers group them: ``coverage`` and ``imperceptibility`` (data),
``behaviour`` and ``structure`` (model) from the comprehensive evaluation framework;
``robustart`` and ``calibration`` from RobustART; ``corruption`` (CE, mCE) from ImageNet-C;
``shift`` (logits masked to a class subset) for ImageNet-A, -R and -O.
Every accumulator follows one protocol (:class:`Accumulator`, in ``accumulator``) and
``compute()`` returns ``{metric name: value}``; :data:`DIRECTIONS` says for every such name
whether a higher or a lower value means a more robust model.
"""

from robustjax.metrics import (
    accumulator,
    behaviour,
    calibration,
    corruption,
    coverage,
    imperceptibility,
    proxies,
    robustart,
    shift,
    structure,
)
from robustjax.metrics.accumulator import Accumulator
from robustjax.metrics.corruption import (
    ALEXNET_CLEAN_ERROR,
    ALEXNET_IMAGENET_C_ERRORS,
    corruption_error,
    mean_corruption_error,
    relative_corruption_error,
)

DIRECTIONS: dict[str, str] = {
    # behaviour (for CAV, CRR, CSR, CCV, COS: a better defence)
    "accuracy": "higher",
    "asr": "lower",
    "acac": "lower",
    "actc": "higher",
    "nte": "lower",
    "transform_survival": "lower",
    "cav": "higher",
    "crr": "higher",
    "csr": "lower",
    "ccv": "lower",
    "cos": "lower",
    # imperceptibility: a robust model forces larger, more visible perturbations
    "ald_0": "higher",
    "ald_2": "higher",
    "ald_inf": "higher",
    "ass": "lower",
    "psd": "higher",
    # coverage: a more thorough adversarial test set
    "kmnc": "higher",
    "nbc": "higher",
    "snac": "higher",
    "tknc": "higher",
    "tknp": "higher",
    # structure (a capped image never reached the boundary within max_steps)
    "ebd": "higher",
    "ebd2": "higher",
    "capped_fraction": "higher",
    "eni": "lower",
    "neuron_sensitivity": "lower",
    "neuron_uncertainty": "lower",
    # RobustART
    "clean_accuracy": "higher",
    "adversarial_robustness": "higher",
    "worst_case_adversarial_robustness": "higher",
    "mean_flip_rate": "lower",
    "mean_top5_distance": "lower",
    # calibration and OOD detection
    "rms_calibration_error": "lower",
    "expected_calibration_error": "lower",
    "aurra": "higher",
    "auroc": "higher",
    "aupr": "higher",
    "fpr_at_tpr": "lower",
    # corruption (the mean over corruptions: mCE, relative mCE)
    "corruption_error": "lower",
    "relative_corruption_error": "lower",
}
"""Which value of each metric (every key a ``compute()`` returns, and the one-shot
summaries mFR, mT5D, CE) means a more robust model: ``"higher"`` or ``"lower"``."""

__all__ = [
    "ALEXNET_CLEAN_ERROR",
    "ALEXNET_IMAGENET_C_ERRORS",
    "Accumulator",
    "DIRECTIONS",
    "accumulator",
    "behaviour",
    "calibration",
    "corruption",
    "corruption_error",
    "coverage",
    "imperceptibility",
    "mean_corruption_error",
    "proxies",
    "relative_corruption_error",
    "robustart",
    "shift",
    "structure",
]
