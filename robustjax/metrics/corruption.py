"""Corruption robustness summaries (Hendrycks & Dietterich, "Benchmarking Neural Network
Robustness to Common Corruptions and Perturbations", ICLR 2019).

With E[c, s] the top-1 error under corruption c at severity s and E_clean the clean error:

- corruption error, unnormalised:  mean_s E[c, s]  (RobustART reports the mean of these; it is
  not mCE, which needs a baseline);
- CE_c = sum_s E[c, s] / sum_s E_base[c, s]  and  mCE = mean_c CE_c;
- relative CE_c = sum_s (E[c, s] - E_clean) / sum_s (E_base[c, s] - E_base_clean), and
  relative mCE = its mean over c,

where the baseline is AlexNet on ImageNet-C in the paper.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

# AlexNet's top-1 error on ImageNet-C, per corruption, severities 1 to 5 (the values the
# benchmark's authors distribute for mCE normalisation; their means are the paper's CEs).
ALEXNET_IMAGENET_C_ERRORS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.69528, 0.82542, 0.93554, 0.98138, 0.99452),
    "shot_noise": (0.71224, 0.85108, 0.93574, 0.98182, 0.99146),
    "impulse_noise": (0.78374, 0.89808, 0.9487, 0.9872, 0.99548),
    "defocus_blur": (0.65624, 0.73202, 0.85036, 0.91364, 0.94714),
    "glass_blur": (0.64308, 0.75054, 0.88806, 0.91622, 0.93344),
    "motion_blur": (0.5843, 0.70048, 0.82108, 0.8975, 0.92638),
    "zoom_blur": (0.70008, 0.76992, 0.80784, 0.84198, 0.87198),
    "snow": (0.71726, 0.88392, 0.86468, 0.9187, 0.94952),
    "frost": (0.6139, 0.79734, 0.8879, 0.89942, 0.9343),
    "fog": (0.67474, 0.7605, 0.84378, 0.8726, 0.945),
    "brightness": (0.4514, 0.48502, 0.54048, 0.62166, 0.7244),
    "contrast": (0.64548, 0.7615, 0.88874, 0.9776, 0.9927),
    "elastic_transform": (0.52596, 0.70116, 0.55686, 0.64076, 0.80554),
    "pixelate": (0.52218, 0.5462, 0.73728, 0.87092, 0.91262),
    "jpeg_compression": (0.51002, 0.54718, 0.57294, 0.65458, 0.74778),
}
# AlexNet's clean top-1 error on ImageNet (torchvision's weights: 56.522% accuracy).
ALEXNET_CLEAN_ERROR = 0.43478


def mean_corruption_error(errors: Float[Array, "c s"]) -> Float[Array, " c"]:
    """Per corruption, the plain mean error over severities, mean_s E[c, s].

    Not mCE: nothing is normalised by a baseline, and nothing is averaged over corruptions.
    mCE is ``mean(corruption_error(errors, baseline))``.
    """
    return jnp.mean(errors, axis=-1)


def corruption_error(errors: Float[Array, "c s"], baseline: Float[Array, "c s"]) -> Float[Array, " c"]:
    """CE_c = sum_s E[c, s] / sum_s E_base[c, s]."""
    return jnp.sum(errors, axis=-1) / jnp.sum(baseline, axis=-1)


def relative_corruption_error(
    errors: Float[Array, "c s"], clean_error: float, baseline: Float[Array, "c s"], baseline_clean_error: float
) -> Float[Array, " c"]:
    """Relative CE_c = sum_s (E[c, s] - E_clean) / sum_s (E_base[c, s] - E_base_clean)."""
    return jnp.sum(errors - clean_error, axis=-1) / jnp.sum(baseline - baseline_clean_error, axis=-1)
