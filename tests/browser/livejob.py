"""The small training job that the browser notebook runs on 2 gloo processes.

Worker processes unpickle these functions by module name, so they live in an importable module
beside the notebook (a notebook's own functions cannot be sent to spawned processes). ``data``
sleeps a little per minibatch so the job lasts a few seconds and the live Gantt visibly fills in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

from pipelab.models.demo import mlp

NUM_LAYERS = 7          # 4 Linear + 3 ReLU: the layers torch.fx sees in mlp(depth=4)
BATCH = 16
PAUSE_S = 0.15          # per minibatch, in every worker's data loader: the job streams for seconds


def model() -> nn.Module:
    """A 4-layer MLP with fixed initial weights."""
    torch.manual_seed(0)
    return mlp(in_features=32, hidden=64, depth=4, out_features=10)


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic random minibatches (the same in every worker), paced by ``PAUSE_S``."""
    g = torch.Generator().manual_seed(0)
    for _ in range(100_000):
        x = torch.randn(BATCH, 32, generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)
        time.sleep(PAUSE_S)
        yield x, y


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy."""
    return nn.functional.cross_entropy(out, y)


def sgd(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    """Plain SGD."""
    return torch.optim.SGD(params, lr=0.05)
