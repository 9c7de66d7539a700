"""Duty cycle: a worker that computes only part of the time computes slower than a busy one.

A profile times each layer on a core kept busy. Inside a pipeline, a worker waits between its
actions (fill and drain, a slower neighbour, a message, an all-reduce), and on a virtual machine
or a CPU with frequency scaling a core that keeps going idle computes slower when it wakes:
measured on this project's 2-core VM, the digits CNN's forward and backward took 22-25% longer
with the core busy a third of the time, the same ratio data parallelism's replicas showed inside
a run against the profile (``reproductions/sim_accuracy/README.md``).

:func:`pipelab.calibrate.probes.duty_cycle` measures the factor against the duty
(``Calibration.duty_slowdown``), :meth:`Costs.duty_factor <pipelab.schedules.dataflow.Costs.duty_factor>`
reads it, and the simulator (:func:`pipelab.sim.simulate.simulate_schedule`) finds each worker's
utilization with a first pass, scales that worker's compute by its factor (:class:`Scaled`) and
simulates again, until the factors settle (:func:`settle`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pipelab.metrics as metrics
from pipelab.schedules.actions import Action
from pipelab.schedules.dataflow import Costs, Delegating

#: at most this many passes after the first; the factors settle in three to five (each pass's
#: utilization moves the next factor less than the one before: the factor falls as utilization rises)
MAX_PASSES = 6
#: stop when no worker's factor moved by more than this (relative)
TOLERANCE = 0.002


def utilization(events: Sequence[Any], workers: int) -> dict[int, float]:
    """Per worker ``0..workers-1``, the fraction of the run (time 0 to the last event's end) it spent
    in compute actions (:func:`pipelab.metrics.busy_time`); ``events`` have ``worker``, ``kind``,
    ``start_s``, ``end_s``."""
    end = max((e.end_s for e in events), default=0.0)
    busy = metrics.busy_time(events, range(workers))
    return {w: (b / end if end > 0 else 1.0) for w, b in busy.items()}


class Scaled(Delegating):
    """``base``'s costs with each worker's compute multiplied by ``factors[worker]`` (default 1)."""

    def __init__(self, base: Costs, factors: dict[int, float]) -> None:
        super().__init__(base)
        self.factors = dict(factors)

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """The base cost times the worker's factor."""
        return self.base.compute(worker, action, split) * self.factors.get(worker, 1.0)

    def duty_factor(self, worker: int, utilization: float) -> float:
        """Already applied: 1."""
        return 1.0


def settle(costs: Costs, workers: int, first: list[Any],
           run: Callable[[Costs], list[Any]]) -> tuple[Costs, list[Any], dict[int, float]]:
    """The costs, events and per-worker factors once each worker's compute is scaled by
    ``costs.duty_factor`` of the utilization it has under those very factors.

    ``first`` is the events of a pass with ``costs`` as they are; ``run(c)`` simulates under ``c``.
    Each pass takes the factors of the previous pass's utilization; with no effect (every factor 1)
    nothing runs again."""
    events = first
    factors = dict.fromkeys(range(workers), 1.0)
    scaled: Costs = costs
    for _ in range(MAX_PASSES):
        util = utilization(events, workers)
        new = {w: costs.duty_factor(w, u) for w, u in util.items()}
        if all(abs(new[w] - factors[w]) <= TOLERANCE * factors[w] for w in new):
            break
        factors = new
        scaled = Scaled(costs, factors)
        events = run(scaled)
    return scaled, events, factors


__all__ = ["Scaled", "settle", "utilization"]
