"""Crossing sends: an action that sends to a worker while that worker's own message to it leaves.

Where gloo's I/O threads share the cores with compute, an action whose message crosses one in the
opposite direction on the same pair of workers can take longer (GPipe never crosses). A host effect
(:class:`pipelab.measured.HostEffects`), applied only where asked
(:mod:`pipelab.sim.host_effects`). :func:`crossed_actions` says which actions of a trace crossed, by
one rule for measured and simulated traces: an ``F``/``B`` whose output goes to another worker,
during which (inclusive) an action of that worker whose output comes back ended; :class:`Stalled`
adds the measured extra to them. :func:`arrived_actions` says which actions had a message arrive
while they computed, so that the calibration leaves them out of the quiet actions it compares with.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from pipelab.metrics import COMPUTE_KINDS
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import Costs, Delegating
from pipelab.schedules.messages import sent_by


def _sending(schedule: Schedule, events: Iterable[Any]) -> list[tuple[int, int, Action, float, float]]:
    """``(worker, destination, action, start, end)`` of every ``F``/``B`` of ``events`` that sends a
    message to another worker (:func:`pipelab.schedules.messages.sent_by`)."""
    out = []
    for e in events:
        if e.kind not in ("F", "B"):
            continue
        a = Action(e.stage, e.kind, e.microbatch)
        sent = sent_by(schedule, e.worker, a)
        if sent is not None:
            out.append((e.worker, sent[0], a, e.start_s, e.end_s))
    return out


def crossed_actions(schedule: Schedule, events: Iterable[Any]) -> set[tuple[int, Action]]:
    """``(worker, action)`` of every sending ``F``/``B`` in ``events`` (a trace's compute events) during
    which the worker it sends to finished an action that sends back to it."""
    acts = _sending(schedule, events)
    sends: dict[tuple[int, int], list[float]] = {}     # (src, dst) -> end times of src's sending actions
    for w, dst, _, _, end in acts:
        sends.setdefault((w, dst), []).append(end)
    for v in sends.values():
        v.sort()
    out: set[tuple[int, Action]] = set()
    for w, dst, a, start, end in acts:
        back = sends.get((dst, w))
        if back:
            i = bisect.bisect_left(back, start)
            if i < len(back) and back[i] <= end:
                out.add((w, a))
    return out


def arrived_actions(schedule: Schedule, events: Iterable[Any]) -> set[tuple[int, Action]]:
    """``(worker, action)`` of every compute action in ``events`` during which (after its start, up to
    its end) another worker's action that sends to this worker ended."""
    evs = list(events)
    arrivals: dict[int, list[float]] = {}     # dst -> end times of the actions sending to it
    for _, dst, _, _, end in _sending(schedule, evs):
        arrivals.setdefault(dst, []).append(end)
    for v in arrivals.values():
        v.sort()
    out: set[tuple[int, Action]] = set()
    for e in evs:
        ends = arrivals.get(e.worker)
        if e.kind in COMPUTE_KINDS and ends:
            i = bisect.bisect_right(ends, e.start_s)
            if i < len(ends) and ends[i] <= e.end_s:
                out.add((e.worker, Action(e.stage, e.kind, e.microbatch)))
    return out


class Stalled(Delegating):
    """``base``'s costs, with ``extra`` seconds added to each ``(worker, action)`` of ``crossed``."""

    def __init__(self, base: Costs, crossed: set[tuple[int, Action]], extra: float) -> None:
        super().__init__(base)
        self.crossed, self.extra = crossed, float(extra)

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """The base cost, plus the stall when this action crossed."""
        t = self.base.compute(worker, action, split)
        return t + self.extra if (worker, action) in self.crossed else t
