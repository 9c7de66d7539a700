"""Helpers of fault_surface.py that worker processes import: a model, data, and losses that record
the wall time of the fault they cause (written to the file named by ``PIPELAB_FAULT_CLOCK``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

FAULT_STEP = 6


def mlp() -> nn.Module:
    """A 9-layer MLP (the issue's fault-injection model)."""
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 4))


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    for _ in range(400):
        yield torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)


def _stamp() -> None:
    path = os.environ.get("PIPELAB_FAULT_CLOCK")
    if path:
        with open(path, "w") as fh:
            fh.write(repr(time.time()))


_CALLS = [0]


def raising_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Raises on the 4 * FAULT_STEP-th call in a process, stamping the time first."""
    _CALLS[0] += 1
    if _CALLS[0] == 4 * FAULT_STEP:
        _stamp()
        raise RuntimeError("deliberate failure")
    return F.cross_entropy(out, y)


def nan_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """NaN from the 4 * FAULT_STEP-th call in a process on (a layer multiplying by inf), stamped."""
    _CALLS[0] += 1
    loss = F.cross_entropy(out, y)
    if _CALLS[0] >= 4 * FAULT_STEP:
        if _CALLS[0] == 4 * FAULT_STEP:
            _stamp()
        return loss * float("inf") * 0.0
    return loss


def sgd(params):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)
