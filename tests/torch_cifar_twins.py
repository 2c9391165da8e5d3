"""PyTorch twins of the CIFAR checkpoints' architectures, written from the layouts of
RobustBench (``architectures/resnet.py``, ``wide_resnet.py``, ``dm_wide_resnet.py``) and
chenyaofo/pytorch-cifar-models, with the same module names and forward passes, so that
their state dicts are what those checkpoints hold. Sizes are parameters so tests can
build reduced versions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, padding: int | None = None) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2 if padding is None else padding, bias=False)


class ResNetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, cout, 3, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = _conv(cout, cout, 3), nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class PreActBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, after_activation: bool):
        super().__init__()
        self.after_activation = after_activation
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), _conv(cin, cout, 3, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), _conv(cout, cout, 3)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(_conv(cin, cout, 1, stride))

    def forward(self, x):
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out if self.after_activation else x) if hasattr(self, "shortcut") else x
        return self.conv2(F.relu(self.bn2(self.conv1(out)))) + shortcut


class CifarResNet18(nn.Module):
    """RobustBench ``ResNet18`` (``preact=False``) or ``PreActResNet`` (``preact=True``) with
    ``PreActBlock`` or, with ``after_activation``, ``PreActBlockV2``."""

    def __init__(self, depths=(2, 2, 2, 2), num_classes: int = 10, preact: bool = False,
                 after_activation: bool = False, bn_before_fc: bool = False):
        super().__init__()
        self.preact, self.bn_before_fc = preact, bn_before_fc
        self.conv1 = _conv(3, 64, 3)
        if not preact:
            self.bn1 = nn.BatchNorm2d(64)
        cin = 64
        for stage, (cout, depth) in enumerate(zip((64, 128, 256, 512), depths), start=1):
            blocks = []
            for index in range(depth):
                stride = 2 if stage > 1 and index == 0 else 1
                blocks.append(PreActBlock(cin, cout, stride, after_activation) if preact
                              else ResNetBlock(cin, cout, stride))
                cin = cout
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        if bn_before_fc:
            self.bn = nn.BatchNorm2d(512)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        out = self.conv1(x) if self.preact else F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        if self.bn_before_fc:
            out = F.relu(self.bn(out))
        return self.linear(F.avg_pool2d(out, 4).flatten(1))


class ChenyaofoBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, cout, 3, stride), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv(cout, cout, 3), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ChenyaofoCifarResNet(nn.Module):
    """chenyaofo/pytorch-cifar-models ``CifarResNet`` with ``blocks`` per stage."""

    def __init__(self, blocks: int, num_classes: int = 10):
        super().__init__()
        self.conv1, self.bn1, self.relu = _conv(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(inplace=True)
        cin = 16
        for stage, cout in enumerate((16, 32, 64), start=1):
            layer = []
            for index in range(blocks):
                layer.append(ChenyaofoBlock(cin, cout, 2 if stage > 1 and index == 0 else 1))
                cin = cout
            setattr(self, f"layer{stage}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x).flatten(1))


class WRNBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.bn1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = _conv(cin, cout, 3, stride)
        self.bn2, self.relu2 = nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
        self.conv2 = _conv(cout, cout, 3)
        self.equal = cin == cout
        self.convShortcut = None if self.equal else _conv(cin, cout, 1, stride, padding=0)

    def forward(self, x):
        if self.equal:
            out = self.relu1(self.bn1(x))
        else:
            x = self.relu1(self.bn1(x))
        out = self.relu2(self.bn2(self.conv1(out if self.equal else x)))
        out = self.conv2(out)
        return torch.add(x if self.equal else self.convShortcut(x), out)


class WRNGroup(nn.Module):
    def __init__(self, blocks: int, cin: int, cout: int, stride: int):
        super().__init__()
        self.layer = nn.Sequential(*[WRNBlock(cin if i == 0 else cout, cout, stride if i == 0 else 1)
                                     for i in range(blocks)])

    def forward(self, x):
        return self.layer(x)


class WideResNet(nn.Module):
    """RobustBench ``WideResNet(depth, widen_factor, sub_block1=...)``."""

    def __init__(self, depth: int = 28, widen_factor: int = 10, num_classes: int = 10, sub_block1: bool = False):
        super().__init__()
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        n = (depth - 4) // 6
        self.conv1 = _conv(3, widths[0], 3)
        self.block1 = WRNGroup(n, widths[0], widths[1], 1)
        if sub_block1:
            self.sub_block1 = WRNGroup(n, widths[0], widths[1], 1)
        self.block2 = WRNGroup(n, widths[1], widths[2], 2)
        self.block3 = WRNGroup(n, widths[2], widths[3], 2)
        self.bn1, self.relu = nn.BatchNorm2d(widths[3]), nn.ReLU(inplace=True)
        self.fc = nn.Linear(widths[3], num_classes)
        self.channels = widths[3]

    def forward(self, x):
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = F.avg_pool2d(self.relu(self.bn1(out)), 8)
        return self.fc(out.view(-1, self.channels))


class DMBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, activation):
        super().__init__()
        self.batchnorm_0, self.relu_0 = nn.BatchNorm2d(cin), activation()
        self.conv_0 = _conv(cin, cout, 3, stride, padding=0)
        self.batchnorm_1, self.relu_1 = nn.BatchNorm2d(cout), activation()
        self.conv_1 = _conv(cout, cout, 3)
        self.has_shortcut = cin != cout
        self.shortcut = _conv(cin, cout, 1, stride, padding=0) if self.has_shortcut else None
        self.stride = stride

    def forward(self, x):
        if self.has_shortcut:
            x = self.relu_0(self.batchnorm_0(x))
            v = x
        else:
            v = self.relu_0(self.batchnorm_0(x))
        v = F.pad(v, (1, 1, 1, 1) if self.stride == 1 else (0, 1, 0, 1))
        out = self.conv_1(self.relu_1(self.batchnorm_1(self.conv_0(v))))
        return torch.add(self.shortcut(x) if self.has_shortcut else x, out)


class DMGroup(nn.Module):
    def __init__(self, blocks: int, cin: int, cout: int, stride: int, activation):
        super().__init__()
        self.block = nn.Sequential(*[DMBlock(cin if i == 0 else cout, cout, stride if i == 0 else 1, activation)
                                     for i in range(blocks)])

    def forward(self, x):
        return self.block(x)


class DMWideResNet(nn.Module):
    """RobustBench ``DMWideResNet`` (mean/std buffers in the state dict)."""

    def __init__(self, depth: int = 70, width: int = 16, num_classes: int = 10, activation=nn.SiLU,
                 mean=(0.4914, 0.4822, 0.4465), std=(0.2471, 0.2435, 0.2616)):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(3, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(3, 1, 1))
        widths = [16, 16 * width, 32 * width, 64 * width]
        n = (depth - 4) // 6
        self.init_conv = _conv(3, widths[0], 3)
        self.layer = nn.Sequential(*[DMGroup(n, widths[g], widths[g + 1], 1 if g == 0 else 2, activation)
                                     for g in range(3)])
        self.batchnorm, self.relu = nn.BatchNorm2d(widths[3]), activation()
        self.logits = nn.Linear(widths[3], num_classes)
        self.channels = widths[3]

    def forward(self, x):
        out = self.init_conv((x - self.mean) / self.std)
        out = self.relu(self.batchnorm(self.layer(out)))
        return self.logits(F.avg_pool2d(out, 8).view(-1, self.channels))
