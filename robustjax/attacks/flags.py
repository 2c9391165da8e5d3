"""AutoAttack's flags on a model (Croce & Hein 2020, fra31/auto-attack ``checks.py`` and
``flags_doc.md``), as pure functions of host arrays, each giving a :class:`Flag`.

Outputs that are probabilities, zero or vanishing input gradients, a forward pass that is
random or depends on the batch, too few classes for the targeted components, and Square
fooling examples the white-box components left robust: each makes an AutoAttack figure
unreliable. :class:`~robustjax.attacks.AutoAttack` raises them on every call
(``checks="warn"``, ``"raise"`` or ``"off"``); ``robustjax evaluate`` reports the same tests
in its sanity section (:mod:`robustjax.evaluation.sanity`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import numpy as np

from robustjax import losses
from robustjax.attacks.score import looks_like_probabilities
from robustjax.classifier import Classifier
from robustjax.distributed import to_host

MODES = ("warn", "raise", "off")
# One 8-bit grey level: the step a gradient must register over (see input_gradients).
GREY_LEVEL = 1 / 255
# AutoAttack's threshold on the L2 distance of unit-normalised logits of repeated calls.
RANDOMNESS_TOLERANCE = 1e-4
# AutoAttack's tolerance for Square beating the white-box attacks (checks.check_square_sr).
BLACK_BOX_TOLERANCE = 0.002


@dataclasses.dataclass(frozen=True)
class Flag:
    """One test's outcome: whether it is ``raised``, what it measured and what it saw."""

    name: str
    raised: bool
    value: Any
    message: str


class ModelCheckWarning(UserWarning):
    """A flag raised by AutoAttack's checks with ``checks="warn"``."""


class ModelCheckError(ValueError):
    """A flag raised by AutoAttack's checks with ``checks="raise"``."""


def report(flags: list[Flag], mode: str) -> None:
    """Warns (``ModelCheckWarning``) or raises (``ModelCheckError``) for each raised flag,
    as ``mode`` (one of ``MODES``) says."""
    for flag in flags:
        if not flag.raised or mode == "off":
            continue
        message = f"AutoAttack check {flag.name}: {flag.message}"
        if mode == "raise":
            raise ModelCheckError(message)
        warnings.warn(message, ModelCheckWarning, stacklevel=3)


@jax.jit
def outputs_and_margin_gradients(classifier: Classifier, x: jax.Array, y: jax.Array):
    """The outputs, the CW margin and its input gradient, per example."""
    def total_margin(images):
        outputs = classifier(images)
        margin = losses.margin(outputs, y)
        return margin.sum(), (outputs, margin)

    gradient, (outputs, margin) = jax.grad(total_margin, has_aux=True)(x)
    return outputs, margin, gradient


@jax.jit
def logits(classifier: Classifier, x: jax.Array) -> jax.Array:
    return classifier(x)


