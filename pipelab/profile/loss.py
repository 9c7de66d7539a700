"""The loss's costs: its forward and backward seconds and the bytes it saves for its backward.

The runtime's last stage computes the loss inside its forward (``loss_fn(output, target)``), so
the loss's time is part of that stage's compute and what autograd saves for the loss's backward (a
cross-entropy's log-softmax of the logits, the targets it reads; a mean squared error's output and
targets) is held with the stage's activations until its backward.
:func:`pipelab.profile.measure.profile` adds the times to the last layer and records the bytes as
``Profile.loss_saved_bytes``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from pipelab.profile.hooks import SavedBytes, Timer


@dataclass(frozen=True)
class LossCosts:
    """Median seconds of the loss's forward and backward, and the bytes it saves for its backward."""

    fwd_s: float
    bwd_s: float
    saved_bytes: int


def _leaf(out: Any) -> Any:
    # a new autograd leaf on the same storage: the loss's saved tensors can be matched to the output
    return fx.node.map_aggregate(out, lambda t: t.detach().requires_grad_() if isinstance(t, torch.Tensor)
                                 and t.is_floating_point() else t)


def measure_loss(loss_fn: Callable[..., torch.Tensor], output: Any, target: Any = None, *,
                 params: set[int] | frozenset[int] = frozenset(),
                 output_values: dict[int, str] | None = None,
                 counted: set[str] | frozenset[str] = frozenset(), timer: Timer | None = None,
                 warmup: int = 1, repeats: int = 3) -> LossCosts:
    """Time ``loss_fn`` on the model's ``output`` and count what it saves for its backward.

    The loss is ``loss_fn(output, target)`` when ``target`` is given (the function ``pl.train`` takes),
    else ``loss_fn(output)``. Saved bytes are the unique storages autograd saves while computing it,
    weights (storage addresses ``params``) excluded. A saved model output (``output_values``: its
    storage addresses -> value names) counts unless a layer's saved bytes count that value already
    (``counted``), so that each stored tensor is counted once; the targets count by their own size (a
    compact copy of them is used). One untimed run counts, then
    ``warmup`` untimed and ``repeats`` timed runs; times are medians.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    # a compact copy: targets sliced from a larger tensor would count that tensor's whole storage
    target = fx.node.map_aggregate(target, lambda t: t.clone() if isinstance(t, torch.Tensor) else t)

    def call(out: Any) -> torch.Tensor:
        loss = loss_fn(out) if target is None else loss_fn(out, target)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = type(loss).__name__ if not isinstance(loss, torch.Tensor) else f"shape {tuple(loss.shape)}"
            raise ValueError(f"loss_fn must return a scalar tensor, got {got}")
        return loss

    counter = SavedBytes(set(params), dict(output_values or {}))
    try:
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            loss = call(_leaf(output))
    except TypeError as exc:
        how = "loss_fn(output)" if target is None else "loss_fn(output, target)"
        hint = ("; pass target= (one minibatch's targets) to call it as loss_fn(output, target), as "
                "pl.train does") if target is None else ""
        raise ValueError(f"{how} failed: {exc}{hint}") from None
    saved = counter.total + sum(n for v, n in counter.saved_inputs.items() if v not in counted)
    del loss, counter
    tm = timer or Timer(torch.device("cpu"))
    fwd: list[float] = []
    bwd: list[float] = []
    for r in range(warmup + repeats):
        leaf = _leaf(output)
        t0 = tm.start()
        loss = call(leaf)
        f = tm.stop(t0)
        t0 = tm.start()
        if loss.requires_grad:
            loss.backward()
        b = tm.stop(t0)
        if r >= warmup:
            fwd.append(f)
            bwd.append(b)
    return LossCosts(statistics.median(fwd), statistics.median(bwd), saved)


__all__ = ["LossCosts", "measure_loss"]
