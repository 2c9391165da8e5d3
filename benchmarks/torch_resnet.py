"""The CIFAR ResNet-18 of ``robustjax.zoo.resnet18_cifar`` in PyTorch, with weight copying."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import robustjax as rj


class TorchBasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class TorchResNet18(nn.Module):
    """CIFAR ResNet-18; takes NCHW images in [0, 1] and normalises them itself."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], num_classes: int = 10):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_planes = 64
        for stage, planes in enumerate((64, 128, 256, 512), start=1):
            stride = 1 if stage == 1 else 2
            blocks = [TorchBasicBlock(in_planes, planes, stride), TorchBasicBlock(planes, planes, 1)]
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
            in_planes = planes
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.linear(x.mean(dim=(2, 3)))


def _copy(tensor: torch.Tensor, value) -> None:
    tensor.copy_(torch.from_numpy(np.array(value[...], np.float32)))


def _copy_conv(conv: nn.Conv2d, p) -> None:
    _copy(conv.weight, np.asarray(p["kernel"][...]).transpose(3, 2, 0, 1))  # HWIO -> OIHW


def _copy_bn(bn: nn.BatchNorm2d, p) -> None:
    for torch_name, flax_name in (("weight", "scale"), ("bias", "bias"),
                                  ("running_mean", "mean"), ("running_var", "var")):
        _copy(getattr(bn, torch_name), p[flax_name])


def resnet18_to_torch(classifier: rj.Classifier) -> TorchResNet18:
    """Copies a robustjax ``resnet18_cifar`` classifier's weights into :class:`TorchResNet18`."""
    params = classifier.params
    model = TorchResNet18(classifier.mean, classifier.std, classifier.num_classes)
    with torch.no_grad():
        _copy_conv(model.conv1, params["conv1"])
        _copy_bn(model.bn1, params["bn1"])
        for stage in range(1, 5):
            for index, block in enumerate(getattr(model, f"layer{stage}")):
                p = params[f"layer{stage}"][index]
                _copy_conv(block.conv1, p["conv1"])
                _copy_bn(block.bn1, p["bn1"])
                _copy_conv(block.conv2, p["conv2"])
                _copy_bn(block.bn2, p["bn2"])
                if len(block.shortcut):
                    _copy_conv(block.shortcut[0], p["shortcut"]["conv"])
                    _copy_bn(block.shortcut[1], p["shortcut"]["bn"])
        _copy(model.linear.weight, np.asarray(params["linear"]["kernel"][...]).T)  # (in, out) -> (out, in)
        _copy(model.linear.bias, params["linear"]["bias"])
    return model.eval()
