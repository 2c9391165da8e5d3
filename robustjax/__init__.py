"""robustjax: fast, jit-compiled robustness evaluation of image classifiers in JAX.

The sub-packages are imported on first use (PEP 562), so that ``import robustjax`` and the
command line's ``--help`` do not pay for JAX.
"""

import importlib

from robustjax.xla_flags import apply_default_flags

apply_default_flags()  # before JAX creates its backends

__version__ = "0.1.0"
_SUBPACKAGES = ("attacks", "certify", "data", "distributed", "metrics", "nas", "noise", "precision", "training", "zoo")
__all__ = ["Classifier", *_SUBPACKAGES, "__version__"]


def __getattr__(name: str):
    if name == "zoo":
        importlib.import_module("robustjax.nas")  # registers the NAS spaces' networks in the zoo
    if name in _SUBPACKAGES:
        return importlib.import_module(f"robustjax.{name}")
    if name == "Classifier":
        from robustjax.classifier import Classifier

        return Classifier
    raise AttributeError(f"module 'robustjax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
