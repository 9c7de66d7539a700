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


def check_grads(grads: Sequence[torch.Tensor], *, step: int, stage: int, action: str, mode: str,
                warn: Callable[[str], None]) -> bool:
    """Whether the update of ``action`` may step (``False``: skip it); raises or warns per ``mode``."""
    finite = torch.stack([torch.isfinite(g).all() for g in grads]) if grads else None
    if finite is None or bool(finite.all()):
        return True
    bad = next(g for g, ok in zip(grads, finite.tolist()) if not ok)
    msg = f"gradient is {_what(bad)} at step {step} (stage {stage}, action {action})"
    if mode == "raise":
        raise NonFiniteError(msg)
    if mode == "skip":
        warn(msg + "; the update is skipped (on_nonfinite='skip')")
        return False
    warn(msg + "; training goes on (on_nonfinite='warn')")
    return True


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
