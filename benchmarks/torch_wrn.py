"""RobustBench's (TRADES') ``WideResNet`` in PyTorch, for peer benchmarks: the layout that
``robustjax.zoo`` ``wrn_28_10`` converts (``zoo.from_torch("wrn_28_10", model.state_dict())``).
Takes NCHW images in [0, 1] (no normalisation inside, like most of its checkpoints)."""

from __future__ import annotations

import math

from torch import nn


class Block(nn.Module):
    """``a = relu(bn1(x))``; ``conv2(relu(bn2(conv1(a)))) + (x or convShortcut(a))``."""

    def __init__(self, in_planes: int, out_planes: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, 3, stride=1, padding=1, bias=False)
        self.convShortcut = (None if in_planes == out_planes
                             else nn.Conv2d(in_planes, out_planes, 1, stride=stride, padding=0, bias=False))

    def forward(self, x):
        activated = self.relu1(self.bn1(x))
        out = self.conv2(self.relu2(self.bn2(self.conv1(activated))))
        return (x if self.convShortcut is None else self.convShortcut(activated)) + out


class NetworkBlock(nn.Module):
    def __init__(self, blocks: int, in_planes: int, out_planes: int, stride: int):
        super().__init__()
        self.layer = nn.Sequential(*[Block(in_planes if i == 0 else out_planes, out_planes, stride if i == 0 else 1)
                                     for i in range(blocks)])

    def forward(self, x):
        return self.layer(x)


class WideResNet(nn.Module):
    """WRN-depth-widen_factor for 32x32 images."""

    def __init__(self, depth: int = 28, widen_factor: int = 10, num_classes: int = 10):
        super().__init__()
        blocks, widths = (depth - 4) // 6, (16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.conv1 = nn.Conv2d(3, widths[0], 3, stride=1, padding=1, bias=False)
        self.block1 = NetworkBlock(blocks, widths[0], widths[1], 1)
        self.block2 = NetworkBlock(blocks, widths[1], widths[2], 2)
        self.block3 = NetworkBlock(blocks, widths[2], widths[3], 2)
        self.bn1 = nn.BatchNorm2d(widths[3])
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(widths[3], num_classes)
        for module in self.modules():  # the original's initialisation
            if isinstance(module, nn.Conv2d):
                module.weight.data.normal_(0, math.sqrt(2.0 / (module.kernel_size[0] * module.kernel_size[1]
                                                               * module.out_channels)))
            elif isinstance(module, nn.BatchNorm2d):
                module.weight.data.fill_(1)
                module.bias.data.zero_()
            elif isinstance(module, nn.Linear):
                module.bias.data.zero_()

    def forward(self, x):
        out = self.relu(self.bn1(self.block3(self.block2(self.block1(self.conv1(x))))))
        return self.fc(out.mean(dim=(2, 3)))
