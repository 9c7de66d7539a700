"""Duty cycle: a worker that computes only part of the time computes slower than a busy one.

A profile times each layer on a core kept busy. Inside a pipeline, a worker waits between its
actions (fill and drain, a slower neighbour, a message, an all-reduce), and on a virtual machine
or a CPU with frequency scaling a core that keeps going idle may compute slower when it wakes. That
is a host effect (:class:`pipelab.calibration.HostEffects`), applied only where asked.

:func:`pipelab.calibrate.probes.duty_cycle` measures the factor against the duty
(``HostEffects.duty_slowdown``), and the host-effects layer (:mod:`pipelab.sim.host_effects`) finds
each worker's utilization with a first pass, scales that worker's compute by its factor
(:class:`Scaled`) and simulates again, until the factors settle (:func:`settle`).
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


def settle(costs: Costs, workers: int, first: list[Any], run: Callable[[Costs], list[Any]],
           factor: Callable[[float], float]) -> tuple[Costs, list[Any], dict[int, float]]:
    """The costs, events and per-worker factors once each worker's compute is scaled by
    ``factor`` of the utilization it has under those very factors.

    ``first`` is the events of a pass with ``costs`` as they are; ``run(c)`` simulates under ``c``;
    ``factor(u)``: how much longer compute takes at utilization ``u`` (``HostEffects.duty_factor``).
    Each pass takes the factors of the previous pass's utilization; with no effect (every factor 1)
    nothing runs again."""
    events = first
    factors = dict.fromkeys(range(workers), 1.0)
    scaled: Costs = costs
    for _ in range(MAX_PASSES):
        util = utilization(events, workers)
        new = {w: factor(u) for w, u in util.items()}
        if all(abs(new[w] - factors[w]) <= TOLERANCE * factors[w] for w in new):
            break
        factors = new
        scaled = Scaled(costs, factors)
        events = run(scaled)
    return scaled, events, factors


__all__ = ["Scaled", "settle", "utilization"]
