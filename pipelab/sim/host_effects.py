"""The opt-in host-effects layer: what one machine adds to the core cost model, applied to a simulation.

The core (:class:`pipelab.sim.simulate.ProfileCosts` over :class:`pipelab.costs.CostModel`) prices
compute, transfers, all-reduce, the optimizer step and memory, and the runtime's own seconds per
action and message: mechanisms every machine has, each with its calibrated value. A
:class:`~pipelab.measured.HostEffects` record (``Calibration.host_effects``) holds what
:func:`pipelab.calibrate.calibrate` measured on one host beyond them; the simulator applies it only
when asked (``pl.simulate(..., host_effects=True)`` for the calibration's record, or a record of
one's own):

* per message, a busy sender's late message (:class:`HostCosts`, through the engine's
  ``busy_sender_s`` hook in :mod:`pipelab.schedules.dataflow`);
* per action, a last pass adds the crossing stall to the actions a pass finds crossed
  (:mod:`pipelab.schedules.crossing`); a schedule with virtual stages (more stages than workers)
  takes ``cross_interleaved_s`` where measured.

Only terms that made the simulator better on models they were never fitted on are here
(``reproductions/sim_accuracy/held_out.py`` measures each term left out; the README keeps the
figures and the terms retired that way).

Invariants: a neutral record (:attr:`HostEffects.terms` empty) gives the core's events exactly, and
no term makes an action shorter.
"""

from __future__ import annotations

import pipelab.metrics as metrics
from pipelab.measured import HostEffects
from pipelab.schedules.actions import Schedule
from pipelab.schedules.crossing import Stalled, crossed_actions
from pipelab.schedules.dataflow import Costs, Delegating, run
from pipelab.trace import Event


class HostCosts(Delegating):
    """``base``'s core costs plus ``host``'s per-message effect (module docstring)."""

    def __init__(self, base: Costs, host: HostEffects) -> None:
        super().__init__(base)
        self.host = host

    def busy_sender_s(self, src: int) -> float:
        """``HostEffects.busy_sender_s``: how late a message leaves when its sender computes on at once."""
        return self.host.busy_sender_s


def run_with(schedule: Schedule, costs: Costs, host: HostEffects) -> list[Event]:
    """The events of ``schedule`` under ``costs`` (a :class:`HostCosts` for the per-message term)
    with ``host``'s crossing pass."""
    events = run(schedule, costs)
    stall = host.crossing_s(interleaved=schedule.num_stages > schedule.num_workers)
    if stall > 0:
        crossed = crossed_actions(schedule, metrics.compute_events(events))
        if crossed:
            events = run(schedule, Stalled(costs, crossed, stall))
    return events


__all__ = ["HostCosts", "HostEffects", "run_with"]
