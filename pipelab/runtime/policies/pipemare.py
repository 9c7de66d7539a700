"""PipeMare's weight policy (Yang et al., MLSys'21); the math is :mod:`pipelab.runtime.pipemare_math`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipelab.runtime.pipemare_math import PipeMareConfig, PipeMareState
from pipelab.runtime.policies.base import NoStash
from pipelab.schedules.worker_view import StageReads


class PipeMarePolicy(NoStash):
    """PipeMare: no stash; B recomputes with T2's corrected weights; the step size follows T1."""

    name = "pipemare"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, reads: StageReads | None = None, *,
                 tau_fwd: int, tau_bwd: int, config: PipeMareConfig) -> None:
        super().__init__(params, stage, reads)
        self.state = PipeMareState([p for p in params.values()], tau_fwd, tau_bwd, config)
        self._in_backward: int | None = None
        self._corrected: dict[str, torch.Tensor] | None = None
        self._base_lrs: list[float] | None = None
        self.steps = 0

    def backward_version(self, microbatch: int) -> int:
        """The newest version, as the schedule says; B will read the corrected weights derived from it."""
        v = super().backward_version(microbatch)
        self._in_backward = microbatch
        self._corrected = None
        return v

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """Master weights in F; T2's corrected weights (one set per backward) in B."""
        if self._in_backward is None or not self.state.config.discrepancy_correction \
                or self.state.tau_fwd == self.state.tau_bwd:
            return None
        if self._corrected is None:
            names = list(self.params)
            corr = self.state.backward_params([self.params[n] for n in names])
            self._corrected = {n: c.requires_grad_(self.params[n].requires_grad) for n, c in zip(names, corr)}
        return self._corrected

    def backward_done(self, microbatch: int) -> None:
        """Drop the corrected weights of this backward."""
        self._in_backward = None
        self._corrected = None
        super().backward_done(microbatch)

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Set this step's learning rate: base * tau ** -(1 - min(k / K, 1)) (T1)."""
        if self._base_lrs is None:
            self._base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        f = self.state.lr_factor(self.steps)
        for g, base in zip(optimizer.param_groups, self._base_lrs):
            g["lr"] = base * f

    def about_to_update(self) -> None:
        """First half of the delta EMA: delta <- gamma * delta - (1 - gamma) * w_before (no copy kept)."""
        g = self.state.gamma
        with torch.no_grad():
            for d, p in zip(self.state.delta, self.params.values()):
                d.mul_(g).sub_(p.detach(), alpha=1.0 - g)

    def updated(self) -> None:
        """Second half: delta += (1 - gamma) * w_after; count the step."""
        g = self.state.gamma
        with torch.no_grad():
            for d, p in zip(self.state.delta, self.params.values()):
                d.add_(p.detach(), alpha=1.0 - g)
        self.steps += 1
        super().updated()

    def state_dict(self) -> dict[str, Any]:
        """Delta EMA, step count and base learning rates (the optimizer's saved lr is a scaled one)."""
        return {"pipemare": self.state.state_dict(), "steps": self.steps, "base_lrs": self._base_lrs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state["pipemare"])
        self.steps = int(state["steps"])
        self._base_lrs = state["base_lrs"]

    def weight_bytes(self) -> int:
        """Master weights plus the delta buffer (PipeMare's one extra weight-sized buffer)."""
        return sum(p.numel() * p.element_size() for p in self.params.values()) * 2
