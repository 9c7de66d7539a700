"""The steps every schedule builder composes: plan resolution, the 1F1B order, U insertion.

Version numbering (per stage, per worker): version 0 is the initial weights; the ``k``-th ``U`` of a
stage on a worker produces version ``k``; replicas that all-reduce pair their ``k``-th ``U``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action


class ScheduleError(ValueError):
    """A schedule (or a request to build one) is wrong; the message says where and what to do."""


def resolve_plan(plan: Plan | int) -> Plan:
    """A ``Plan`` as given, or for an int ``P`` a straight ``P``-stage plan with one layer per stage."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, bool) or not isinstance(plan, int) or plan < 1:
        raise ScheduleError(f"plan must be a pipelab Plan or a positive int (stages); got {plan!r}")
    return Plan.even(plan, plan)


def one_f_one_b(mbs: Sequence[int], warm: int, stage: int) -> list[Action]:
    """``warm`` forwards, then alternate one backward and one forward, then the remaining backwards.

    ::

        mbs=[0..5], warm=3:  F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5
    """
    warm = min(warm, len(mbs))
    out = [Action(stage, "F", m) for m in mbs[:warm]]
    for i, m in enumerate(mbs):
        out.append(Action(stage, "B", m))
        if warm + i < len(mbs):
            out.append(Action(stage, "F", mbs[warm + i]))
    return out


def insert_updates(acts: Sequence[Action]) -> list[Action]:
    """A ``U`` (microbatch field = that microbatch) right after each microbatch's last gradient
    action (``W`` if the stage splits backward, else ``B``): PipeDream's update per minibatch."""
    split = {a.stage for a in acts if a.kind == "W"}
    out: list[Action] = []
    for a in acts:
        out.append(a)
        if (a.kind == "W" or (a.kind == "B" and a.stage not in split)):
            out.append(Action(a.stage, "U", a.microbatch))
    return out


def insert_minibatch_updates(acts: Sequence[Action], local: dict[int, list[int]], M: int, K: int,
                             lead: dict[int, int] | None = None) -> list[Action]:
    """One ``U`` per stage per minibatch ``k``, as early as allowed: after the last local gradient of
    ``k`` and, with ``lead[s] = G`` in flight, after every local forward of a microbatch
    ``<= (k+1) M - 2 + G`` (a replica blocked in the all-reduce earlier would hold back a forward its
    partners wait for)."""
    split = {a.stage for a in acts if a.kind == "W"}
    lead = lead or {}
    remaining = {(s, k): sum(1 for m in mbs if m // M == k) for s, mbs in local.items() for k in range(K)}
    fwd_left: dict[int, list[int]] = {s: sorted(mbs) for s, mbs in local.items()}
    next_k = {s: 0 for s in local}
    out: list[Action] = []

    def flush(s: int) -> None:
        while next_k[s] < K and remaining[(s, next_k[s])] == 0:
            k = next_k[s]
            if s in lead and fwd_left[s] and fwd_left[s][0] <= (k + 1) * M - 2 + lead[s]:
                return
            out.append(Action(s, "U", k))
            next_k[s] += 1

    for s in local:
        flush(s)
    for a in acts:
        out.append(a)
        if a.kind == "F" and fwd_left[a.stage] and fwd_left[a.stage][0] == a.microbatch:
            fwd_left[a.stage].pop(0)
        if a.kind == "W" or (a.kind == "B" and a.stage not in split):
            remaining[(a.stage, a.microbatch // M)] -= 1
        flush(a.stage)
    for s in local:
        flush(s)
    return out

