"""robustjax: fast, jit-compiled robustness evaluation of image classifiers in JAX."""

from robustjax.xla_flags import apply_default_flags

apply_default_flags()  # before JAX creates its backends

from robustjax import attacks, data, metrics, nas, noise, zoo  # noqa: E402
from robustjax.classifier import Classifier  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Classifier", "attacks", "data", "metrics", "nas", "noise", "zoo", "__version__"]
