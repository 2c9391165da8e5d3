"""RepVGG-A0 and RepVGG-B3 (Ding et al., "RepVGG: Making VGG-style ConvNets Great Again",
CVPR 2021), in the training-time form and the re-parameterised deploy form.

Training-time block: ``relu(BN(conv3x3(x)) + BN(conv1x1(x)) + BN(x))``, the identity
branch only where the block keeps its shape. Because every branch is linear in ``x`` at
inference, the three fold into one 3x3 convolution with bias (:func:`reparameterize`):
``relu(conv3x3'(x) + b')``. Five stages (``stage0`` is a single stride-2 block), each
starting with a stride-2 block, then global average pooling and ``linear``.

Layer names follow the official implementation (DingXiaoH/RepVGG, which RobustART used:
``stage1.0.rbr_dense.conv``, ``rbr_1x1``, ``rbr_identity``, deploy ``rbr_reparam``); the
converters read those checkpoints and timm's ``repvgg_*`` (``stages.0.0.conv_kxk.conv``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.ops.conv import conv_general_dilated
from robustjax.zoo.convert import TorchWeights
from robustjax.zoo.registry import register_model
from robustjax.zoo.resnet_layers import batch_norm, conv, global_average_pool

INPUT_SHAPE = (224, 224, 3)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BN_EPSILON = 1e-5  # resnet_layers.batch_norm's, PyTorch's default
NUM_STAGES = 5  # stage0 (one block) and stage1..stage4
# name: (blocks per stage1..4, widths of stage0..4, timm name)
CONFIGS = {
    "repvgg_a0": ((2, 4, 14, 1), (48, 48, 96, 192, 1280), "repvgg_a0"),
    "repvgg_b3": ((4, 6, 16, 1), (64, 192, 384, 768, 2560), "repvgg_b3"),
}


class ConvBN(nnx.Module):
    """The official ``conv_bn``: bias-free convolution (padding ``kernel // 2``) and BatchNorm."""

    def __init__(self, in_features: int, out_features: int, kernel: int, stride: int, *,
                 rngs: nnx.Rngs):
        self.conv = conv(in_features, out_features, kernel, stride=stride, rngs=rngs)
        self.bn = batch_norm(out_features, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(x))


class RepVGGBlock(nnx.Module):
    """Training-time block: 3x3 conv-BN + 1x1 conv-BN (+ BN of the input), then ReLU."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        keeps_shape = stride == 1 and in_features == out_features
        self.rbr_identity = batch_norm(in_features, rngs) if keeps_shape else None
        self.rbr_dense = ConvBN(in_features, out_features, 3, stride, rngs=rngs)
        self.rbr_1x1 = ConvBN(in_features, out_features, 1, stride, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        out = self.rbr_dense(x) + self.rbr_1x1(x)
        if self.rbr_identity is not None:
            out = out + self.rbr_identity(x)
        return nnx.relu(out)


class RepVGGDeployBlock(nnx.Module):
    """Deploy-form block: ``relu(conv3x3(x) + bias)``."""

    def __init__(self, in_features: int, out_features: int, stride: int, *, rngs: nnx.Rngs):
        self.rbr_reparam = nnx.Conv(in_features, out_features, (3, 3), strides=stride,
                                    padding=((1, 1), (1, 1)), use_bias=True, rngs=rngs,
                                    conv_general_dilated=conv_general_dilated)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(self.rbr_reparam(x))


class RepVGG(nnx.Module):
    """stage0 (one stride-2 block) - stage1..4 - global average pool - linear."""

    def __init__(self, num_blocks: tuple[int, ...], widths: tuple[int, ...], num_classes: int = 1000,
                 deploy: bool = False, *, rngs: nnx.Rngs):
        block = RepVGGDeployBlock if deploy else RepVGGBlock
        self.stage0 = block(3, widths[0], 2, rngs=rngs)
        in_features = widths[0]
        for stage, (depth, width) in enumerate(zip(num_blocks, widths[1:]), start=1):
            blocks = []
            for index in range(depth):
                blocks.append(block(in_features, width, 2 if index == 0 else 1, rngs=rngs))
                in_features = width
            setattr(self, f"stage{stage}", nnx.List(blocks))
        self.linear = nnx.Linear(in_features, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.stage0(x)
        for stage in range(1, NUM_STAGES):
            for block in getattr(self, f"stage{stage}"):
                x = block(x)
        return self.linear(global_average_pool(x))


# --- re-parameterisation -------------------------------------------------------------------

def _fold_batch_norm(kernel: jax.Array, bn: dict) -> tuple[jax.Array, jax.Array]:
    """``BN(conv(x))`` as one convolution: kernel scaled by ``gamma / sqrt(var + eps)`` per
    output channel, bias ``beta - mean * gamma / sqrt(var + eps)``."""
    scale = bn["scale"] / jnp.sqrt(bn["var"] + BN_EPSILON)
    return kernel * scale, bn["bias"] - bn["mean"] * scale


def fuse_block(block: dict) -> dict:
    """The deploy ``rbr_reparam`` ``{"kernel", "bias"}`` equal to a training-time block's
    three branches (pure-dict parameters of :class:`RepVGGBlock`)."""
    kernel, bias = _fold_batch_norm(block["rbr_dense"]["conv"]["kernel"], block["rbr_dense"]["bn"])
    kernel_1x1, bias_1x1 = _fold_batch_norm(block["rbr_1x1"]["conv"]["kernel"], block["rbr_1x1"]["bn"])
    kernel = kernel + jnp.pad(kernel_1x1, ((1, 1), (1, 1), (0, 0), (0, 0)))
    bias = bias + bias_1x1
    if block.get("rbr_identity") is not None:
        channels = kernel.shape[-1]
        identity = jnp.zeros((3, 3, channels, channels), kernel.dtype).at[1, 1].set(jnp.eye(channels))
        kernel_id, bias_id = _fold_batch_norm(identity, block["rbr_identity"])
        kernel, bias = kernel + kernel_id, bias + bias_id
    return {"rbr_reparam": {"kernel": kernel, "bias": bias}}


def _architecture(params: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(blocks per stage1..4, widths of stage0..4) read from parameter shapes."""
    def width(block):
        branch = block.get("rbr_reparam") or block["rbr_dense"]["conv"]
        return int(branch["kernel"].shape[-1])

    stages = [params[f"stage{stage}"] for stage in range(1, NUM_STAGES)]
    widths = (width(params["stage0"]), *(width(stage[0]) for stage in stages))
    return tuple(len(stage) for stage in stages), widths


def reparameterize(classifier: Classifier) -> Classifier:
    """The deploy form of a training-time RepVGG classifier: every block fused into one 3x3
    convolution with bias, giving the same logits (up to float rounding)."""
    if not isinstance(classifier, Classifier):
        raise TypeError(f"reparameterize expects a Classifier, got {type(classifier).__name__}")
    params = nnx.to_pure_dict(classifier.params)
    if "stage0" not in params or "rbr_dense" not in params["stage0"]:
        raise ValueError(f"classifier {classifier.name!r} is not a training-time RepVGG")
    num_blocks, widths = _architecture(params)
    fused = {"stage0": fuse_block(params["stage0"]), "linear": params["linear"]}
    for stage in range(1, NUM_STAGES):
        fused[f"stage{stage}"] = {index: fuse_block(block)
                                  for index, block in params[f"stage{stage}"].items()}
    abstract = nnx.eval_shape(lambda: RepVGG(num_blocks, widths, classifier.num_classes, deploy=True,
                                             rngs=nnx.Rngs(params=0)))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, fused)
    name = classifier.name if classifier.name.endswith("_deploy") else f"{classifier.name}_deploy"
    return Classifier.from_nnx(nnx.merge(graphdef, state), num_classes=classifier.num_classes,
                               input_shape=classifier.input_shape, mean=classifier.mean,
                               std=classifier.std, name=name)


