"""RobustBench's (TRADES') ``WideResNet`` in PyTorch for the peer benchmarks: the twin the
zoo's parity tests convert (``tests/torch_cifar_twins.py``), with the original's random
initialisation, so that a randomly initialised network behaves like a trainable one.
Takes NCHW 32x32 images in [0, 1] (no normalisation inside, like most of its checkpoints)."""

from __future__ import annotations

import math

from torch import nn

from tests.torch_cifar_twins import WideResNet


def wide_resnet(depth: int = 28, widen_factor: int = 10, num_classes: int = 10) -> nn.Module:
    """WRN-depth-widen_factor, initialised as the original: He-normal convolutions over
    their fan-out, unit batch-norm scales, zero biases."""
    model = WideResNet(depth, widen_factor, num_classes)
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            module.weight.data.normal_(0, math.sqrt(2.0 / fan_out))
        elif isinstance(module, nn.BatchNorm2d):
            module.weight.data.fill_(1)
            module.bias.data.zero_()
        elif isinstance(module, nn.Linear):
            module.bias.data.zero_()
    return model
