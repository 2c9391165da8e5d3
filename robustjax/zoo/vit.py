"""Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021) and
DeiT (Touvron et al., "Training data-efficient image transformers", ICML 2021), which has
the same architecture at other sizes.

The image is cut into non-overlapping patches by a strided convolution, a learned class
token is prepended, a learned position embedding added, and pre-norm transformer blocks
``x + attn(norm1(x)); x + mlp(norm2(x))`` follow; the final LayerNorm's class-token output
feeds the linear head. Layer names and numerics follow timm 1.0 (``VisionTransformer``:
fused ``qkv`` Linear, exact GELU, LayerNorm eps 1e-6).

``representation_size`` adds the "pre-logits" layer of the original ViT (a Linear to that
width followed by tanh, before the head; ``pre_logits.fc`` in timm 0.4, from which RobustART
took its ViT). RobustART built its ViT-B models with ``representation_size=768`` (+0.59M
parameters); timm 1.0 and the registered defaults have none, so RobustART's checkpoints
need a model built with ``representation_size=768``.

The building blocks shared by the Mixer and Swin ports (patch embedding, MLP, multi-head
attention, initialisers) live here too.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from robustjax.checks import check_positive_float, check_positive_int
from robustjax.classifier import Classifier
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.drop_path import DropPath, linear_scales, residual
from robustjax.zoo.registry import register_model

# timm's pretrained_cfg: the augreg ViT weights expect inputs scaled to [-1, 1]; DeiT the
# ImageNet statistics.
INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# timm's default initialisation of linear layers and embeddings (truncated normal, std 0.02).
trunc_normal = nnx.initializers.truncated_normal(stddev=0.02)


def layer_norm(features: int, epsilon: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm with PyTorch's two-pass variance (Flax's fast E[x^2] - E[x]^2 loses digits)."""
    return nnx.LayerNorm(features, epsilon=epsilon, use_fast_variance=False, rngs=rngs)


def linear(in_features: int, out_features: int, rngs: nnx.Rngs, *,
           use_bias: bool = True) -> nnx.Linear:
    return nnx.Linear(in_features, out_features, use_bias=use_bias, kernel_init=trunc_normal,
                      rngs=rngs)


class PatchEmbed(nnx.Module):
    """Non-overlapping ``patch_size`` patches projected by a strided convolution ``proj``,
    then an optional LayerNorm ``norm``; tokens (B, N, C) in row-major patch order when
    ``flatten``, else a (B, H/p, W/p, C) grid."""

    def __init__(self, in_features: int, features: int, patch_size: int, *, flatten: bool,
                 norm_epsilon: float | None = None, rngs: nnx.Rngs):
        self.proj = nnx.Conv(in_features, features, (patch_size, patch_size), strides=patch_size,
                             padding="VALID", rngs=rngs, conv_general_dilated=conv_general_dilated)
        self.norm = None if norm_epsilon is None else layer_norm(features, norm_epsilon, rngs)
        self.flatten = flatten

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.proj(x)
        if self.flatten:
            x = x.reshape(x.shape[0], -1, x.shape[-1])
        return x if self.norm is None else self.norm(x)


class Mlp(nnx.Module):
    """``fc2(gelu(fc1(x)))`` with the exact (erf) GELU, as timm's ``Mlp``."""

    def __init__(self, in_features: int, hidden_features: int, *, rngs: nnx.Rngs):
        self.fc1 = linear(in_features, hidden_features, rngs)
        self.fc2 = linear(hidden_features, in_features, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


def multi_head_attention(
    qkv: Float[Array, "*b n 3c"], num_heads: int, bias: Float[Array, "*bb h n n"] | None = None
) -> Float[Array, "*b n c"]:
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d) + bias) v`` per head, from the
    output of a fused ``qkv`` projection laid out as (3, heads, head_dim) along its last
    axis (timm's layout). ``bias`` broadcasts against the (*b, heads, N, N) logits."""
    *batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    q, k, v = jnp.moveaxis(qkv.reshape(*batch, tokens, 3, num_heads, head_dim), -3, 0)
    logits = jnp.einsum("...qhd,...khd->...hqk", q * head_dim**-0.5, k)
    if bias is not None:
        logits = logits + bias
    out = jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(logits, axis=-1), v)
    return out.reshape(*batch, tokens, num_heads * head_dim)


