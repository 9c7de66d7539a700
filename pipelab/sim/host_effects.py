"""The opt-in host-effects layer (docs/cost_model.md): a last pass adding the crossing stall to the
actions a first pass of the core model finds crossed.

Invariants: a neutral record gives the core's events exactly, and no term makes an action shorter.
"""

from __future__ import annotations

import pipelab.metrics as metrics
from pipelab.measured import HostEffects
from pipelab.schedules.actions import Schedule
from pipelab.schedules.crossing import Stalled, crossed_actions
from pipelab.schedules.dataflow import Costs, run
from pipelab.trace import Event


def run_with(schedule: Schedule, costs: Costs, host: HostEffects) -> list[Event]:
    """The events of ``schedule`` under ``costs`` with ``host``'s crossing pass."""
    events = run(schedule, costs)
    stall = host.crossing_s(interleaved=schedule.num_stages > schedule.num_workers)
    if stall > 0:
        crossed = crossed_actions(schedule, metrics.compute_events(events))
        if crossed:
            events = run(schedule, Stalled(costs, crossed, stall))
    return events


__all__ = ["HostEffects", "run_with"]
