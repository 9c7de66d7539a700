"""A schedule's workers as tensor-parallel groups: each worker's degree and its members' numbers.

A schedule worker whose stages have tensor degree ``t`` is a group of ``t`` members that execute its
action list together. Invariants: every stage of one worker has one degree; the group's *leader*
keeps the worker's number, and the other members are numbered after every worker's, group by group
in worker order. The runtime numbers its processes this way and the simulator its trace's rows, so
a simulated group and a measured one draw alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Schedule


def worker_degrees(plan: Plan, schedule: Schedule) -> list[int]:
    """The tensor degree of each schedule worker (``ValueError`` if one hosts stages of two degrees)."""
    out = []
    for w in range(schedule.num_workers):
        ts = sorted({plan.stages[s].tensor for s in schedule.stages_of(w)}) or [1]
        if len(ts) > 1:
            raise ValueError(f"worker {w} hosts stages {list(schedule.stages_of(w))} of tensor degrees {ts}; "
                             "the stages of one worker need one degree (one group runs them all)")
        out.append(ts[0])
    return out


def member_numbers(degrees: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Per schedule worker, its group's member numbers, leader (the worker's own number) first."""
    nxt = len(degrees)
    out = []
    for w, t in enumerate(degrees):
        out.append((w, *range(nxt, nxt + t - 1)))
        nxt += t - 1
    return tuple(out)
