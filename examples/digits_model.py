"""The example's model, loss and optimizer: plain PyTorch, nothing pipelab-specific.

``pipelab train job.json`` imports these by the names the job file gives (``digits_model:make_model``),
with this folder on the import path. Every worker process calls ``make_model()`` with the same seed,
so all of them start from the same weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def make_model(channels: int = 16, num_classes: int = 10) -> nn.Sequential:
    """A small CNN for 8x8 one-channel images; each child is one layer a plan can cut between."""
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * 16, 64), nn.ReLU(), nn.Linear(64, num_classes),
    )


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the minibatch (the last stage computes it)."""
    return nn.functional.cross_entropy(outputs, targets)


def optimizer(params: Iterable[nn.Parameter], lr: float = 0.05, momentum: float = 0.9) -> torch.optim.SGD:
    """One stage's optimizer; the job file's ``kwargs`` set ``lr`` and ``momentum``."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum)