def regrouped(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Another batch of the same size holding the first ``k`` examples of ``x`` at other
    positions (reversed, beside copies of themselves), and ``k``; the logits of its first
    ``k`` rows, reversed, are those of ``x[:k]`` in another batch composition."""
    half = x[:(len(x) + 1) // 2][::-1]
    return np.concatenate([half, half])[:len(x)], len(half)


def input_gradients(margin: np.ndarray, gradient: np.ndarray) -> Flag:
    """Share of examples whose input gradient of the CW margin is zero (AutoAttack's
    flag: every entry 0), not finite, or vanishing: a step of one grey level along its sign
    would change the margin, to first order (``||g||_1 / 255``), by less than float32 can
    resolve in it (``eps_float32 * max(|margin|, 1)``), so no attack can follow it. The
    margin is used, not the cross-entropy, because its gradient does not shrink with the
    model's confidence. Raised when any example is affected."""
    name = "input_gradients"
    flat = gradient.reshape(len(gradient), -1)
    finite = np.isfinite(flat).all(axis=1)
    zero = finite & (flat == 0).all(axis=1)
    first_order = np.where(finite, np.abs(flat).sum(axis=1), np.inf) * GREY_LEVEL
    vanishing = finite & (first_order < np.finfo(np.float32).eps * np.maximum(np.abs(margin), 1.0))
    value = {"zero": float(zero.mean()), "not_finite": float((~finite).mean()), "vanishing": float(vanishing.mean())}
    if finite.all() and not vanishing.any():
        return Flag(name, False, value, "every example has a finite, non-vanishing input gradient")
    return Flag(name, True, value, f"{(~finite | vanishing).mean():.0%} of the examples have a zero "
                f"({value['zero']:.0%}), vanishing ({value['vanishing']:.0%}) or non-finite "
                f"({value['not_finite']:.0%}) input gradient")


def probability_outputs(outputs: np.ndarray) -> Flag:
    """Whether the outputs look like probabilities (rows non-negative, summing to 1) or
    log-probabilities (their exponentials do) instead of logits, as AutoAttack checks."""
    name = "probability_outputs"
    outputs = outputs.astype(np.float64)
    log_sum = np.logaddexp.reduce(outputs, axis=-1)
    value = {"min": float(outputs.min()), "max": float(outputs.max()),
             "max_row_sum_error": float(np.abs(outputs.sum(-1) - 1).max()),
             "max_row_logsumexp": float(np.abs(log_sum).max())}
    if looks_like_probabilities(outputs):
        return Flag(name, True, value, "the outputs are non-negative and every row sums to 1: the model returns "
                    "probabilities, not logits")
    if (outputs <= 0).all() and np.allclose(log_sum, 0.0, atol=1e-4):
        return Flag(name, True, value, "the outputs' exponentials sum to 1 on every row: the model returns "
                    "log-probabilities, not logits")
    return Flag(name, False, value, "the outputs do not look like probabilities or log-probabilities")


def deterministic_forward(first: np.ndarray, again: np.ndarray, regrouped: np.ndarray) -> Flag:
    """The same examples must give the same logits on a repeated call (``again``; another
    noise draw of a randomized classifier) and in another batch (``regrouped``: the logits of the first rows of ``first``, computed at
    other positions in a batch of other examples). As AutoAttack: raised when a predicted
    class changes or the L2 distance of the unit-normalised logits exceeds 1e-4 on some
    example."""
    name = "deterministic_forward"

    def unit(logits):
        return logits / (np.linalg.norm(logits, axis=-1, keepdims=True) + 1e-10)

    pairs = {"repeated_call": (first, again), "other_batch": (first[:len(regrouped)], regrouped)}
    distances = {label: float(np.linalg.norm(unit(a) - unit(b), axis=-1).max()) for label, (a, b) in pairs.items()}
    changed = {label: int((a.argmax(-1) != b.argmax(-1)).sum()) for label, (a, b) in pairs.items()}
    value = {"max_distance": distances, "changed_predictions": changed}
    if max(distances.values()) <= RANDOMNESS_TOLERANCE and not any(changed.values()):
        return Flag(name, False, value, "repeated calls and another batch composition give the same logits")
    return Flag(name, True, value, f"the logits change between calls on the same examples (unit-logit "
                f"distance up to {max(distances.values()):.3g}, {max(changed.values())} prediction(s) "
                "changed): the forward pass is random or depends on the batch")


def class_count(num_classes: int, target_classes: int, version: str) -> list[Flag]:
    """AutoAttack's ``check_n_classes``: the DLR loss needs 3 classes and its targeted form
    (APGD-T) 4, so below that robustjax leaves those components of ``version`` out; and a
    model has only ``num_classes - 1`` target classes, the number robustjax then uses
    (``rand`` has no targeted component)."""
    flags = []
    if version == "rand":
        if num_classes < 3:
            flags.append(Flag("class_count", True, {"num_classes": num_classes}, f"the DLR loss needs 3 classes; "
                              f"the model has {num_classes}: APGD-DLR is left out"))
        return flags
    if num_classes < 4:
        left_out = "APGD-DLR and APGD-T are" if version == "plus" and num_classes < 3 else "APGD-T is"
        flags.append(Flag("class_count", True, {"num_classes": num_classes}, f"the targeted DLR loss needs 4 "
                          f"classes and DLR 3; the model has {num_classes}: {left_out} left out"))
    if target_classes > num_classes - 1:
        flags.append(Flag("target_classes", True, {"target_classes": target_classes, "num_classes": num_classes},
                          f"{target_classes} target classes asked, but a {num_classes}-class model has only "
                          f"{num_classes - 1}: {num_classes - 1} used"))
    return flags


def randomness_matches(classifier: Classifier, version: str) -> list[Flag]:
    """``rand`` is for randomized classifiers: on a deterministic one its 20 draws per step
    are the same model (the original warns likewise)."""
    if version == "rand" and not classifier.is_randomized:
        return [Flag("deterministic_rand", True, {"version": version}, "version='rand' on a deterministic classifier "
                     "averages 20 identical gradients per step: use version='standard', or build the model with "
                     "Classifier.randomized if its forward pass is random")]
    return []


def square_beats_white_box(fooled_by_square: int, num_examples: int) -> Flag:
    """AutoAttack's ``check_square_sr``: Square, a gradient-free attack, should not fool
    examples the white-box components before it left robust; raised when it fools more
    than 0.2% of the examples (and at least one)."""
    value = {"fooled_by_square": fooled_by_square, "num_examples": num_examples}
    if fooled_by_square <= BLACK_BOX_TOLERANCE * num_examples:
        return Flag("square_beats_white_box", False, value, "Square fooled no more than 0.2% of the examples "
                    "beyond the white-box components")
    return Flag("square_beats_white_box", True, value, f"Square fooled {fooled_by_square} of {num_examples} "
                f"examples ({fooled_by_square / num_examples:.1%}) that the white-box components left robust: "
                "their gradients may be masked; run Square with more queries and restarts, or an adaptive attack")


def model_flags(classifier: Classifier, x: jax.Array, y: jax.Array, *, expect_randomness: bool = False) -> list[Flag]:
    """The model-based flags on a batch: probability outputs, input gradients, and
    determinism unless ``expect_randomness`` (an evaluation made for random models)."""
    outputs, margin, gradient = map(to_host, outputs_and_margin_gradients(classifier, x, y))
    found = [probability_outputs(outputs), input_gradients(margin, gradient)]
    if expect_randomness:
        return found
    other, k = regrouped(to_host(x))
    other = jax.device_put(other, x.sharding) if isinstance(x, jax.Array) else other
    again, in_other = (to_host(logits(classifier.redraw(1), batch)) for batch in (x, other))
    return [*found, deterministic_forward(outputs, again, in_other[:k][::-1])]
