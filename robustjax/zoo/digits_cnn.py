"""The embedded default model: a small CNN for the 8x8 digits (see models/digits_cnn)."""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.assets import asset_dir, read_card
from robustjax.zoo.layers import max_pool_2x2
from robustjax.zoo.registry import register_model
from robustjax.zoo.weights import load_weights

NAME = "digits_cnn"
INPUT_SHAPE = (8, 8, 1)
# Per-channel statistics of the digits training split (grey level / 16).
MEAN = (0.3052,)
STD = (0.3761,)


class ConvBlock(nnx.Module):
    """3x3 convolution (SAME padding) followed by ReLU."""

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(in_features, out_features, (3, 3), padding="SAME", rngs=rngs,
                             conv_general_dilated=conv_general_dilated)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(self.conv(x))


class DenseBlock(nnx.Module):
    """Fully connected layer followed by ReLU."""

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(in_features, out_features, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(self.linear(x))


class DigitsCNN(nnx.Module):
    """conv32 - conv64 - maxpool2 - conv64 - fc128 - fc(num_classes), ReLU between."""

    def __init__(self, num_classes: int = 10, *, rngs: nnx.Rngs):
        self.block1 = ConvBlock(1, 32, rngs=rngs)
        self.block2 = ConvBlock(32, 64, rngs=rngs)
        self.block3 = ConvBlock(64, 64, rngs=rngs)
        self.fc1 = DenseBlock(4 * 4 * 64, 128, rngs=rngs)
        self.head = nnx.Linear(128, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.block2(self.block1(x))
        x = max_pool_2x2(x)
        x = self.block3(x)
        x = self.fc1(x.reshape(x.shape[0], -1))
        return self.head(x)


def digits_classifier(
    name: str, build: Callable[[], nnx.Module], *, num_classes: int, pretrained: bool
) -> Classifier:
    """The digits module ``build()`` as classifier ``name``. With ``pretrained`` the module
    is built with shapes only (``nnx.eval_shape``: no random initialisation to compile and
    throw away) and takes the weights bundled in ``models/<name>``."""
    if pretrained:
        if num_classes != 10:
            raise ValueError(f"pretrained {name} has 10 classes, got num_classes={num_classes}")
        module = nnx.eval_shape(build)
        nnx.update(module, load_weights(asset_dir(name) / "weights", nnx.state(module)))
    else:
        module = build()
    return Classifier.from_nnx(
        module, num_classes=num_classes, input_shape=INPUT_SHAPE, mean=MEAN, std=STD, name=name
    )


@register_model(NAME, family="digits_cnn", weights=f"trained here: models/train_digits.py {NAME}")
def digits_cnn(*, key: jax.Array, pretrained: bool = True, num_classes: int = 10) -> Classifier:
    """Small CNN trained on the embedded 8x8 digits (the default model)."""
    return digits_classifier(NAME, lambda: DigitsCNN(num_classes, rngs=nnx.Rngs(params=key)),
                             num_classes=num_classes, pretrained=pretrained)


def card() -> dict:
    return read_card(NAME)