# --- conversion ----------------------------------------------------------------------------

def _torch_names(weights: TorchWeights) -> tuple[str, str, dict[str, str]]:
    """The stem and stage naming of the state dict's layout: official or timm.

    Returns ``(stem, stage_format, branch_names)``, with ``stage_format`` taking the
    1-based stage index and the block index.
    """
    if any(key.startswith("stage0.") for key in weights.tensors):
        return "stage0", "stage{}.{}", {"rbr_dense": "rbr_dense", "rbr_1x1": "rbr_1x1",
                                        "rbr_identity": "rbr_identity", "rbr_reparam": "rbr_reparam",
                                        "linear": "linear"}
    return "stem", "stages.{}.{}", {"rbr_dense": "conv_kxk", "rbr_1x1": "conv_1x1",
                                    "rbr_identity": "identity", "rbr_reparam": "reparam_conv",
                                    "linear": "head.fc"}


def _count_blocks(weights: TorchWeights, stage_format: str, stage: int, leaf: str) -> int:
    count = 0
    while any(key.startswith(f"{stage_format.format(stage, count)}.{leaf}.")
              for key in weights.tensors):
        count += 1
    return count


def _convert(weights: TorchWeights, deploy: bool) -> dict:
    stem, stage_format, names = _torch_names(weights)
    timm_stages = stage_format.startswith("stages")

    def block(prefix: str, keeps_shape: bool) -> dict:
        if deploy:
            return {"rbr_reparam": weights.conv(f"{prefix}.{names['rbr_reparam']}", bias=True)}
        out = {branch: {"conv": weights.conv(f"{prefix}.{names[branch]}.conv", bias=False),
                        "bn": weights.batch_norm(f"{prefix}.{names[branch]}.bn")}
               for branch in ("rbr_dense", "rbr_1x1")}
        if keeps_shape:
            out["rbr_identity"] = weights.batch_norm(f"{prefix}.{names['rbr_identity']}")
        return out

    leaf = names["rbr_reparam"] if deploy else names["rbr_dense"]
    params = {"stage0": block(stem, keeps_shape=False), "linear": weights.linear(names["linear"])}
    for stage in range(1, NUM_STAGES):
        torch_stage = stage - 1 if timm_stages else stage
        depth = _count_blocks(weights, stage_format, torch_stage, leaf)
        params[f"stage{stage}"] = {
            index: block(stage_format.format(torch_stage, index), keeps_shape=index > 0)
            for index in range(depth)
        }
    return params


