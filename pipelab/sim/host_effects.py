"""The opt-in host-effects layer: what one machine adds to the core cost model, applied to a simulation.

The core (:class:`pipelab.sim.simulate.ProfileCosts` over :class:`pipelab.costs.CostModel`) prices
compute, transfers, all-reduce, the optimizer step and memory, and the runtime's own seconds per
action and message: mechanisms every machine has, each with its calibrated value. A
:class:`~pipelab.calibration.HostEffects` record (``Calibration.host_effects``) holds what
:func:`pipelab.calibrate.calibrate` measured on one host beyond them; the simulator applies it only
when asked (``pl.simulate(..., host_effects=True)`` for the calibration's record, or a record of
one's own):

* per action, the weight policies' extra work (:class:`HostCosts`: a forward on a stashed version,
  a stashing ``U``'s new version, PipeMare's ``U`` and ``B``);
* per message, a rendezvous transport (a message moves once its receive is posted,
  ``post_ahead`` actions ahead, then one link latency for the ready notice) and a busy sender's
  late message (:class:`HostCosts`, through the engine's hooks in :mod:`pipelab.schedules.dataflow`);
* per worker, the duty cycle: further passes scale each worker's compute by the factor of its
  utilization until the factors settle (:func:`pipelab.schedules.duty.settle`);
* per action, a last pass adds the crossing stall to the actions a pass finds crossed, and the
  arrival extra to those during which a message arrived (:mod:`pipelab.schedules.crossing`); a
  schedule with virtual stages (more stages than workers) takes ``cross_interleaved_s`` where measured.

Invariants: a neutral record (:attr:`HostEffects.terms` empty) gives the core's events exactly, and
no term makes an action shorter. ``reproductions/sim_accuracy`` reports each term's effect on models
it was never fitted on (``HostEffects.without``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pipelab.metrics as metrics
from pipelab.calibration import HostEffects
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.crossing import Stalled, arrived_actions, crossed_actions
from pipelab.schedules.dataflow import Costs, Delegating, run
from pipelab.schedules.duty import settle
from pipelab.trace import Event

if TYPE_CHECKING:
    from pipelab.sim.simulate import ProfileCosts


class HostCosts(Delegating):
    """``base``'s core costs plus ``host``'s per-action and per-message effects (module docstring).

    ``stashed``: the run's weight policy runs every forward on a stashed version and makes a new one
    at each ``U`` (``pipedream``, ``2bw``); ``pipemare``: the stages whose ``B`` builds corrected weights
    under PipeMare's policy (None: another policy)."""

    def __init__(self, base: ProfileCosts, host: HostEffects, *, stashed: bool = False,
                 pipemare: frozenset[int] | None = None) -> None:
        super().__init__(base)
        self.core = base
        self.host = host
        self.stashed = stashed
        self.pipemare = pipemare
        self._extra: dict[tuple[int, str], float] = {}

    def _stage_extra(self, stage: int, kind: str) -> float:
        """What ``host`` adds to an action of ``kind`` of ``stage`` (cached)."""
        hit = self._extra.get((stage, kind))
        if hit is None:
            a, e = self.core.ranges[stage]
            nbytes, tensors = self.core.model.param_bytes(a, e), self.core.model.param_tensors(a, e)
            h = self.host
            hit = 0.0
            if kind == "F" and self.stashed:
                hit += h.stashed_forward_s(tensors)
            if kind == "U" and self.stashed:
                hit += h.new_version_s(nbytes, tensors)
            if kind == "U" and self.pipemare is not None:
                hit += h.delta_average_s(nbytes, tensors)
            if kind == "B" and self.pipemare and stage in self.pipemare:
                hit += h.corrected_weights_s(nbytes, tensors) + h.stashed_forward_s(tensors)
            self._extra[(stage, kind)] = hit
        return hit

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """The core's seconds plus the weight policy's measured extra work."""
        return self.base.compute(worker, action, split) + self._stage_extra(action.stage, action.kind)

    def post_ahead(self) -> int | None:
        """``HostEffects.post_ahead``: receives posted that many actions ahead (None: no rendezvous)."""
        return self.host.post_ahead

    def busy_sender_s(self, src: int) -> float:
        """``HostEffects.busy_sender_s``: how late a message leaves when its sender computes on at once."""
        return self.host.busy_sender_s

    def rendezvous_s(self, src: int, dst: int) -> float:
        """The receiver's ready notice: one latency of the link."""
        if src == dst:
            return 0.0
        return self.core.model.cluster.link(self.core._w(src), self.core._w(dst)).latency


def run_with(schedule: Schedule, costs: Costs, host: HostEffects) -> list[Event]:
    """The events of ``schedule`` under ``costs`` (a :class:`HostCosts` for the per-action and
    per-message terms) with ``host``'s duty-cycle passes and its crossing and arrival pass."""
    events = run(schedule, costs)
    if host.duty_slowdown:
        costs, events, _ = settle(costs, schedule.num_workers, events, lambda c: run(schedule, c),
                                  host.duty_factor)
    stall = host.crossing_s(interleaved=schedule.num_stages > schedule.num_workers)
    if stall > 0 or host.arrive_s > 0:
        comp = metrics.compute_events(events)
        crossed = crossed_actions(schedule, comp) if stall > 0 else set()
        arrived = arrived_actions(schedule, comp) - crossed if host.arrive_s > 0 else set()
        if crossed or arrived:
            events = run(schedule, Stalled(costs, crossed, stall, arrived, host.arrive_s))
    return events


__all__ = ["HostCosts", "HostEffects", "run_with"]
