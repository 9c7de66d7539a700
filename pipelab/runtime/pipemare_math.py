"""PipeMare's two techniques (Yang et al., arXiv 1910.05124, MLSys 2021, §3) as pure functions.

- T1: stage ``i``'s step size at step ``k`` is the base times ``tau_i ** -(1 - min(k / K, 1))``.
- T2: backward runs on ``u = w - (tau_fwd - tau_bwd) * delta``, where
  ``delta <- gamma * delta + (1 - gamma) * (w_new - w_old)``.

Delays ``tau`` are in optimizer steps, read from the schedule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch


# ---------------------------------------------------------------------- T1: learning-rate rescheduling
def lr_scale(tau: float, step: int, warmup_steps: int) -> float:
    """T1's factor ``tau ** -(1 - min(step / warmup_steps, 1))`` (``tau < 1`` counts as 1; 0 warm-up: off)."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 0 (0 turns rescheduling off)")
    if warmup_steps == 0:
        return 1.0
    return max(float(tau), 1.0) ** -(1.0 - min(step / warmup_steps, 1.0))


# ---------------------------------------------------------------------- T2: discrepancy correction
def ema_delta(delta: torch.Tensor, w_new: torch.Tensor, w_old: torch.Tensor, gamma: float) -> torch.Tensor:
    """One step of the moving average of weight changes: ``gamma * delta + (1 - gamma) * (w_new - w_old)``."""
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"decay gamma={gamma} must be in [0, 1)")
    return gamma * delta + (1.0 - gamma) * (w_new - w_old)


def corrected_weights(w: torch.Tensor, delta: torch.Tensor, tau_fwd: float, tau_bwd: float) -> torch.Tensor:
    """Backward weights ``w - (tau_fwd - tau_bwd) * delta`` (PipeMare T2, arXiv 1910.05124 §3)."""
    return w - (float(tau_fwd) - float(tau_bwd)) * delta


def decay_for_delay(D: float, tau: float) -> float:
    """``gamma = D ** (1 / tau)``: the averaging decays to ``D`` over one delay window (``tau >= 1``)."""
    if not 0.0 <= D < 1.0:
        raise ValueError(f"D={D} must be in [0, 1)")
    return D ** (1.0 / max(float(tau), 1.0))


# ---------------------------------------------------------------------- per-stage state
@dataclass
class PipeMareConfig:
    """PipeMare's switches: ``warmup_steps`` is T1's ``K``, ``decay`` T2's ``gamma``."""

    lr_reschedule: bool = True
    discrepancy_correction: bool = True
    warmup_steps: int = 100
    decay: float = 0.5
    decay_from_delay: bool = False


class PipeMareState:
    """One stage's delta EMA and learning-rate factor: per step ``lr_factor(step)`` before,
    ``observe(before, after)`` after; ``backward_params`` for B."""

    def __init__(self, params: Iterable[torch.Tensor], tau_fwd: int, tau_bwd: int,
                 config: PipeMareConfig | None = None) -> None:
        self.config = config or PipeMareConfig()
        self.tau_fwd = int(tau_fwd)
        self.tau_bwd = int(tau_bwd)
        if self.tau_fwd < self.tau_bwd:
            raise ValueError(f"tau_fwd={tau_fwd} < tau_bwd={tau_bwd}: a backward cannot read older "
                             "weights than its forward")
        c = self.config
        self.gamma = decay_for_delay(c.decay, self.tau_fwd) if c.decay_from_delay else float(c.decay)
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"PipeMare decay={c.decay} must be in [0, 1)")
        self.delta = [torch.zeros_like(p, memory_format=torch.preserve_format).detach() for p in params]

    def lr_factor(self, step: int) -> float:
        """T1 factor for this stage at optimizer step ``step`` (1.0 when rescheduling is off)."""
        if not self.config.lr_reschedule:
            return 1.0
        return lr_scale(self.tau_fwd, step, self.config.warmup_steps)

    @torch.no_grad()
    def observe(self, before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> None:
        """Fold one optimizer step's weight change into the delta EMA."""
        if len(before) != len(self.delta) or len(after) != len(self.delta):
            raise ValueError("observe() needs one tensor per parameter of the stage")
        for d, a, b in zip(self.delta, after, before):
            d.copy_(ema_delta(d, a, b, self.gamma))

    @torch.no_grad()
    def backward_params(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """T2's corrected weights for the backward pass (the params themselves when T2 is off)."""
        if not self.config.discrepancy_correction or self.tau_fwd == self.tau_bwd:
            return [p.detach() for p in params]
        return [corrected_weights(p.detach(), d, self.tau_fwd, self.tau_bwd)
                for p, d in zip(params, self.delta)]

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint needs to resume this state exactly."""
        return {"tau_fwd": self.tau_fwd, "tau_bwd": self.tau_bwd, "gamma": self.gamma,
                "delta": [d.clone() for d in self.delta]}

    def load_state_dict(self, sd: Mapping[str, object]) -> None:
        delta = sd["delta"]
        assert isinstance(delta, list)
        if len(delta) != len(self.delta):
            raise ValueError(f"checkpointed PipeMare state has {len(delta)} tensors, this stage has "
                             f"{len(self.delta)}; it belongs to another model or plan")
        for d, s in zip(self.delta, delta):
            d.copy_(s)
        self.tau_fwd = int(sd["tau_fwd"])  # type: ignore[call-overload]
        self.tau_bwd = int(sd["tau_bwd"])  # type: ignore[call-overload]
        self.gamma = float(sd["gamma"])  # type: ignore[arg-type]
