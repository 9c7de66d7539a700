"""Non-finite values stop a run: checks of a microbatch's loss, a stage's gradients, a checkpoint.

The last stage checks each loss after ``F``; every stage checks its gradients before ``U`` (after
the all-reduce, so replicas decide alike). ``on_nonfinite``: ``"raise"`` (a
:class:`NonFiniteError` naming step, stage and action), ``"warn"``, or ``"skip"`` the update.
Invariants: a non-finite checkpoint is never sealed; losses are JSON with ``null``, never ``NaN``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

ON_NONFINITE = ("raise", "warn", "skip")


class NonFiniteError(RuntimeError):
    """A loss, gradient or saved weight is NaN or infinite (``on_nonfinite="raise"``)."""


def warn(text: str) -> None:
    """Issue ``text`` as a ``RuntimeWarning`` (what a worker does unless its driver forwards warnings)."""
    warnings.warn(text, RuntimeWarning, stacklevel=3)


def _what(t: torch.Tensor) -> str:
    """``nan``, ``inf`` or ``-inf``: the first non-finite value of ``t``."""
    bad = t.detach().reshape(-1)[~torch.isfinite(t.detach().reshape(-1))]
    return str(float(bad[0])) if bad.numel() else "finite"


def check_loss(loss: torch.Tensor, *, step: int, stage: int, action: str, mode: str,
               warn: Callable[[str], None]) -> None:
    """Raise or warn (per ``mode``) if the scalar ``loss`` of ``action`` at ``step`` is not finite."""
    if math.isfinite(loss.item()) if loss.numel() == 1 else bool(torch.isfinite(loss.detach()).all()):
        return
    msg = f"loss is {_what(loss)} at step {step} (stage {stage}, action {action})"
    if mode == "raise":
        raise NonFiniteError(msg)
    warn(msg + ("; its update is skipped" if mode == "skip" else "; training goes on (on_nonfinite='warn')"))


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every value of ``tensors`` is finite: one fused pass per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t.detach())
    for (device, dtype), ts in groups.items():
        if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            if not all(bool(torch.isfinite(t).all()) for t in ts):
                return False
            continue
        found = torch.zeros(1, device=device)
        # AMP's check multiplies by an exact 1.0: the values are unchanged, ``found`` turns 1 on a NaN or inf
        torch._amp_foreach_non_finite_check_and_unscale_(ts, found, torch.ones(1, device=device))
        if found.item() != 0:
            return False
    return True


def check_grads(grads: Sequence[torch.Tensor], *, step: int, stage: int, action: str, mode: str,
                warn: Callable[[str], None]) -> bool:
    """Whether the update of ``action`` may step (``False``: skip it); raises or warns per ``mode``."""
    if not grads or all_finite(grads):
        return True
    bad = next(g for g in grads if not bool(torch.isfinite(g).all()))
    msg = f"gradient is {_what(bad)} at step {step} (stage {stage}, action {action})"
    if mode == "raise":
        raise NonFiniteError(msg)
    warn(msg + ("; the update is skipped (on_nonfinite='skip')" if mode == "skip" else
                "; training goes on (on_nonfinite='warn')"))
    return mode != "skip"


def nonfinite_tensors(state: Any, prefix: str = "") -> list[str]:
    """Paths of the floating-point tensors in a nested dict/list ``state`` that hold a NaN or inf."""
    out: list[str] = []
    if isinstance(state, torch.Tensor):
        if (state.is_floating_point() or state.is_complex()) and not bool(torch.isfinite(state).all()):
            out.append(prefix or "tensor")
    elif isinstance(state, dict):
        for k, v in state.items():
            out += nonfinite_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out += nonfinite_tensors(v, f"{prefix}[{i}]")
    return out


def json_losses(losses: Iterable[float]) -> tuple[list[float | None], list[int]]:
    """Losses for JSON (``None`` where not finite) and the steps that were not finite."""
    vals = [float(x) for x in losses]
    bad = [k for k, x in enumerate(vals) if not math.isfinite(x)]
    return [x if math.isfinite(x) else None for x in vals], bad
