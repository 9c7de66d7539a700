"""Held-out models of ``reproductions/sim_accuracy``: models that no test, notebook or calibration
step uses, so that the simulator's error on them is an error on models its terms were never fitted on.

* ``resnet``: a small convolutional net with skip connections (a stem convolution, three residual
  blocks whose input is added to their output, pooling and a linear classifier) on 3 x 16 x 16 images;
* ``gru``: a recurrent model: a token embedding, two GRU layers and a vocabulary head over 24-token
  sequences (next-token targets).

Worker processes import these builders by name, so everything lives at module level here, and the
data are seeded random tensors (nothing downloads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Residual(nn.Module):
    """``x + body(x)``: two 3x3 convolutions with a ReLU between, then a ReLU of the sum."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


def resnet(channels: int = 16, classes: int = 10) -> nn.Sequential:
    """The small residual convolutional net (module docstring)."""
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(),
        Residual(channels), Residual(channels),
        nn.MaxPool2d(2),
        Residual(channels),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(4 * channels, classes),
    )


def resnet_data(batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded random images and labels, 16 minibatches of ``batch``."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch * 16, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (batch * 16,), generator=g)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(y), batch)]


class LastOutput(nn.Module):
    """A GRU layer that returns its output sequence alone (not the final hidden state)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gru = nn.GRU(width, width, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


def gru(vocab: int = 200, width: int = 48) -> nn.Sequential:
    """The recurrent model (module docstring): embedding, two GRU layers, a vocabulary head."""
    return nn.Sequential(nn.Embedding(vocab, width), LastOutput(width), LastOutput(width),
                         nn.Linear(width, vocab))


def gru_data(batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded random token sequences of 24 and their next tokens, 16 minibatches of ``batch``."""
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, 200, (batch * 16, 25), generator=g)
    return [(seq[i:i + batch, :-1], seq[i:i + batch, 1:]) for i in range(0, len(seq), batch)]


def classes_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of class logits."""
    return nn.functional.cross_entropy(out, y)


def token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every token."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def sgd(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum (the cost model's ``sgd-momentum``)."""
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


#: model name -> (model_fn, data_fn, loss_fn, batch)
HELD_OUT: dict[str, tuple[Callable[[], nn.Module], Callable[..., Any], Callable[..., torch.Tensor], int]] = {
    "resnet": (resnet, resnet_data, classes_loss, 32),
    "gru": (gru, gru_data, token_loss, 32),
}