def convert_repvgg(weights: TorchWeights) -> dict:
    """Training-time :class:`RepVGG` parameters from an official (DingXiaoH/RepVGG, as
    RobustART) or timm RepVGG state dict."""
    return _convert(weights, deploy=False)


def convert_repvgg_deploy(weights: TorchWeights) -> dict:
    """Deploy-form :class:`RepVGG` parameters from an official deploy checkpoint
    (``rbr_reparam``) or a re-parameterised timm model (``reparam_conv``)."""
    return _convert(weights, deploy=True)


def _register(name: str, num_blocks: tuple[int, ...], widths: tuple[int, ...], timm_name: str,
              deploy: bool) -> None:
    full_name = f"{name}_deploy" if deploy else name

    def build(*, key: jax.Array, num_classes: int = 1000,
              num_blocks: tuple[int, ...] = num_blocks, widths: tuple[int, ...] = widths) -> Classifier:
        if len(num_blocks) != NUM_STAGES - 1 or len(widths) != NUM_STAGES:
            raise ValueError(f"num_blocks needs {NUM_STAGES - 1} entries and widths {NUM_STAGES}, "
                             f"got {tuple(num_blocks)} and {tuple(widths)}")
        for label, values in (("num_blocks", num_blocks), ("widths", widths)):
            for index, value in enumerate(values):
                check_positive_int(value, f"{label}[{index}]")
        module = RepVGG(tuple(num_blocks), tuple(widths), num_classes, deploy,
                        rngs=nnx.Rngs(params=key))
        return Classifier.from_nnx(module, num_classes=num_classes, input_shape=INPUT_SHAPE,
                                   mean=IMAGENET_MEAN, std=IMAGENET_STD, name=full_name)

    form = "deploy form (one 3x3 conv with bias per block)" if deploy else "training-time form"
    variant = name.rsplit("_", 1)[1].upper()
    build.__doc__ = f"RepVGG-{variant} (blocks {num_blocks}, widths {widths}), {form}."
    register_model(full_name, family="repvgg", weights=None,
                   convert=convert_repvgg_deploy if deploy else convert_repvgg,
                   torch_source=f"timm:{timm_name}")(build)


for _name, (_blocks, _widths, _timm_name) in CONFIGS.items():
    _register(_name, _blocks, _widths, _timm_name, deploy=False)
    _register(_name, _blocks, _widths, _timm_name, deploy=True)
