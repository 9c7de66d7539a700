"""The opt-in host-effects layer (docs/cost_model.md): a busy sender's late message, per message.

Invariants: a neutral record gives the core's events exactly, and no term makes an action shorter.
"""

from __future__ import annotations

from pipelab.measured import HostEffects
from pipelab.schedules.dataflow import Costs, Delegating


class HostCosts(Delegating):
    """``base``'s core costs plus ``host``'s per-message effect."""

    def __init__(self, base: Costs, host: HostEffects) -> None:
        super().__init__(base)
        self.host = host

    def busy_sender_s(self, src: int) -> float:
        """How late a message leaves when its sender computes on at once."""
        return self.host.busy_sender_s
