"""Swin Transformer (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using
Shifted Windows", ICCV 2021).

Self-attention runs inside non-overlapping ``window_size`` x ``window_size`` windows with a
learned relative position bias (a table of ``(2w-1)^2`` entries per head, indexed by the
offset between two tokens). Every second block first rolls the grid by half a window
(``jnp.roll``) so windows straddle the previous ones' borders; tokens that the roll brought
from the opposite edge are kept apart by a mask of -100 on their attention logits, as in
the reference. Patch merging (2x2 neighbourhoods concatenated, LayerNorm, linear 4C -> 2C)
halves the grid at the start of every stage but the first.

Layer names, layout and numerics follow timm 1.0's ``SwinTransformer``
(``layers.N.downsample`` at the start of stages 1-3, ``layers.N.blocks.M``, ``head.fc``;
LayerNorm eps 1e-5, exact GELU). As in timm, a stage whose grid is no larger than the window
uses one window the size of the grid and no shift, and grids that are not a multiple of the
window are zero-padded at the bottom and right. The relative position index and the shift
mask are constants derived from the window and grid sizes, computed here rather than stored.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from robustjax.checks import check_positive_float, check_positive_int
from robustjax.classifier import Classifier
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.drop_path import DropPath, linear_scales, residual
from robustjax.zoo.vit import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Mlp,
    PatchEmbed,
    block_count,
    check_heads,
    check_patch_grid,
    convert_mlp,
    layer_norm,
    linear,
    multi_head_attention,
    register_timm_model,
    trunc_normal,
)

LN_EPS = 1e-5  # torch.nn.LayerNorm's default, which timm's Swin uses
MASK_VALUE = -100.0  # the reference's logit offset between tokens from different regions


@functools.lru_cache(maxsize=None)
def relative_position_index(window: int) -> np.ndarray:
    """(w*w, w*w) row of the bias table for each query/key pair of a window: the 2-D offset
    (dy, dx) in [-(w-1), w-1]^2, numbered row-major as (dy + w - 1) * (2w - 1) + dx + w - 1."""
    rows, cols = np.divmod(np.arange(window * window), window)
    dy = rows[:, None] - rows[None, :] + window - 1
    dx = cols[:, None] - cols[None, :] + window - 1
    return dy * (2 * window - 1) + dx


@functools.lru_cache(maxsize=None)
def shifted_window_mask(height: int, width: int, window: int, shift: int) -> np.ndarray:
    """(num_windows, w*w, w*w) logit offsets for a grid rolled by ``-shift``: 0 between tokens
    of the same region of the unrolled grid, -100 otherwise."""
    region = np.zeros((height, width), np.int32)
    bounds = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, rows in enumerate(bounds):
        for j, cols in enumerate(bounds):
            region[rows, cols] = 3 * i + j
    windows = partition_windows(region[None, :, :, None], window)[..., 0]
    return np.where(windows[:, :, None] == windows[:, None, :], 0.0, MASK_VALUE).astype(np.float32)


def partition_windows(x, window: int):
    """(B, H, W, C) -> (B * H/w * W/w, w*w, C), windows in row-major order per image."""
    batch, height, width, channels = x.shape
    x = x.reshape(batch, height // window, window, width // window, window, channels)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(-1, window * window, channels)


def merge_windows(windows: jax.Array, window: int, height: int, width: int) -> jax.Array:
    """Inverse of :func:`partition_windows`."""
    channels = windows.shape[-1]
    x = windows.reshape(-1, height // window, width // window, window, window, channels)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(-1, height, width, channels)


class WindowAttention(nnx.Module):
    """Multi-head self-attention within each window, plus the relative position bias and,
    for shifted windows, the region mask."""

    def __init__(self, features: int, num_heads: int, window: int, *, rngs: nnx.Rngs):
        self.relative_position_bias_table = nnx.Param(
            trunc_normal(rngs.params(), ((2 * window - 1) ** 2, num_heads)))
        self.qkv = linear(features, 3 * features, rngs)
        self.proj = linear(features, features, rngs)
        self.num_heads = num_heads
        self.window = window

    def __call__(self, x: Float[Array, "bw n c"],
                 mask: Float[Array, "w n n"] | None = None) -> Float[Array, "bw n c"]:
        tokens = x.shape[1]
        index = relative_position_index(self.window).reshape(-1)
        bias = self.relative_position_bias_table[...][index].reshape(tokens, tokens, self.num_heads)
        bias = bias.transpose(2, 0, 1)  # (heads, n, n)
        qkv = self.qkv(x)
        if mask is None:
            out = multi_head_attention(qkv, self.num_heads, bias)
        else:  # the windows of an image share the mask: logits (B, windows, heads, n, n)
            per_image = qkv.reshape(-1, mask.shape[0], *qkv.shape[1:])
            out = multi_head_attention(per_image, self.num_heads, bias + mask[:, None])
            out = out.reshape(x.shape)
        return self.proj(out)


class SwinTransformerBlock(nnx.Module):
    """``x + W-MSA(norm1(x))`` (shifted by ``shift`` when nonzero), then ``x + mlp(norm2(x))``,
    each branch through a drop-path layer (inactive unless training turns it on)."""

    def __init__(self, features: int, num_heads: int, window: int, shift: int, mlp_ratio: float,
                 drop_path_scale: float = 0.0, *, rngs: nnx.Rngs):
        self.norm1 = layer_norm(features, LN_EPS, rngs)
        self.attn = WindowAttention(features, num_heads, window, rngs=rngs)
        self.drop_path1 = DropPath(drop_path_scale)
        self.norm2 = layer_norm(features, LN_EPS, rngs)
        self.mlp = Mlp(features, int(features * mlp_ratio), rngs=rngs)
        self.drop_path2 = DropPath(drop_path_scale)
        self.window = window
        self.shift = shift

    def _attention(self, x: jax.Array) -> jax.Array:
        _, height, width, _ = x.shape
        window, shift = self.window, self.shift
        if shift:
            x = jnp.roll(x, (-shift, -shift), axis=(1, 2))
        padded_h, padded_w = height + (-height) % window, width + (-width) % window
        x = jnp.pad(x, ((0, 0), (0, padded_h - height), (0, padded_w - width), (0, 0)))
        mask = shifted_window_mask(padded_h, padded_w, window, shift) if shift else None
        out = self.attn(partition_windows(x, window), None if mask is None else jnp.asarray(mask))
        out = merge_windows(out, window, padded_h, padded_w)
        out = out[:, :height, :width]
        return jnp.roll(out, (shift, shift), axis=(1, 2)) if shift else out

    def __call__(self, x: Float[Array, "b h w c"]) -> Float[Array, "b h w c"]:
        x = residual(x, self._attention(self.norm1(x)), self.drop_path1)
        return residual(x, self.mlp(self.norm2(x)), self.drop_path2)


class PatchMerging(nnx.Module):
    """Each 2x2 neighbourhood concatenated (as timm: offsets (0,0), (1,0), (0,1), (1,1) in
    (row, column)), LayerNorm, then a linear 4C -> 2C without bias. Odd grids are
    zero-padded at the bottom and right."""

    def __init__(self, features: int, *, rngs: nnx.Rngs):
        self.norm = layer_norm(4 * features, LN_EPS, rngs)
        self.reduction = linear(4 * features, 2 * features, rngs, use_bias=False)

    def __call__(self, x: Float[Array, "b h w c"]) -> Float[Array, "b h/2 w/2 2c"]:
        batch, height, width, channels = x.shape
        x = jnp.pad(x, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)))
        half_h, half_w = x.shape[1] // 2, x.shape[2] // 2
        x = x.reshape(batch, half_h, 2, half_w, 2, channels).transpose(0, 1, 3, 4, 2, 5)
        return self.reduction(self.norm(x.reshape(batch, half_h, half_w, 4 * channels)))


class SwinTransformerStage(nnx.Module):
    """Optional patch merging, then blocks alternating plain and shifted windows, one per
    entry of ``drop_path_scales``."""

    def __init__(self, in_features: int, features: int, resolution: int, drop_path_scales: list[float],
                 num_heads: int, window: int, mlp_ratio: float, *, downsample: bool, rngs: nnx.Rngs):
        self.downsample = PatchMerging(in_features, rngs=rngs) if downsample else None
        # timm: a grid no larger than the window is one unshifted window of the grid's size.
        shift = window // 2 if resolution > window else 0
        window = min(window, resolution)
        self.blocks = nnx.List([
            SwinTransformerBlock(features, num_heads, window, shift if i % 2 else 0, mlp_ratio, scale,
                                 rngs=rngs)
            for i, scale in enumerate(drop_path_scales)
        ])

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.downsample is not None:
            x = self.downsample(x)
        for block in self.blocks:
            x = block(x)
        return x


class ClassifierHead(nnx.Module):
    """Global average pool over the grid, then the linear ``fc`` (timm's ``head.fc``)."""

    def __init__(self, in_features: int, num_classes: int, *, rngs: nnx.Rngs):
        self.fc = linear(in_features, num_classes, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc(x.mean(axis=(1, 2)))


class SwinTransformer(nnx.Module):
    """Patch embedding with LayerNorm, stages of widths ``embed_dim * 2^i``, LayerNorm, head.
    Drop-path rates rise linearly over all blocks of all stages (timm's rule)."""

    def __init__(self, *, img_size: int, patch_size: int, window_size: int, embed_dim: int,
                 depths: tuple[int, ...], num_heads: tuple[int, ...], mlp_ratio: float,
                 num_classes: int, rngs: nnx.Rngs):
        self.patch_embed = PatchEmbed(3, embed_dim, patch_size, flatten=False, norm_epsilon=LN_EPS,
                                      rngs=rngs)
        resolution, features, stages = img_size // patch_size, embed_dim, []
        scales = linear_scales(sum(depths))
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
            if i:
                resolution = (resolution + 1) // 2
            stage_features = embed_dim * 2**i
            stage_scales, scales = scales[:depth], scales[depth:]
            stages.append(SwinTransformerStage(features, stage_features, resolution, stage_scales, heads,
                                               window_size, mlp_ratio, downsample=i > 0, rngs=rngs))
            features = stage_features
        self.layers = nnx.List(stages)
        self.norm = layer_norm(features, LN_EPS, rngs)
        self.head = ClassifierHead(features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
        return self.head(self.norm(x))


def _window_attention(weights: TorchWeights, prefix: str) -> dict:
    table = weights.take(f"{prefix}.relative_position_bias_table")
    # Older checkpoints store the derived index buffer; it must be the one computed here.
    if f"{prefix}.relative_position_index" in weights:
        stored = weights.take(f"{prefix}.relative_position_index")
        window = (round(np.sqrt(table.shape[0])) + 1) // 2
        if not np.array_equal(stored, relative_position_index(window)):
            raise ValueError(f"{prefix}.relative_position_index is not the standard index of a "
                             f"{window}x{window} window")
    return {"relative_position_bias_table": table,
            "qkv": weights.linear(f"{prefix}.qkv", bias=True),
            "proj": weights.linear(f"{prefix}.proj", bias=True)}


def _block(weights: TorchWeights, prefix: str) -> dict:
    if f"{prefix}.attn_mask" in weights:  # a derived buffer in older checkpoints, recomputed here
        weights.take(f"{prefix}.attn_mask")
    return {
        "norm1": weights.layer_norm(f"{prefix}.norm1"),
        "attn": _window_attention(weights, f"{prefix}.attn"),
        "norm2": weights.layer_norm(f"{prefix}.norm2"),
        "mlp": convert_mlp(weights, f"{prefix}.mlp"),
    }


def convert_swin(weights: TorchWeights) -> dict:
    """timm 1.0 ``SwinTransformer`` state dict to :class:`SwinTransformer` parameters (stage
    and block counts are read from the tensor names; derived buffers are checked or dropped)."""
    stages = {}
    for i in range(block_count(weights, "layers.")):
        stage = {"blocks": {j: _block(weights, f"layers.{i}.blocks.{j}")
                            for j in range(block_count(weights, f"layers.{i}.blocks."))}}
        if i > 0:
            merge = f"layers.{i}.downsample"
            stage["downsample"] = {"norm": weights.layer_norm(f"{merge}.norm"),
                                   "reduction": weights.linear(f"{merge}.reduction", bias=False)}
        stages[i] = stage
    return {
        "patch_embed": {"proj": weights.conv("patch_embed.proj", bias=True),
                        "norm": weights.layer_norm("patch_embed.norm")},
        "layers": stages,
        "norm": weights.layer_norm("norm"),
        "head": {"fc": weights.linear("head.fc", bias=True)},
    }


def _check_swin(config: dict) -> dict:
    check_patch_grid(config["img_size"], config["patch_size"])
    check_positive_int(config["window_size"], "window_size")
    check_positive_int(config["embed_dim"], "embed_dim")
    check_positive_float(config["mlp_ratio"], "mlp_ratio")
    depths, heads = tuple(config["depths"]), tuple(config["num_heads"])
    if not depths or len(depths) != len(heads):
        raise ValueError(f"depths {depths} and num_heads {heads} must be non-empty and of equal "
                         "length")
    for i, (depth, num_heads) in enumerate(zip(depths, heads)):
        check_positive_int(depth, f"depths[{i}]")
        check_heads(config["embed_dim"] * 2**i, num_heads, f"stage {i} width (embed_dim * 2**{i})")
    return {**config, "depths": depths, "num_heads": heads}


def _register(name: str, **config) -> Callable[..., Classifier]:
    description = (f"{name} (Swin, timm 1.0 layout; width {config['embed_dim']}, depths "
                   f"{config['depths']}, heads {config['num_heads']}); random initialisation only.")
    defaults = dict(img_size=224, patch_size=4, window_size=7, mlp_ratio=4.0, **config)
    return register_timm_model(name, family="swin", module=SwinTransformer, convert=convert_swin,
                               defaults=defaults, check=_check_swin, mean=IMAGENET_MEAN,
                               std=IMAGENET_STD, description=description)


swin_tiny_patch4_window7_224 = _register("swin_tiny_patch4_window7_224", embed_dim=96,
                                         depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
swin_small_patch4_window7_224 = _register("swin_small_patch4_window7_224", embed_dim=96,
                                          depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
swin_base_patch4_window7_224 = _register("swin_base_patch4_window7_224", embed_dim=128,
                                         depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
