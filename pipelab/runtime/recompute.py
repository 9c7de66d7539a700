"""Recompute (activation checkpointing) that leaves a stage's buffers as one forward would.

Under ``recompute`` a stage keeps only its inputs and runs its forward again in backward
(``torch.utils.checkpoint``). A layer that writes a buffer in its forward (BatchNorm's running mean,
variance and ``num_batches_tracked``) would then write it twice per microbatch. Invariant: the buffers
after a recomputed forward are those before it, so a run with ``recompute=True`` ends with the same
buffers as one without (the recomputed forward reads the same inputs, and a training-mode BatchNorm
normalises with the microbatch's own statistics, never its running ones).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def checkpointed(fn: Callable[..., Any], inputs: tuple[Any, ...],
                 buffers: Sequence[torch.Tensor] = ()) -> Any:
    """``fn(*inputs)`` under ``torch.utils.checkpoint``; the recomputation restores ``buffers``."""
    from torch.utils.checkpoint import checkpoint

    calls = [0]

    def once(*xs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1 or not buffers:
            return fn(*xs)
        saved = [b.detach().clone() for b in buffers]
        try:        # also when the recomputation stops early (checkpoint's early stop raises)
            return fn(*xs)
        finally:
            with torch.no_grad():
                for b, v in zip(buffers, saved):
                    b.copy_(v)

    return checkpoint(once, *inputs, use_reentrant=False)
