"""RobustART's BigNAS ResNets in PyTorch: the parity tests' reference and the NAS benchmark's peer.

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


def projects(cin: int, cout: int, stride: int, projection: bool | None) -> bool:
    """RobustART's rule (stride != 1 or widths differ), unless ``projection`` decides."""
    return (cin != cout or stride != 1) if projection is None else projection


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, kernel, expand, stride, projection=None):
        super().__init__()
        mid = make_divisible(cout * expand, 8)
        self.normal_conv1 = conv_bn(cin, mid, kernel, stride)
        self.normal_conv2 = conv_bn(mid, cout, kernel)
        self.shortcut = conv_bn(cin, cout, 1, stride) if projects(cin, cout, stride, projection) else None

    def forward(self, x):
        out = self.normal_conv2(torch.relu(self.normal_conv1(x)))
        return torch.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class BottleneckBlock(nn.Module):
    def __init__(self, cin, cout, kernel, expand, stride, projection=None):
        super().__init__()
        mid = make_divisible(cout * expand, 8)
        self.point_conv1 = conv_bn(cin, mid, 1)
        self.normal_conv = conv_bn(mid, mid, kernel, stride)
        self.point_conv2 = conv_bn(mid, cout, 1)
        if projects(cin, cout, stride, projection):
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
    """``block`` is "basic" or "bottleneck"; lists are RobustART's stage-wise lists of 5;
    ``projections`` (per stage, stem first) overrides which first blocks project."""

    def __init__(self, block, widths, depths, kernels, expand_ratios, strides=(2, 2, 2, 2, 2),
                 in_channels=3, num_classes=1000, projections=None):
        super().__init__()
        make_block = BasicBlock if block == "basic" else BottleneckBlock
        self.first_conv = conv_bn(in_channels, widths[0], kernels[0], strides[0])
        blocks, cin = [], widths[0]
        for stage in range(1, 5):
            for i in range(depths[stage]):
                projection = None if projections is None else (i == 0 and projections[stage])
                blocks.append(make_block(cin, widths[stage], kernels[stage], expand_ratios[stage],
                                         strides[stage] if i == 0 else 1, projection))
                cin = widths[stage]
        self.blocks = nn.ModuleList(blocks)
        self.classifier = LinearBlock(widths[-1], num_classes)

    def forward(self, x):
        x = torch.relu(self.first_conv(x))
        for block in self.blocks:
            x = block(x)
        return self.classifier(x.mean(dim=(2, 3)))


def load_robustjax_weights(model: BigNASResNet, weights: dict) -> BigNASResNet:
    """Copies a robustjax BigNAS subnet's weights (``nnx.to_pure_dict`` layout) into ``model``."""
    import numpy as np

    def conv(prefix: str, layer: dict) -> dict:
        out = {f"{prefix}.weight": np.transpose(np.asarray(layer["kernel"]), (3, 2, 0, 1))}
        if "bias" in layer:
            out[f"{prefix}.bias"] = np.asarray(layer["bias"])
        return out

    def bn(prefix: str, layer: dict) -> dict:
        return {f"{prefix}.{torch_name}": np.asarray(layer[name]) for name, torch_name in
                (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var"))}

    def conv_bn(prefix: str, layer: dict) -> dict:
        return conv(f"{prefix}.conv", layer["conv"]) | bn(f"{prefix}.bn", layer["bn"])

    tensors = conv_bn("first_conv", weights["first_conv"])
    for index, block in weights["blocks"].items():
        for name, layer in block.items():
            prefix = f"blocks.{index}.{name}"
            if name == "shortcutbn":
                tensors |= bn(prefix, layer)
            elif "conv" in layer:
                tensors |= conv_bn(prefix, layer)
            else:
                tensors |= conv(prefix, layer)
    tensors |= {"classifier.linear.weight": np.asarray(weights["classifier"]["kernel"]).T,
                "classifier.linear.bias": np.asarray(weights["classifier"]["bias"])}
    state = model.state_dict()
    missing = [k for k in state if k not in tensors and not k.endswith("num_batches_tracked")]
    if missing or set(tensors) - set(state):
        raise ValueError(f"weights do not fit: missing {missing}, unexpected {sorted(set(tensors) - set(state))}")
    model.load_state_dict({k: torch.from_numpy(np.array(tensors[k])) if k in tensors else v
                           for k, v in state.items()})
    return model
