"""Expectation over Transformation (EOT; Athalye, Engstrom, Ilyas & Kwok 2018; Athalye,
Carlini & Wagner 2018, §4.2): against a randomized classifier, ascend the expected loss,
whose gradient is the mean of the gradients over draws of the model's noise.

A gradient attack with ``eot_samples = n`` evaluates, at each step ``t``, the gradient on
the draws ``classifier.redraw(t).redraw(k)``, k < n, and averages them; the loss and the
prediction it keeps are those of the last draw, as AutoAttack's APGD does with its
``eot_iter``. Each draw is one query. On a deterministic classifier every draw is the same
model, so ``n > 1`` only repeats work (a warning says so).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax

from robustjax.attacks.flags import ModelCheckWarning
from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier

# loss(images, classifier) -> (summed loss, auxiliary values), differentiated in images.
Loss = Callable[[jax.Array, Classifier], tuple[jax.Array, Any]]


def check_eot_samples(samples: int, name: str = "eot_samples") -> None:
    check_positive_int(samples, name)


def warn_if_deterministic(classifier: Classifier, samples: int, attack: str) -> None:
    """Host-side: EOT over a deterministic classifier's identical draws wastes work."""
    if samples > 1 and not classifier.is_randomized:
        warnings.warn(f"{attack}: eot_samples={samples} on a deterministic classifier repeats the same gradient "
                      f"{samples} times; use eot_samples=1, or build a randomized model with "
                      "Classifier.randomized", ModelCheckWarning, stacklevel=3)


def expected_gradient(
    loss: Loss, images: jax.Array, classifier: Classifier, step: int | jax.Array, samples: int,
) -> tuple[jax.Array, Any]:
    """The gradient of ``loss`` in ``images`` averaged over ``samples`` draws of step
    ``step``'s noise, and the auxiliary values of the last draw."""
    def at(sample):
        return jax.grad(loss, has_aux=True)(images, classifier.redraw(step).redraw(sample))

    grad, aux = at(0)
    if samples == 1:
        return grad, aux

    def add(sample, carry):
        total, _ = carry
        grad, aux = at(sample)
        return total + grad, aux

    total, aux = jax.lax.fori_loop(1, samples, add, (grad, aux))
    return total / samples, aux
