"""The tiny job whose runtime overhead calibration measures (importable, for spawned workers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

WIDTH = 8
BATCH = 16


def tiny_model() -> nn.Module:
    """Two small Linear layers: the layers' compute is microseconds, so a run measures the runtime."""
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def tiny_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A deterministic stream of ``(inputs, class targets)`` minibatches of ``BATCH`` rows."""
    g = torch.Generator().manual_seed(0)
    for _ in range(16):
        yield torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, WIDTH, (BATCH,), generator=g)


def tiny_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy."""
    return nn.functional.cross_entropy(out, y)


def tiny_sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """Plain SGD."""
    return torch.optim.SGD(params, lr=1e-3)


MEDIUM = 256


def medium_model() -> nn.Module:
    """Four Linear layers of width 256: enough compute per action to measure compute inside a run."""
    return nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(MEDIUM, MEDIUM), nn.ReLU())))


def medium_data(rows: int = 64) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic ``(inputs, class targets)`` minibatches of ``rows`` rows for :func:`medium_model`."""
    g = torch.Generator().manual_seed(0)
    for _ in range(16):
        yield torch.randn(rows, MEDIUM, generator=g), torch.randint(0, MEDIUM, (rows,), generator=g)
