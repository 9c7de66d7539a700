"""Crossing sends: an action that sends to a worker while that worker's own message to it leaves.

On pipelab's gloo runtime on a machine with as many busy compute threads as cores, an action whose
message crosses one in the opposite direction on the same pair of workers takes longer, often by a
scheduler slice (measured on 2 cores, the CNN's ``1f1b-flush``: the last stage's backward 3.1 ms
median when the first stage's activation left during it, 0.29 ms otherwise; ``gpipe``, whose two
directions never overlap, never crosses; ``reproductions/sim_accuracy/README.md``).

:func:`crossed_actions` says which actions of a trace crossed, by one rule for a measured and a
simulated trace: an ``F``/``B`` whose output goes to another worker, during which (start to end,
inclusive) an action of that worker whose output comes back to this one ended (who sends what to whom:
:func:`pipelab.schedules.messages.sent_by`).
:func:`pipelab.calibrate.message_overhead` measures the extra on a real run with it
(``Calibration.message_s["cross"]``), and the simulator adds it to the actions a first pass finds
crossed (:class:`Stalled`), then simulates again.

Arrivals: a message that arrives while its receiver computes costs that action time too (gloo's I/O
thread, pinned to the receiver's core, takes the bytes in), whatever the action sends. Measured on
2 cores in real runs: the CNN's ``1f1b-flush`` stage-0 ``B`` 801 against 582 us, stage-1 ``F`` 580
against 379 us, a ``U`` 503 against 375 us in ``pipedream`` (medians, with against without an arrival
during the action). :func:`arrived_actions` says which actions of a trace had one (by the same clock
as the crossings: the sending action's end); the calibration measures the extra
(``Calibration.message_s["arrive"]``) and :class:`Stalled` adds it to arrivals that did not cross.
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
    """``(worker, action)`` of every sending ``F``/``B`` in ``events`` (objects with ``worker``,
    ``stage``, ``kind``, ``microbatch``, ``start_s``, ``end_s``: a trace's compute events) during which
    the worker it sends to finished an action that sends back to it (module docstring)."""
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
    """``(worker, action)`` of every compute action in ``events`` (``F``, ``B``, ``W``, ``U``; objects as
    for :func:`crossed_actions`) during which (after its start, up to its end) another worker's action
    that sends to this worker ended: a message arrived while it computed (module docstring)."""
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


class NoStalls:
    """Mixin for costs whose durations already hold what crossings and arrivals cost (a second pass,
    a replay with measured durations): no further stall, for any schedule."""

    def crossing_s(self) -> float:
        """Already in the durations: no stall."""
        return 0.0

    def crossing_for(self, method: str) -> float:
        """Already in the durations: no stall, for any schedule."""
        return 0.0

    def arrival_s(self) -> float:
        """Already in the durations: no extra."""
        return 0.0


class Stalled(NoStalls, Delegating):
    """``base``'s costs, with ``extra`` seconds added to each ``(worker, action)`` of ``crossed`` and
    ``arrive_extra`` to each of ``arrived`` that is not also crossed."""

    def __init__(self, base: Costs, crossed: set[tuple[int, Action]], extra: float,
                 arrived: set[tuple[int, Action]] | None = None, arrive_extra: float = 0.0) -> None:
        super().__init__(base)
        self.crossed, self.extra = crossed, float(extra)
        self.arrived, self.arrive_extra = (arrived or set()), float(arrive_extra)

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """The base cost, plus the stall when this action crossed, else the arrival's extra when a
        message arrived during it."""
        t = self.base.compute(worker, action, split)
        if (worker, action) in self.crossed:
            return t + self.extra
        return t + self.arrive_extra if (worker, action) in self.arrived else t


__all__ = ["NoStalls", "Stalled", "arrived_actions", "crossed_actions"]
