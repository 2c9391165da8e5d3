"""The model registry: ``register_model``, ``names``, ``get``, ``create`` and model cards."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from robustjax.checks import read_json_object
from robustjax.classifier import Classifier
from robustjax.registry import Registry
from robustjax.zoo.abstract import build_abstract
from robustjax.zoo.weights import load_weights


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered architecture: how to build it, and what its card says."""

    name: str
    family: str
    build: Callable[..., Classifier]  # ``build(*, key, pretrained=..., **kwargs)``
    weights: str | None  # where pretrained weights come from, or None for none
    description: str
    convert: Callable | None = None  # ``convert(TorchWeights) -> pure dict`` (zoo/convert.py)
    torch_source: str | None = None  # the PyTorch model the converter reads, e.g. "torchvision.models.resnet18"


_MODELS: Registry[ModelEntry] = Registry("model")


class MissingWeights(ValueError):
    """A pretrained model was asked for, and the zoo has no weights for it."""

    def __init__(self, name: str):
        super().__init__(f"model {name!r} has no pretrained weights; pass pretrained=False for random weights, or "
                         f"convert a PyTorch checkpoint with `robustjax zoo convert {name} CHECKPOINT --out DIR` "
                         "and pass weights=DIR")
        self.name = name


def register_model(
    name: str,
    *,
    family: str,
    weights: str | None = None,
    description: str = "",
    convert: Callable | None = None,
    torch_source: str | None = None,
):
    """Registers ``build(*, key, pretrained, **kwargs) -> Classifier`` under ``name``, and
    returns the registered build.

    A model without ``weights`` registers ``build(*, key, **kwargs)``: the registry adds its
    ``pretrained`` argument, which refuses ``pretrained=True``. ``convert`` maps a PyTorch
    state dict (a ``zoo.convert.TorchWeights``) of ``torch_source`` to this model's parameters.
    """

    def decorator(build: Callable[..., Classifier]) -> Callable[..., Classifier]:
        registered = build if weights is not None else _random_weights_only(name, build)
        card_description = description or (build.__doc__ or "").strip()
        _MODELS.register(name, ModelEntry(name, family, registered, weights, card_description, convert, torch_source))
        return registered

    return decorator


def _random_weights_only(name: str, build: Callable[..., Classifier]) -> Callable[..., Classifier]:
    """``build`` of a model without pretrained weights, with a ``pretrained`` argument that
    refuses ``True``."""

    @functools.wraps(build)
    def build_random(*, pretrained: bool = False, **kwargs) -> Classifier:
        if pretrained:
            raise MissingWeights(name)
        return build(**kwargs)

    return build_random


def names(pattern: str = "*") -> list[str]:
    """Registered model names matching a glob ``pattern``, in registration order."""
    return [name for name in _MODELS if fnmatch.fnmatch(name, pattern)]


def get(name: str) -> ModelEntry:
    """The registered model ``name``."""
    return _MODELS.get(name)


def create(
    name: str,
    *,
    pretrained: bool = True,
    key: jax.Array | None = None,
    weights: str | Path | None = None,
    **kwargs,
) -> Classifier:
    """Builds a registered model; with ``pretrained`` it loads its bundled weights.

    ``weights`` is a folder written by ``robustjax zoo convert`` (or ``convert.save_converted``):
    its ``weights/`` checkpoint replaces the parameters and its ``card.json`` gives the class
    count. ``key`` seeds the random initialisation (default ``jax.random.key(0)``).
    """
    entry = get(name)
    if weights is not None:  # nothing is initialised: the key is not used
        return _with_stored_weights(entry, Path(weights), kwargs)
    return entry.build(key=jax.random.key(0) if key is None else key, pretrained=pretrained, **kwargs)


def load(spec: str, *, weights: str | Path | None = None) -> Classifier:
    """A zoo model by name (pretrained, or with converted ``weights``), or a user's model as
    ``package.module:function`` returning a :class:`Classifier`."""
    if ":" not in spec:
        return create(spec, weights=weights)
    if weights is not None:
        raise ValueError("--weights applies to zoo models, not to package.module:function models")
    module_name, _, function_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot load model {spec!r}: {error}") from None
    classifier = factory()
    if not isinstance(classifier, Classifier):
        raise TypeError(f"{spec} must return a robustjax.Classifier, returned {type(classifier).__name__}")
    return classifier


def _with_stored_weights(entry: ModelEntry, folder: Path, kwargs: dict) -> Classifier:
    card_path = folder / "card.json"
    if not card_path.is_file():
        raise ValueError(f"{str(folder)!r} holds no converted weights (no card.json); see `robustjax zoo convert`")
    card = read_json_object(card_path, required=("num_classes",))
    if card.get("name") != entry.name:
        raise ValueError(f"{str(folder)!r} holds weights of {card.get('name')!r}, not {entry.name!r}")
    kwargs = {"num_classes": card["num_classes"], **card.get("build_kwargs", {}), **kwargs}
    classifier = build_abstract(entry.build, **kwargs)  # shapes only: no initialisation to throw away
    return classifier.replace(params=load_weights(folder / "weights", classifier.params))


def card(name: str, **kwargs) -> dict:
    """The model card of ``name``: family, parameter count, FLOPs of one forward pass at the
    default input size (from XLA's cost analysis of the compiled program), input shape,
    normalisation and weight source. Built abstractly: no parameters are allocated."""
    from robustjax.zoo.abstract import build_abstract

    entry = get(name)
    abstract = build_abstract(entry.build, **kwargs)
    return {
        "name": name,
        "family": entry.family,
        "description": entry.description,
        "num_params": count_params(abstract),
        "flops": count_flops(abstract),
        "input_shape": list(abstract.input_shape),
        "num_classes": abstract.num_classes,
        "normalization": {"mean": list(abstract.mean), "std": list(abstract.std)},
        "weights": entry.weights,
        "torch_source": entry.torch_source,
    }


def count_params(classifier: Classifier) -> int:
    """Number of scalars in the classifier's parameters (batch statistics included)."""
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(classifier.params))


def count_flops(classifier: Classifier, batch_size: int = 1) -> float:
    """Floating-point operations of one forward pass, from XLA's compiled-program cost analysis."""
    x = jax.ShapeDtypeStruct((batch_size, *classifier.input_shape), jax.numpy.float32)
    compiled = jax.jit(lambda clf, images: clf(images)).lower(classifier, x).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax returns one dict per program
        analysis = analysis[0]
    return float(analysis.get("flops", float("nan")))
