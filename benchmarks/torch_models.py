"""PyTorch twins of robustjax models, with the same weights, for peer benchmarks and tests."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import robustjax as rj


class Normalized(nn.Module):
    """``net`` taking NCHW images in [0, 1]: normalised by ``mean`` and ``std`` first; logits
    out (xautodl's ``TinyNetwork`` returns ``(features, logits)``)."""

    def __init__(self, net: nn.Module, mean, std):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net((x - self.mean) / self.std)
        return out[1] if isinstance(out, tuple) else out


class TorchDigitsCNN(nn.Module):
    """The digits CNN in PyTorch; takes NCHW images in [0, 1] and normalises them itself."""

    def __init__(self, mean: float, std: float):
        super().__init__()
        self.mean, self.std = mean, std
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(4 * 4 * 64, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = torch.relu(self.conv3(nn.functional.max_pool2d(x, 2)))
        x = x.permute(0, 2, 3, 1).flatten(1)  # NHWC order, as the Flax model flattens
        return self.head(torch.relu(self.fc1(x)))


def digits_cnn_to_torch(classifier: rj.Classifier) -> TorchDigitsCNN:
    """Copies a robustjax ``digits_cnn`` classifier's weights into :class:`TorchDigitsCNN`."""
    params = classifier.params
    model = TorchDigitsCNN(classifier.mean[0], classifier.std[0])
    layers = {
        model.conv1: params["block1"]["conv"],
        model.conv2: params["block2"]["conv"],
        model.conv3: params["block3"]["conv"],
        model.fc1: params["fc1"]["linear"],
        model.head: params["head"],
    }
    with torch.no_grad():
        for layer, p in layers.items():
            kernel = np.asarray(p["kernel"][...])
            # Flax conv kernels are HWIO, torch's OIHW; Flax dense kernels are (in, out).
            kernel = kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
            layer.bias.copy_(torch.from_numpy(np.asarray(p["bias"][...])))
    return model.eval()


def to_nchw(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(np.asarray(x).transpose(0, 3, 1, 2), order="C"))  # a writable copy


def to_nhwc(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy().transpose(0, 2, 3, 1)
