"""Natural distribution shift on a class subset: ImageNet-A, -R and -O evaluate a 1,000-class
model on 200 classes by masking its logits to them (Hendrycks et al., "Natural Adversarial
Examples", CVPR 2021: ``output[:, indices_in_1k]``), so a prediction is always one of the 200.

ImageNet-O's OOD detection takes the anomaly score ``-max softmax`` over the masked logits
with OOD as the positive class; :func:`robustjax.metrics.calibration.ood_detection` turns the
scores into AUROC, AUPR and FPR at 95% TPR.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from robustjax.metrics.calibration import anomaly_score, max_softmax


def subset_logits(logits: Float[Array, "b n"], subset: Int[Array, " k"] | None) -> Float[Array, "b k"]:
    """The logits of the classes ``subset`` (indices into the model's ``n``), in its order;
    None keeps them all."""
    return logits if subset is None else jnp.take(logits, jnp.asarray(subset), axis=-1)


def subset_predictions(logits: Float[Array, "b n"], subset: Int[Array, " k"] | None) -> Int[Array, " b"]:
    """The predicted class among ``subset``, as an index into the model's ``n`` classes (so it
    compares with labels in the model's label space)."""
    top = jnp.argmax(subset_logits(logits, subset), axis=-1)
    return top if subset is None else jnp.asarray(subset)[top]


def subset_confidence(logits: Float[Array, "b n"], subset: Int[Array, " k"] | None) -> Float[Array, " b"]:
    """The largest softmax probability over the ``subset`` logits (the confidence that RMS
    calibration error, ECE and AURRA read)."""
    return max_softmax(subset_logits(logits, subset))


def subset_anomaly_score(logits: Float[Array, "b n"], subset: Int[Array, " k"] | None) -> Float[Array, " b"]:
    """RobustART's and Hendrycks' ImageNet-O score: ``-max softmax`` over the ``subset`` logits;
    higher means more anomalous."""
    return anomaly_score(subset_logits(logits, subset))


@jax.jit
def subset_outputs(logits: Float[Array, "b n"], subset: Int[Array, " k"]) -> tuple[Float[Array, " b"], Int[Array, " b"]]:
    """Confidence and prediction over the ``subset`` logits, in one program."""
    return subset_confidence(logits, subset), subset_predictions(logits, subset)
