"""PyTorch state dicts of NAS networks to robustjax weights.

NAS-Bench-201 networks come from xautodl's ``TinyNetwork`` (``stem``, ``cells.{i}``,
``lastact``, ``classifier``); BigNAS subnets from RobustART's ``BigNAS_ResNet_Basic`` and
``BigNAS_ResNet_Bottleneck`` (``first_conv``, ``blocks.{i}``, ``classifier.linear``).
"""

from __future__ import annotations

from robustjax.nas.nb201 import EDGES
from robustjax.zoo.convert import TorchWeights


def convert_nb201(weights: TorchWeights) -> dict:
    """xautodl ``TinyNetwork`` -> :class:`~robustjax.nas.nb201_net.NB201Network`.

    The cells are ``cells.0 .. 3N+1`` with the reduction blocks at N and 2N+1; a cell whose
    edges have no weights (skip, pooling, none) has no tensors, so N is read from the first
    reduction block.
    """
    def relu_conv_bn(prefix: str) -> dict:
        return {"conv": weights.conv(f"{prefix}.op.1", bias=False), "bn": weights.batch_norm(f"{prefix}.op.2")}

    reductions = sorted(int(name.split(".")[1]) for name in weights.tensors
                        if name.startswith("cells.") and name.endswith(".conv_a.op.1.weight"))
    if not reductions:
        raise ValueError(f"{weights.source}: no reduction block (cells.N.conv_a); not a NAS-Bench-201 TinyNetwork")
    cells = {}
    for index in range(3 * reductions[0] + 2):
        prefix = f"cells.{index}"
        if index in reductions:
            cells[index] = {"conv_a": relu_conv_bn(f"{prefix}.conv_a"), "conv_b": relu_conv_bn(f"{prefix}.conv_b"),
                            "downsample": weights.conv(f"{prefix}.downsample.1", bias=False)}
        elif layers := {str(edge): relu_conv_bn(f"{prefix}.layers.{edge}") for edge in range(len(EDGES))
                        if f"{prefix}.layers.{edge}.op.1.weight" in weights}:
            cells[index] = {"layers": layers}  # a cell of skips, pools and zeros has no weights at all
    return {"stem_conv": weights.conv("stem.0", bias=False), "stem_bn": weights.batch_norm("stem.1"),
            "cells": cells, "lastact": weights.batch_norm("lastact.0"), "classifier": weights.linear("classifier")}


def convert_bignas(weights: TorchWeights) -> dict:
    """RobustART ``BigNAS_ResNet_{Basic,Bottleneck}`` -> :class:`~robustjax.nas.bignas_net.BigNASResNet`."""
    def conv_bn(prefix: str) -> dict:
        return {"conv": weights.conv(f"{prefix}.conv", bias=True), "bn": weights.batch_norm(f"{prefix}.bn")}

    blocks = {}
    index = 0
    while f"blocks.{index}.normal_conv1.conv.weight" in weights or f"blocks.{index}.point_conv1.conv.weight" in weights:
        prefix = f"blocks.{index}"
        if f"{prefix}.normal_conv1.conv.weight" in weights:
            block = {"normal_conv1": conv_bn(f"{prefix}.normal_conv1"), "normal_conv2": conv_bn(f"{prefix}.normal_conv2")}
            if f"{prefix}.shortcut.conv.weight" in weights:
                block["shortcut"] = conv_bn(f"{prefix}.shortcut")
        else:
            block = {name: conv_bn(f"{prefix}.{name}") for name in ("point_conv1", "normal_conv", "point_conv2")}
            if f"{prefix}.shortcut.weight" in weights:
                block["shortcut"] = weights.conv(f"{prefix}.shortcut", bias=True)
                block["shortcutbn"] = weights.batch_norm(f"{prefix}.shortcutbn")
        blocks[index] = block
        index += 1
    return {"first_conv": conv_bn("first_conv"), "blocks": blocks, "classifier": weights.linear("classifier.linear")}
