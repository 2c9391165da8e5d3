"""robustjax: fast, jit-compiled robustness evaluation of image classifiers in JAX."""

from robustjax import attacks, data, zoo
from robustjax.classifier import Classifier

__version__ = "0.1.0"
__all__ = ["Classifier", "attacks", "data", "zoo", "__version__"]
