"""Certified robustness: lower bounds on robust accuracy, to set beside the attacks' upper bounds.

``bounds`` certifies a deterministic network over an L-infinity ball (IBP and CROWN);
``smoothing`` certifies the Gaussian-smoothed classifier over an L2 ball (Cohen et al., 2019).
"""

from robustjax.certify import bounds, smoothing
from robustjax.certify.bounds import Bounds, logit_bounds, margin_lower_bounds, verified
from robustjax.certify.smoothing import (
    Certificate,
    certificate,
    certified_accuracy,
    certify,
    class_counts,
    predict,
)

__all__ = [
    "Bounds", "Certificate", "certificate", "bounds", "certified_accuracy", "certify", "class_counts", "logit_bounds",
    "margin_lower_bounds", "predict", "smoothing", "verified",
]
