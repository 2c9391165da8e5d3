"""DenseNet-121/169/201 (Huang et al., "Densely Connected Convolutional Networks",
CVPR 2017) as ``torchvision.models.densenet``: a 7x7 stem and max pool, four dense
blocks whose layers (BN-ReLU-1x1 conv-BN-ReLU-3x3 conv) each append ``growth_rate``
channels to everything before them, transitions (BN-ReLU-1x1 conv-2x2 average pool)
halving the channels between blocks, a final BN-ReLU, global average pooling and a
linear classifier. Attribute names follow torchvision (``features.denseblock1.
denselayer1.conv1``), so activations are keyed as PyTorch names its modules."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx

from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import batch_norm, conv, global_average_pool

INPUT_SHAPE = (224, 224, 3)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# name: (block_config, growth_rate, num_init_features); bn_size is 4 for all.
CONFIGS = {
    "densenet121": ((6, 12, 24, 16), 32, 64),
    "densenet169": ((6, 12, 32, 32), 32, 64),
    "densenet201": ((6, 12, 48, 32), 32, 64),
}
BN_SIZE = 4


class DenseLayer(nnx.Module):
    """BN-ReLU-conv1x1(bn_size * growth) - BN-ReLU-conv3x3(growth): the new features."""

    def __init__(self, in_features: int, growth_rate: int, bn_size: int, *, rngs: nnx.Rngs):
        self.norm1 = batch_norm(in_features, rngs)
        self.conv1 = conv(in_features, bn_size * growth_rate, 1, rngs=rngs)
        self.norm2 = batch_norm(bn_size * growth_rate, rngs)
        self.conv2 = conv(bn_size * growth_rate, growth_rate, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        bottleneck = self.conv1(nnx.relu(self.norm1(x)))
        return self.conv2(nnx.relu(self.norm2(bottleneck)))


class DenseBlock(nnx.Module):
    """``denselayer1 .. denselayerN``, each fed the concatenation of all earlier outputs."""

    def __init__(self, num_layers: int, in_features: int, growth_rate: int, bn_size: int, *,
                 rngs: nnx.Rngs):
        self.num_layers = num_layers
        for index in range(num_layers):
            layer = DenseLayer(in_features + index * growth_rate, growth_rate, bn_size, rngs=rngs)
            setattr(self, f"denselayer{index + 1}", layer)

    def __call__(self, x: jax.Array) -> jax.Array:
        for index in range(self.num_layers):
            x = jnp.concatenate([x, getattr(self, f"denselayer{index + 1}")(x)], axis=-1)
        return x


class Transition(nnx.Module):
    """BN-ReLU-conv1x1 to ``out_features`` channels, then 2x2 average pooling, stride 2."""

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs):
        self.norm = batch_norm(in_features, rngs)
        self.conv = conv(in_features, out_features, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.avg_pool(self.conv(nnx.relu(self.norm(x))), (2, 2), strides=(2, 2))


class DenseNetFeatures(nnx.Module):
    """torchvision's ``features``: conv0, norm0, max pool, dense blocks and transitions, norm5."""

    def __init__(self, block_config: tuple[int, ...], growth_rate: int, num_init_features: int,
                 bn_size: int, *, rngs: nnx.Rngs):
        self.conv0 = conv(3, num_init_features, 7, stride=2, padding=3, rngs=rngs)
        self.norm0 = batch_norm(num_init_features, rngs)
        self.num_blocks = len(block_config)
        features = num_init_features
        for index, num_layers in enumerate(block_config, start=1):
            setattr(self, f"denseblock{index}",
                    DenseBlock(num_layers, features, growth_rate, bn_size, rngs=rngs))
            features += num_layers * growth_rate
            if index < len(block_config):
                setattr(self, f"transition{index}", Transition(features, features // 2, rngs=rngs))
                features //= 2
        self.norm5 = batch_norm(features, rngs)
        self.out_features = features

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.norm0(self.conv0(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for index in range(1, self.num_blocks + 1):
            x = getattr(self, f"denseblock{index}")(x)
            if index < self.num_blocks:
                x = getattr(self, f"transition{index}")(x)
        return self.norm5(x)


class DenseNet(nnx.Module):
    """``classifier(mean(relu(features(x))))``."""

    def __init__(self, block_config: tuple[int, ...], growth_rate: int, num_init_features: int,
                 bn_size: int = BN_SIZE, num_classes: int = 1000, *, rngs: nnx.Rngs):
        self.features = DenseNetFeatures(block_config, growth_rate, num_init_features, bn_size,
                                         rngs=rngs)
        self.classifier = nnx.Linear(self.features.out_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.classifier(global_average_pool(nnx.relu(self.features(x))))


def _layer_prefix(weights: TorchWeights, block: str, name: str, index: int) -> str:
    """``{block}.norm1``, or ``{block}.norm.1`` as in checkpoints older than torchvision 0.3."""
    current = f"{block}.{name}{index}"
    legacy = f"{block}.{name}.{index}"
    return legacy if f"{current}.weight" not in weights and f"{legacy}.weight" in weights else current


def convert_densenet(weights: TorchWeights) -> dict:
    """Parameters of :class:`DenseNet` from a torchvision DenseNet state dict (either key style)."""
    layers_per_block: dict[int, int] = {}
    for key in weights.tensors:
        match = re.match(r"features\.denseblock(\d+)\.denselayer(\d+)\.", key)
        if match:
            block, layer = int(match[1]), int(match[2])
            layers_per_block[block] = max(layers_per_block.get(block, 0), layer)
    num_blocks = max(layers_per_block, default=0)
    features = {"conv0": weights.conv("features.conv0"), "norm0": weights.batch_norm("features.norm0"),
                "norm5": weights.batch_norm("features.norm5")}
    for block in range(1, num_blocks + 1):
        dense_block = {}
        for layer in range(1, layers_per_block.get(block, 0) + 1):
            prefix = f"features.denseblock{block}.denselayer{layer}"
            dense_block[f"denselayer{layer}"] = {
                "norm1": weights.batch_norm(_layer_prefix(weights, prefix, "norm", 1)),
                "conv1": weights.conv(_layer_prefix(weights, prefix, "conv", 1)),
                "norm2": weights.batch_norm(_layer_prefix(weights, prefix, "norm", 2)),
                "conv2": weights.conv(_layer_prefix(weights, prefix, "conv", 2)),
            }
        features[f"denseblock{block}"] = dense_block
        if block < num_blocks:
            prefix = f"features.transition{block}"
            features[f"transition{block}"] = {"norm": weights.batch_norm(f"{prefix}.norm"),
                                              "conv": weights.conv(f"{prefix}.conv")}
    return {"features": features, "classifier": weights.linear("classifier")}


def _register(name: str, block_config: tuple[int, ...], growth_rate: int,
              num_init_features: int) -> None:
    def build(*, key: jax.Array, num_classes: int = 1000,
              block_config: tuple[int, ...] = block_config, growth_rate: int = growth_rate,
              num_init_features: int = num_init_features, bn_size: int = BN_SIZE) -> Classifier:
        if not block_config:
            raise ValueError("block_config must list at least one dense block")
        for index, num_layers in enumerate(block_config):
            check_positive_int(num_layers, f"block_config[{index}]")
        for value, label in ((growth_rate, "growth_rate"), (num_init_features, "num_init_features"),
                             (bn_size, "bn_size")):
            check_positive_int(value, label)
        module = DenseNet(tuple(block_config), growth_rate, num_init_features, bn_size, num_classes,
                          rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE,
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=name)

    depth = 2 * sum(block_config) + len(block_config) + 1  # convs and the classifier
    build.__doc__ = f"DenseNet-{depth} (blocks {block_config}, growth {growth_rate}), as torchvision."
    register_model(name, family="densenet", weights=None, convert=convert_densenet,
                   torch_source=f"torchvision.models.{name}")(build)


for _name, _config in CONFIGS.items():
    _register(_name, *_config)