class Attention(nnx.Module):
    """Multi-head self-attention with a fused ``qkv`` projection and an output ``proj``."""

    def __init__(self, features: int, num_heads: int, *, rngs: nnx.Rngs):
        self.qkv = linear(features, 3 * features, rngs)
        self.proj = linear(features, features, rngs)
        self.num_heads = num_heads

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(multi_head_attention(self.qkv(x), self.num_heads))


class Block(nnx.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``, each
    branch through a drop-path layer (inactive unless training turns it on)."""

    def __init__(self, features: int, num_heads: int, mlp_ratio: float, drop_path_scale: float = 0.0, *,
                 rngs: nnx.Rngs):
        self.norm1 = layer_norm(features, 1e-6, rngs)
        self.attn = Attention(features, num_heads, rngs=rngs)
        self.drop_path1 = DropPath(drop_path_scale)
        self.norm2 = layer_norm(features, 1e-6, rngs)
        self.mlp = Mlp(features, int(features * mlp_ratio), rngs=rngs)
        self.drop_path2 = DropPath(drop_path_scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = residual(x, self.attn(self.norm1(x)), self.drop_path1)
        return residual(x, self.mlp(self.norm2(x)), self.drop_path2)


class PreLogits(nnx.Module):
    """The original ViT's representation layer: ``tanh(fc(x))``."""

    def __init__(self, in_features: int, features: int, *, rngs: nnx.Rngs):
        self.fc = linear(in_features, features, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.fc(x))


class VisionTransformer(nnx.Module):
    """Patch embedding, class token, position embedding, ``depth`` pre-norm blocks, final
    LayerNorm, class-token pooling, optional pre-logits layer, linear head. Drop-path rates
    rise linearly over the blocks (timm's rule)."""

    def __init__(self, *, img_size: int, patch_size: int, embed_dim: int, depth: int,
                 num_heads: int, mlp_ratio: float, num_classes: int,
                 representation_size: int | None, rngs: nnx.Rngs):
        num_patches = (img_size // patch_size) ** 2
        self.patch_embed = PatchEmbed(3, embed_dim, patch_size, flatten=True, rngs=rngs)
        self.cls_token = nnx.Param(nnx.initializers.normal(1e-6)(rngs.params(), (1, 1, embed_dim)))
        self.pos_embed = nnx.Param(trunc_normal(rngs.params(), (1, num_patches + 1, embed_dim)))
        self.blocks = nnx.List([Block(embed_dim, num_heads, mlp_ratio, scale, rngs=rngs)
                                for scale in linear_scales(depth)])
        self.norm = layer_norm(embed_dim, 1e-6, rngs)
        self.pre_logits = (None if representation_size is None
                           else PreLogits(embed_dim, representation_size, rngs=rngs))
        self.head = linear(representation_size or embed_dim, num_classes, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.patch_embed(x)
        cls_token = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[-1]))
        x = jnp.concatenate([cls_token, x], axis=1) + self.pos_embed[...]
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)[:, 0]
        if self.pre_logits is not None:
            x = self.pre_logits(x)
        return self.head(x)


def check_patch_grid(img_size: int, patch_size: int) -> None:
    check_positive_int(img_size, "img_size")
    check_positive_int(patch_size, "patch_size")
    if img_size % patch_size:
        raise ValueError(f"img_size ({img_size}) must be a multiple of patch_size ({patch_size})")


def check_heads(embed_dim: int, num_heads: int, name: str = "embed_dim") -> None:
    check_positive_int(embed_dim, name)
    check_positive_int(num_heads, "num_heads")
    if embed_dim % num_heads:
        raise ValueError(f"{name} ({embed_dim}) must be divisible by num_heads ({num_heads})")


