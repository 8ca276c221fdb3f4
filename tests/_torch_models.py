"""PyTorch model factories for the ``--torch-model`` tests (``_torch_models:small_cnn``): torchvision may be absent.

Imported only by tests that have already checked torch is installed.
"""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Every kind of Conv2d the tracer records: padding, stride, groups, 'same', 1x1, dilation, a shared layer."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding="same", groups=32)
        self.proj = nn.Conv2d(32, 64, 1, bias=False)
        self.dil = nn.Conv2d(64, 64, 3, padding=2, dilation=2)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.stem(x)))
        x = torch.relu(self.down(x))
        x = self.proj(self.dw(x))
        x = self.dil(torch.relu(self.dil(x)))  # called twice: two layers, one convolution
        return self.head(x.mean((2, 3)))


def small_cnn() -> nn.Module:
    return SmallCNN()


# (name, C, H, W, K, R, S, pad, stride, extra) of SmallCNN at input 3,32,32, computed by hand
SMALL_CNN_AT_3_32_32 = [
    {"name": "stem", "c": 3, "h": 32, "w": 32, "k": 16, "r": 3, "s": 3, "pad": [1, 1], "stride": [1, 1]},
    {"name": "down", "c": 16, "h": 16, "w": 16, "k": 32, "r": 3, "s": 3, "pad": [1, 1], "stride": [2, 2]},
    {"name": "dw", "c": 32, "h": 8, "w": 8, "k": 32, "r": 3, "s": 3, "pad": [1, 1], "stride": [1, 1], "groups": 32},
    {"name": "proj", "c": 32, "h": 8, "w": 8, "k": 64, "r": 1, "s": 1, "pad": [0, 0], "stride": [1, 1]},
    {"name": "dil", "c": 64, "h": 8, "w": 8, "k": 64, "r": 3, "s": 3, "pad": [2, 2], "stride": [1, 1],
     "dilation": [2, 2]},
    {"name": "dil#2", "c": 64, "h": 8, "w": 8, "k": 64, "r": 3, "s": 3, "pad": [2, 2], "stride": [1, 1],
     "dilation": [2, 2]},
]


class AlexNetFeatures(nn.Module):
    """AlexNet's convolutions as the shipped ``alexnet`` network describes them (227x227, no groups)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 96, 11, stride=4)
        self.conv2 = nn.Conv2d(96, 256, 5, padding=2)
        self.conv3 = nn.Conv2d(256, 384, 3, padding=1)
        self.conv4 = nn.Conv2d(384, 384, 3, padding=1)
        self.conv5 = nn.Conv2d(384, 256, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.conv3(x))
        x = torch.relu(self.conv4(x))
        return self.pool(torch.relu(self.conv5(x)))


def alexnet_features() -> nn.Module:
    return AlexNetFeatures()


def no_convolutions() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


def needs_arguments(width: int) -> nn.Module:
    return nn.Conv2d(3, width, 3)


NOT_A_FACTORY = 3
