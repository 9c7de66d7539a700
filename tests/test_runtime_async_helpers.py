"""Importable models, data and oracles for the issue-6 runtime tests (spawned workers import this module)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from test_runtime_helpers import max_diff  # noqa: F401  (re-exported for the async tests)
from torch import nn

BATCH = 8


class MLP(nn.Module):
    """5 layers: fc1 relu fc2 relu fc3 (cuts after any layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class DropMLP(MLP):
    """The MLP with dropout (recompute must replay the same random mask)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.dropout(F.relu(self.fc2(F.relu(self.fc1(x)))), 0.3, self.training))


def mlp() -> nn.Module:
    return MLP()


def drop_mlp() -> nn.Module:
    return DropMLP()


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    for _ in range(40):
        x = torch.randn(BATCH, 6, generator=g)
        yield x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y)


sgd = functools.partial(torch.optim.SGD, lr=0.1)
momentum = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def delayed_reference(model_fn: Any, data_fn: Any, opt_fn: Any, steps: int, delay: int,
                      seed: int = 0) -> dict[str, torch.Tensor]:
    """Oracle: whole-model ``W(t+1) = step(W(t), grad f_t(W(max(0, t - delay))))`` in one process.

    ``delay = 1`` is PipeDream-2BW's rule, ``K - 1`` the K-version bounded buffer, 0 plain training.
    """
    torch.manual_seed(seed)
    model = model_fn()
    shadow = copy.deepcopy(model)
    opt = opt_fn(model.parameters())
    hist = [copy.deepcopy(model.state_dict())]
    it = iter(data_fn())
    for t in range(steps):
        x, y = next(it)
        shadow.load_state_dict(hist[max(0, t - delay)])
        shadow.zero_grad()
        loss_fn(shadow(x), y).backward()
        for p, q in zip(model.parameters(), shadow.parameters()):
            p.grad = q.grad.clone()
        opt.step()
        hist.append(copy.deepcopy(model.state_dict()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Lin2(nn.Module):
    """``w2 * (w1 * x)`` with w1 = w2 = 0.5: small enough to follow by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.l1.weight.fill_(0.5)
            self.l2.weight.fill_(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.l1(x))


def lin_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for x, y in ((1.0, 1.0), (2.0, 1.0), (1.0, 2.0)):
        yield torch.tensor([[x]]), torch.tensor([[y]])


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2 / 2).mean()
