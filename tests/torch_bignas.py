"""RobustART's BigNAS ResNets in PyTorch, as the parity tests' reference.

No package ships them: this is a compact rewrite of ``BigNAS_ResNet_Basic`` and
``BigNAS_ResNet_Bottleneck`` (DIG-Beihang/RobustART, prototype/prototype/model/
bignas_resnet_{basicblock,bottleneck}.py) with the same module names, so its state dict has
RobustART's layout: convolutions with biases, BatchNorm2d, projection shortcuts where
stride != 1 or the widths differ, the per-stage kernel and expand ratio of the stage's last
block, ReLU, global average pooling and a linear classifier.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from robustjax.nas.bignas import make_divisible


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(OrderedDict(conv=nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2),
                                     bn=nn.BatchNorm2d(cout)))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, kernel, expand, stride):
        super().__init__()
        mid = make_divisible(cout * expand, 8)
        self.normal_conv1 = conv_bn(cin, mid, kernel, stride)
        self.normal_conv2 = conv_bn(mid, cout, kernel)
        self.shortcut = conv_bn(cin, cout, 1, stride) if cin != cout or stride != 1 else None

    def forward(self, x):
        out = self.normal_conv2(torch.relu(self.normal_conv1(x)))
        return torch.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class BottleneckBlock(nn.Module):
    def __init__(self, cin, cout, kernel, expand, stride):
        super().__init__()
        mid = make_divisible(cout * expand, 8)
        self.point_conv1 = conv_bn(cin, mid, 1)
        self.normal_conv = conv_bn(mid, mid, kernel, stride)
        self.point_conv2 = conv_bn(mid, cout, 1)
        if cin != cout or stride != 1:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride)
            self.shortcutbn = nn.BatchNorm2d(cout)
        else:
            self.shortcut = None

    def forward(self, x):
        out = self.point_conv2(torch.relu(self.normal_conv(torch.relu(self.point_conv1(x)))))
        return torch.relu(out + (x if self.shortcut is None else self.shortcutbn(self.shortcut(x))))


class LinearBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.linear = nn.Linear(cin, cout)

    def forward(self, x):
        return self.linear(x)


class BigNASResNet(nn.Module):
    """``block`` is "basic" or "bottleneck"; lists are RobustART's stage-wise lists of 5."""

    def __init__(self, block, widths, depths, kernels, expand_ratios, strides=(2, 2, 2, 2, 2),
                 in_channels=3, num_classes=1000):
        super().__init__()
        make_block = BasicBlock if block == "basic" else BottleneckBlock
        self.first_conv = conv_bn(in_channels, widths[0], kernels[0], strides[0])
        blocks, cin = [], widths[0]
        for stage in range(1, 5):
            for i in range(depths[stage]):
                blocks.append(make_block(cin, widths[stage], kernels[stage], expand_ratios[stage],
                                         strides[stage] if i == 0 else 1))
                cin = widths[stage]
        self.blocks = nn.ModuleList(blocks)
        self.classifier = LinearBlock(widths[-1], num_classes)

    def forward(self, x):
        x = torch.relu(self.first_conv(x))
        for block in self.blocks:
            x = block(x)
        return self.classifier(x.mean(dim=(2, 3)))
