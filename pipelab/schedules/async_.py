"""Asynchronous (no-flush) 1F1B: ``pipedream``, ``naive-async``, ``pipemare``, ``2bw``, ``buffered``.

All share one order: stage ``s`` admits the microbatches of every worker of stages ``>= s`` before
its first backward (PipeDream's NOAM, SOSP'19 §3.2), then alternates one backward and one forward,
never flushing. They differ in when weights change (a ``U`` after every ``B``, or one per minibatch
after its last ``B``) and which version each action reads (docs/schedules.md)::

    pipedream, P=3   w0: F0 F1 F2 B0 U0 F3 B1 U1 F4 B2 U2 ...
                     w2: .. .. F0 B0 U0 F1 B1 U1 F2 B2 U2 ...
"""

from __future__ import annotations

import math

import pipelab.methods as methods
from pipelab.metrics import in_flight
from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError, insert_minibatch_updates, insert_updates, one_f_one_b
from pipelab.schedules.versions import assign_versions


def _orders(plan: Plan, total: int, extra: int = 0) -> tuple[list[list[Action]], list[dict[int, list[int]]]]:
    reps = plan.replicas
    L = math.lcm(*reps)   # extra admission in whole rounds keeps every stage's admitted set nested
    lists: list[list[Action]] = [[] for _ in range(plan.num_workers)]
    local: list[dict[int, list[int]]] = [{} for _ in range(plan.num_workers)]
    for st in plan.stages:
        for j, w in enumerate(st.ranks):
            mbs = [m for m in range(total) if m % st.replicas == j]
            warm = in_flight(reps, st.index) + extra * L // st.replicas  # NOAM per replica
            lists[w] = one_f_one_b(mbs, warm, st.index)
            local[w] = {st.index: mbs}
    return lists, local


def per_minibatch_async(plan: Plan, method: str, K: int, *, vertical_sync: bool = False,
                        allreduce: bool = True, extra: dict[str, object] | None = None,
                        extra_in_flight: int = 0, microbatches: int = 1) -> Schedule:
    """PipeDream-style 1F1B without flush: a ``U`` after every ``B`` (``microbatches = 1``) or one per
    stage per minibatch; ``extra_in_flight = e`` admits ``e * lcm(replicas)`` more than NOAM."""
    if extra_in_flight < 0:
        raise ScheduleError(f"extra_in_flight={extra_in_flight} must be >= 0")
    M = microbatches
    if M == 1:
        lists, _ = _orders(plan, K, extra_in_flight)
        acts = [insert_updates(a) for a in lists]
    else:
        lists, local = _orders(plan, M * K, extra_in_flight)
        lead = {s: in_flight(plan.replicas, s, per_replica=False) for s in range(plan.num_stages)}
        acts = [insert_minibatch_updates(a, loc, M, K, lead) for a, loc in zip(lists, local)]
    rule = methods.get(method).versions     # "stash" (pipedream) or "latest" (naive-async, pipemare)
    if vertical_sync and rule == "stash":
        if len(set(plan.replicas)) != 1:
            raise ScheduleError(f"vertical_sync needs every stage to have the same replica count (so that "
                                f"version numbers match across stages); this plan has {plan.config!r}")
        rule = "vertical"
    ranks = tuple(s.ranks for s in plan.stages)
    versions = assign_versions(rule, acts, ranks, M)
    options: dict[str, object] = {"allreduce": allreduce and any(r > 1 for r in plan.replicas),
                                  "weights": rule, "vertical_sync": vertical_sync, "noam": plan.noam,
                                  "extra_in_flight": extra_in_flight, **(extra or {})}
    return Schedule(method=method, num_stages=plan.num_stages, stage_ranks=ranks, microbatches=M,
                    minibatches=K, actions=tuple(tuple(a) for a in acts), versions=versions, options=options)


def coalesced(plan: Plan, method: str, M: int, K: int, delay: int) -> Schedule:
    """2BW / buffered: 1F1B without flush over all ``M*K`` microbatches, one ``U`` per minibatch,
    minibatch ``k`` reading version ``max(0, k - delay)``."""
    g0 = in_flight(plan.replicas, 0, per_replica=False)
    # F of minibatch k's first microbatch needs U(k - delay - 1), i.e. the B of microbatch
    # (k - delay) * M - 1, done before it: g0 <= delay * M + 1.
    if g0 > delay * M + 1:
        need = math.ceil((g0 - 1) / delay)
        raise ScheduleError(f"{method} with {delay + 1} weight versions keeps {g0} microbatches in flight at "
                            f"the input stage, so it needs microbatches >= {need} per minibatch; got {M}")
    lists, local = _orders(plan, M * K)
    lead = {s: in_flight(plan.replicas, s, per_replica=False) for s in range(plan.num_stages)}
    acts = [insert_minibatch_updates(a, loc, M, K, lead) for a, loc in zip(lists, local)]
    ranks = tuple(s.ranks for s in plan.stages)
    versions = assign_versions("delay", acts, ranks, M, delay)
    return Schedule(method=method, num_stages=plan.num_stages, stage_ranks=ranks, microbatches=M,
                    minibatches=K, actions=tuple(tuple(a) for a in acts), versions=versions,
                    options={"allreduce": any(r > 1 for r in plan.replicas), "weights": "delay",
                             "delay": delay, "versions": delay + 1})
