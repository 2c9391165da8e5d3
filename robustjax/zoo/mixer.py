"""MLP-Mixer (Tolstikhin et al., "MLP-Mixer: An all-MLP Architecture for Vision",
NeurIPS 2021).

Patches are embedded by a strided convolution (``stem``); each block mixes tokens
``x + mlp_tokens(norm1(x)^T)^T`` and then channels ``x + mlp_channels(norm2(x))``; a final
LayerNorm, the mean over tokens and a linear head give the logits. Layer names and numerics
follow timm 1.0's ``MlpMixer`` (exact GELU, LayerNorm eps 1e-6, token-MLP width
``0.5 * embed_dim`` and channel-MLP width ``4 * embed_dim``, both relative to the embedding
width as in timm).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx

from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.drop_path import DropPath, residual
from robustjax.zoo.vit import (
    INCEPTION_MEAN,
    INCEPTION_STD,
    Mlp,
    PatchEmbed,
    block_count,
    check_patch_grid,
    convert_mlp,
    layer_norm,
    linear,
    register_timm_model,
)

TOKENS_RATIO, CHANNELS_RATIO = 0.5, 4.0


class MixerBlock(nnx.Module):
    """Token mixing across patches, then channel mixing, each pre-normed and residual, each
    branch through a drop-path layer (inactive unless training turns it on). timm's Mixer
    gives every block the whole drop-path rate (it does not raise it along depth)."""

    def __init__(self, features: int, num_tokens: int, *, rngs: nnx.Rngs):
        self.norm1 = layer_norm(features, 1e-6, rngs)
        self.mlp_tokens = Mlp(num_tokens, int(TOKENS_RATIO * features), rngs=rngs)
        self.drop_path1 = DropPath(1.0)
        self.norm2 = layer_norm(features, 1e-6, rngs)
        self.mlp_channels = Mlp(features, int(CHANNELS_RATIO * features), rngs=rngs)
        self.drop_path2 = DropPath(1.0)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = residual(x, self.mlp_tokens(self.norm1(x).swapaxes(1, 2)).swapaxes(1, 2), self.drop_path1)
        return residual(x, self.mlp_channels(self.norm2(x)), self.drop_path2)


class MlpMixer(nnx.Module):
    """Patch embedding, ``num_blocks`` Mixer blocks, LayerNorm, token mean, linear head."""

    def __init__(self, *, img_size: int, patch_size: int, embed_dim: int, num_blocks: int,
                 num_classes: int, rngs: nnx.Rngs):
        num_tokens = (img_size // patch_size) ** 2
        self.stem = PatchEmbed(3, embed_dim, patch_size, flatten=True, rngs=rngs)
        self.blocks = nnx.List([MixerBlock(embed_dim, num_tokens, rngs=rngs)
                                for _ in range(num_blocks)])
        self.norm = layer_norm(embed_dim, 1e-6, rngs)
        self.head = linear(embed_dim, num_classes, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(axis=1))


def convert_mixer(weights: TorchWeights) -> dict:
    """timm ``MlpMixer`` state dict to :class:`MlpMixer` parameters (the block count is read
    from the tensor names)."""
    return {
        "stem": {"proj": weights.conv("stem.proj", bias=True)},
        "blocks": {
            i: {
                "norm1": weights.layer_norm(f"blocks.{i}.norm1"),
                "mlp_tokens": convert_mlp(weights, f"blocks.{i}.mlp_tokens"),
                "norm2": weights.layer_norm(f"blocks.{i}.norm2"),
                "mlp_channels": convert_mlp(weights, f"blocks.{i}.mlp_channels"),
            }
            for i in range(block_count(weights, "blocks."))
        },
        "norm": weights.layer_norm("norm"),
        "head": weights.linear("head", bias=True),
    }


def _check_mixer(config: dict) -> dict:
    check_patch_grid(config["img_size"], config["patch_size"])
    check_positive_int(config["embed_dim"], "embed_dim")
    check_positive_int(config["num_blocks"], "num_blocks")
    if config["embed_dim"] < 2:
        raise ValueError(f"embed_dim must be >= 2 (the token MLP is embed_dim / 2 wide), "
                         f"got {config['embed_dim']}")
    return config


def _register(name: str, **config) -> Callable[..., Classifier]:
    description = (f"{name} (MLP-Mixer, timm 1.0 layout; patch {config['patch_size']}, width "
                   f"{config['embed_dim']}, {config['num_blocks']} blocks); "
                   "random initialisation only.")
    # timm's pretrained_cfg for the Google Mixer weights: inputs scaled to [-1, 1].
    return register_timm_model(name, family="mlp_mixer", module=MlpMixer, convert=convert_mixer,
                               defaults=dict(img_size=224, **config), check=_check_mixer,
                               mean=INCEPTION_MEAN, std=INCEPTION_STD, description=description)


mixer_b16_224 = _register("mixer_b16_224", patch_size=16, embed_dim=768, num_blocks=12)
mixer_l16_224 = _register("mixer_l16_224", patch_size=16, embed_dim=1024, num_blocks=24)
