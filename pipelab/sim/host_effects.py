"""The opt-in host-effects layer (docs/cost_model.md): a busy sender's late message, per message, and
a last pass adding the crossing stall to the actions a first pass finds crossed.

Invariants: a neutral record gives the core's events exactly, and no term makes an action shorter.
"""

from __future__ import annotations

import pipelab.metrics as metrics
from pipelab.measured import HostEffects
from pipelab.schedules.actions import Schedule
from pipelab.schedules.crossing import Stalled, crossed_actions
from pipelab.schedules.dataflow import Costs, Delegating, run
from pipelab.trace import Event


class HostCosts(Delegating):
    """``base``'s core costs plus ``host``'s per-message effect."""

    def __init__(self, base: Costs, host: HostEffects) -> None:
        super().__init__(base)
        self.host = host

    def busy_sender_s(self, src: int) -> float:
        """How late a message leaves when its sender computes on at once."""
        return self.host.busy_sender_s


def run_with(schedule: Schedule, costs: Costs, host: HostEffects) -> list[Event]:
    """The events of ``schedule`` under ``costs`` with ``host``'s crossing pass."""
    events = run(schedule, costs)
    stall = host.crossing_s(interleaved=schedule.num_stages > schedule.num_workers)
    if stall > 0:
        crossed = crossed_actions(schedule, metrics.compute_events(events))
        if crossed:
            events = run(schedule, Stalled(costs, crossed, stall))
    return events
