"""The reference model of the default evaluation: an MLP for the 8x8 digits (see models/digits_mlp).

It is the transfer surrogate for black-box adversarial accuracy, the baseline of mCE on the
digits and the "original" model of defence comparisons; being a different architecture
from ``digits_cnn`` makes transfer from it a real black-box setting.
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.zoo.assets import read_card
from robustjax.zoo.digits_cnn import INPUT_SHAPE, DenseBlock, digits_classifier
from robustjax.zoo.registry import register_model

NAME = "digits_mlp"


class DigitsMLP(nnx.Module):
    """flatten(8x8x1) - fc256 - fc256 - fc(num_classes), ReLU between."""

    def __init__(self, num_classes: int = 10, *, rngs: nnx.Rngs):
        self.fc1 = DenseBlock(math.prod(INPUT_SHAPE), 256, rngs=rngs)
        self.fc2 = DenseBlock(256, 256, rngs=rngs)
        self.head = nnx.Linear(256, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.fc2(self.fc1(x.reshape(x.shape[0], -1))))


@register_model(NAME, family="digits_mlp", weights=f"trained here: models/train_digits.py {NAME}")
def digits_mlp(*, key: jax.Array, pretrained: bool = True, num_classes: int = 10) -> Classifier:
    """Two-hidden-layer MLP trained on the embedded 8x8 digits (the reference / surrogate model)."""
    return digits_classifier(NAME, lambda: DigitsMLP(num_classes, rngs=nnx.Rngs(params=key)),
                             num_classes=num_classes, pretrained=pretrained)


def card() -> dict:
    return read_card(NAME)