def block_count(weights: TorchWeights, prefix: str) -> int:
    """Number of consecutive ``{prefix}{i}.`` groups in the state dict (from 0)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(m.group(1)) for name in weights.tensors if (m := pattern.match(name))}
    return max(indices) + 1 if indices else 0


def convert_mlp(weights: TorchWeights, prefix: str) -> dict:
    return {name: weights.linear(f"{prefix}.{name}", bias=True) for name in ("fc1", "fc2")}


def convert_vit(weights: TorchWeights) -> dict:
    """timm ``VisionTransformer`` state dict (class-token pooling, no registers) to
    :class:`VisionTransformer` parameters; the depth and a ``pre_logits.fc`` layer are read
    from the tensor names."""
    params = {
        "patch_embed": {"proj": weights.conv("patch_embed.proj", bias=True)},
        "cls_token": weights.take("cls_token"),
        "pos_embed": weights.take("pos_embed"),
        "blocks": {
            i: {
                "norm1": weights.layer_norm(f"blocks.{i}.norm1"),
                "attn": {"qkv": weights.linear(f"blocks.{i}.attn.qkv", bias=True),
                         "proj": weights.linear(f"blocks.{i}.attn.proj", bias=True)},
                "norm2": weights.layer_norm(f"blocks.{i}.norm2"),
                "mlp": convert_mlp(weights, f"blocks.{i}.mlp"),
            }
            for i in range(block_count(weights, "blocks."))
        },
        "norm": weights.layer_norm("norm"),
        "head": weights.linear("head", bias=True),
    }
    if "pre_logits.fc.weight" in weights:
        params["pre_logits"] = {"fc": weights.linear("pre_logits.fc", bias=True)}
    return params


def register_timm_model(name: str, *, family: str, module: type[nnx.Module], convert,
                        defaults: dict, check: Callable[[dict], dict], mean, std,
                        description: str) -> Callable[..., Classifier]:
    """Registers ``name`` (the timm model of that name) as a builder of
    ``module(num_classes=..., rngs=..., **config)``, where ``config`` is ``defaults`` with the
    caller's size overrides, validated and normalised by ``check``; the input is
    ``img_size`` square RGB, normalised by ``mean`` / ``std``."""

    @register_model(name, family=family, weights=None, description=description, convert=convert,
                    torch_source=f"timm:{name}")
    def build(*, key: jax.Array, num_classes: int = 1000, **overrides) -> Classifier:
        unknown = set(overrides) - set(defaults)
        if unknown:
            raise TypeError(f"{name}: unknown arguments {sorted(unknown)}; "
                            f"accepted: {sorted(defaults)}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        config = check({**defaults, **overrides})
        network = module(num_classes=num_classes, rngs=nnx.Rngs(params=key), **config)
        size = config["img_size"]
        return Classifier.from_nnx(network, num_classes=num_classes, input_shape=(size, size, 3),
                                   mean=mean, std=std, name=name)

    return build


def _check_vit(config: dict) -> dict:
    check_patch_grid(config["img_size"], config["patch_size"])
    check_heads(config["embed_dim"], config["num_heads"])
    check_positive_int(config["depth"], "depth")
    check_positive_float(config["mlp_ratio"], "mlp_ratio")
    if config["representation_size"] is not None:
        check_positive_int(config["representation_size"], "representation_size")
    return config


def _register(name: str, family: str, mean, std, **config) -> Callable[..., Classifier]:
    description = (f"{name} ({family}, timm 1.0 layout; patch {config['patch_size']}, width "
                   f"{config['embed_dim']}, depth {config['depth']}); random initialisation only.")
    defaults = dict(img_size=224, mlp_ratio=4.0, representation_size=None, **config)
    return register_timm_model(name, family=family, module=VisionTransformer, convert=convert_vit,
                               defaults=defaults, check=_check_vit, mean=mean, std=std,
                               description=description)


vit_base_patch16_224 = _register("vit_base_patch16_224", "vit", INCEPTION_MEAN, INCEPTION_STD,
                                 patch_size=16, embed_dim=768, depth=12, num_heads=12)
vit_base_patch32_224 = _register("vit_base_patch32_224", "vit", INCEPTION_MEAN, INCEPTION_STD,
                                 patch_size=32, embed_dim=768, depth=12, num_heads=12)
deit_tiny_patch16_224 = _register("deit_tiny_patch16_224", "deit", IMAGENET_MEAN, IMAGENET_STD,
                                  patch_size=16, embed_dim=192, depth=12, num_heads=3)
deit_small_patch16_224 = _register("deit_small_patch16_224", "deit", IMAGENET_MEAN, IMAGENET_STD,
                                   patch_size=16, embed_dim=384, depth=12, num_heads=6)
deit_base_patch16_224 = _register("deit_base_patch16_224", "deit", IMAGENET_MEAN, IMAGENET_STD,
                                  patch_size=16, embed_dim=768, depth=12, num_heads=12)
