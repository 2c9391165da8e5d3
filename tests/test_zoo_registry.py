"""Registry-wide contract of the model zoo: every registered model is checked here."""

import functools

import jax
import pytest

import robustjax as rj
from robustjax.zoo.abstract import build_abstract

NAMES = rj.zoo.names()


@functools.cache
def abstract(name: str) -> rj.Classifier:
    """The model with shape-only parameters (nothing is allocated or initialised)."""
    return build_abstract(rj.zoo.get(name).build)


@pytest.mark.parametrize("name", NAMES)
def test_builds_and_maps_images_to_logits(name):
    entry = rj.zoo.get(name)
    clf = abstract(name)
    assert entry.name == name and entry.family and entry.description
    assert clf.name == name or clf.name.startswith(f"{name}:")
    images = jax.ShapeDtypeStruct((2, *clf.input_shape), jax.numpy.float32)
    logits = jax.eval_shape(lambda c, x: c(x), clf, images)
    assert logits.shape == (2, clf.num_classes) and logits.dtype == jax.numpy.float32
    assert rj.zoo.count_params(clf) > 0
    if entry.weights is None:
        with pytest.raises(ValueError, match=f"model '{name}' has no pretrained weights; pass pretrained=False"):
            rj.zoo.create(name)


TRAINED_HERE = rj.zoo.names("digits_*")  # the embedded digits models are trained, not ported


@pytest.mark.parametrize("name", [n for n in NAMES if n not in TRAINED_HERE])
def test_every_ported_model_converts_from_pytorch(name):
    entry = rj.zoo.get(name)
    assert callable(entry.convert) and entry.torch_source


def test_card_of_a_small_model():
    card = rj.zoo.card("digits_cnn")
    assert card["num_params"] == rj.zoo.count_params(rj.zoo.create("digits_cnn")) == 188_234
    assert card["flops"] > 2 * card["num_params"] * 0.5 and card["input_shape"] == [8, 8, 1]
    assert card["normalization"] == {"mean": [0.3052], "std": [0.3761]}


def test_unknown_names_suggest_close_matches():
    with pytest.raises(ValueError, match="did you mean 'resnet18_cifar'"):
        rj.zoo.create("resnet18_cifa")
