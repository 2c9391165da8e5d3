"""Mixed precision: a classifier whose network computes in bfloat16.

``with_precision(classifier, "bfloat16")`` stores the floating parameters in bfloat16 and
casts the normalised images to bfloat16 on entry, so the network's convolutions and matrix
products run in bfloat16; its logits (and activations) come back in float32. Everything
outside the network stays float32: images, normalisation, losses, gradients with respect
to the images, projections onto the threat set and every accumulator. On accelerators
with bfloat16 units (TPUs, recent GPUs) this roughly doubles an attack's throughput; on
the CPU it is slower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from robustjax.checks import check_choice
from robustjax.classifier import Classifier

PRECISIONS = ("float32", "bfloat16")


def _cast_floats(tree: Any, dtype) -> Any:
    """Every floating leaf of ``tree`` in ``dtype``; integer leaves (masks, choices) unchanged."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


@dataclasses.dataclass(frozen=True)
class InPrecision:
    """``fn(params, x)`` run on ``x`` cast to ``dtype``, its floating outputs cast to float32
    (equal wrappers of equal functions compare equal, so programs are shared)."""

    fn: Callable[[Any, jax.Array], Any]
    dtype: str

    def __call__(self, params: Any, x: jax.Array) -> Any:
        return _cast_floats(self.fn(params, x.astype(self.dtype)), jnp.float32)


def with_precision(classifier: Classifier, precision: str) -> Classifier:
    """``classifier`` computing in ``precision`` ("float32": unchanged; "bfloat16": see the
    module's docstring). Applying it twice changes nothing more."""
    check_choice(precision, PRECISIONS, "precision")
    if precision == "float32" or isinstance(classifier.apply_fn, InPrecision):
        return classifier
    features = None if classifier.features_fn is None else InPrecision(classifier.features_fn, precision)
    return classifier.replace(params=_cast_floats(classifier.params, precision),
                              apply_fn=InPrecision(classifier.apply_fn, precision), features_fn=features)
