"""The loss's costs: its forward and backward seconds and the bytes it saves for its backward.

The runtime's last stage computes the loss in its forward, so the profiler adds these times to the
last layer and records the bytes (held with that stage's activations) as ``Profile.loss_saved_bytes``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from pipelab.profile.hooks import SavedBytes, Timer, Timing


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
                 counted: set[str] | frozenset[str] = frozenset(), timing: Timing | None = None) -> LossCosts:
    """Time ``loss_fn(output, target)`` (``loss_fn(output)`` without a target) and count what it saves.

    Saved bytes: unique storages, weights (addresses ``params``) left out, a saved model output
    (``output_values``: address -> value name) left out when a layer counts it already (``counted``).
    """
    tm = timing or Timing(Timer(torch.device("cpu")))
    if not isinstance(tm.repeats, int) or tm.repeats < 1:
        raise ValueError(f"repeats={tm.repeats!r} must be an integer >= 1")
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
    times: list[tuple[float, float]] = []
    for r in range(tm.warmup + tm.repeats):
        leaf = _leaf(output)
        t0 = tm.timer.start()
        loss = call(leaf)
        f = tm.timer.stop(t0)
        t0 = tm.timer.start()
        if loss.requires_grad:
            loss.backward()
        b = tm.timer.stop(t0)
        if r >= tm.warmup:
            times.append((f, b))
    f_med, b_med = (statistics.median(col) for col in zip(*times))
    return LossCosts(f_med, b_med, saved)
