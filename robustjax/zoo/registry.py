"""The model registry: ``register_model``, ``create``, ``list_models`` and model cards."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Callable

import jax

from robustjax.classifier import Classifier


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered architecture: how to build it, and what its card says."""

    name: str
    family: str
    build: Callable[..., Classifier]
    weights: str | None  # where pretrained weights come from, or None for none
    description: str
    convert: Callable | None = None  # ``convert(TorchWeights) -> pure dict`` (zoo/convert.py)
    torch_source: str | None = None  # the PyTorch model the converter reads, e.g. "torchvision.models.resnet18"


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(
    name: str,
    *,
    family: str,
    weights: str | None = None,
    description: str = "",
    convert: Callable | None = None,
    torch_source: str | None = None,
):
    """Registers ``build(*, key, pretrained, **kwargs) -> Classifier`` under ``name``.

    ``convert`` maps a PyTorch state dict (a ``zoo.convert.TorchWeights``) of
    ``torch_source`` to this model's parameters.
    """

    def decorator(build: Callable[..., Classifier]) -> Callable[..., Classifier]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = ModelEntry(
            name, family, build, weights, description or (build.__doc__ or "").strip(), convert, torch_source
        )
        return build

    return decorator


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a glob ``pattern``, sorted."""
    return sorted(name for name in _REGISTRY if fnmatch.fnmatch(name, pattern))


def get_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} (robustjax zoo list shows all {len(_REGISTRY)})")
    return _REGISTRY[name]


def create(name: str, *, pretrained: bool = True, key: jax.Array | None = None, **kwargs) -> Classifier:
    """Builds a registered model; with ``pretrained`` it loads its stored weights.

    ``key`` seeds the random initialisation (default ``jax.random.key(0)``).
    """
    entry = get_entry(name)
    if pretrained and entry.weights is None:
        raise ValueError(f"model {name!r} has no pretrained weights; pass pretrained=False")
    return entry.build(key=jax.random.key(0) if key is None else key, pretrained=pretrained, **kwargs)


def count_params(classifier: Classifier) -> int:
    """Number of scalars in the classifier's parameters (batch statistics included)."""
    return sum(leaf.size for leaf in jax.tree.leaves(classifier.params))


def count_flops(classifier: Classifier, batch_size: int = 1) -> float:
    """Floating-point operations of one forward pass, from XLA's compiled-program cost analysis."""
    x = jax.ShapeDtypeStruct((batch_size, *classifier.input_shape), jax.numpy.float32)
    compiled = jax.jit(lambda clf, images: clf(images)).lower(classifier, x).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax returns one dict per program
        analysis = analysis[0]
    return float(analysis.get("flops", float("nan")))
