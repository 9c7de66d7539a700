"""Non-finite values stop a run: the checks of a minibatch's loss, a stage's gradients and a checkpoint.

The last stage checks each microbatch's loss after its ``F``; every stage checks its gradients
before ``U`` (after the replicas' all-reduce, so replicas decide alike). ``on_nonfinite`` says what
a non-finite value does:

* ``"raise"`` (default): the worker raises :class:`NonFiniteError` naming the step, stage and action
  (``loss is nan at step 6 (stage 2, action 2F11)``), which ends the run with a ``WorkerError``.
* ``"warn"``: a warning names them and training goes on with the value.
* ``"skip"``: a stage whose gradients are not finite drops that update (no optimizer step; its
  weights and optimizer state stay as they were, as a loss scaler does), with a warning; a
  non-finite loss is kept in the losses as it is, and its gradients are then the ones dropped.

A checkpoint whose weights or optimizer state hold a non-finite value is never sealed
(:func:`nonfinite_tensors`); so the sealed checkpoints, and with them the one rotation keeps
last, are all finite. Losses are written to JSON with ``null`` for a non-finite value
(:func:`json_losses`), never a bare ``NaN``.
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
    """Whether the update of ``action`` may step: ``False`` to skip it (``mode="skip"``) when a
    gradient is not finite; raises or warns per ``mode``."""
    if not grads:
        return True
    finite = torch.stack([torch.isfinite(g).all() for g in grads])
    if bool(finite.all()):
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
