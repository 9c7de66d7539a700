"""Asynchronous (no-flush) 1F1B schedules: ``pipedream``, ``naive-async``, ``pipemare``, ``2bw``,
``buffered``.

All share one order: stage ``s`` admits the microbatches of every worker of stages ``>= s``
before its first backward (PipeDream's NOAM = ceil(workers / input replicas) per input replica,
SOSP'19 §3.2), then alternates one backward and one forward, never flushing; the run's end
drains. Microbatch ``m`` of stage ``s`` runs on replica ``m % replicas_s`` (round-robin).

What differs is when weights change and which version each action reads:

- ``pipedream``, ``naive-async``, ``pipemare``: by default each "microbatch" is a minibatch
  (``M = 1``); a ``U`` (microbatch field = that minibatch) follows every ``B``; replicas' ``k``-th
  ``U``'s all-reduce together. With ``M = N > 1`` microbatches per minibatch (PipeMare's setting,
  Yang et al., MLSys'21, Table 1) the order is the same 1F1B over all ``N*K`` microbatches, never
  flushed, with one ``U`` per stage per minibatch after its last ``B`` (gradients accumulate over
  the minibatch's microbatches, which may have read different versions). Versions: ``pipedream``
  stashes (B reads the version its F read, the latest when F ran), ``vertical_sync=True`` makes
  every stage use the input stage's version; ``naive-async``/``pipemare`` read the latest weights
  in F and in B (no stash). On a straight pipeline stage ``s`` (from 0) of ``P`` then reads, in
  F, weights ``ceil((P - 1 - s) / N)`` updates older than the update its gradient lands in, and
  in B (latest rule) the newest ones (:func:`pipelab.schedules.worker_view.stage_delays`).
- ``2bw``, ``buffered``: ``M`` microbatches per minibatch, gradients coalesced, one ``U`` per stage
  per minibatch (microbatch field ``k``) right after its last ``B``. Minibatch ``k`` reads version
  ``max(0, k - d)`` on every stage, with ``d = 1`` for 2BW (W(t+1) = W(t) - nu grad f(W(t-1)),
  Narayanan et al. ICML'21 §3) and ``d = K - 1`` for ``buffered`` with ``versions=K`` (at most K
  versions alive per stage, after Lv et al. CCGrid'23).

Picture (pipedream, straight P=3, ``U`` after each B)::

    w0: F0 F1 F2 B0 U0 F3 B1 U1 F4 B2 U2 ...
    w2: .. .. F0 B0 U0 F1 B1 U1 F2 B2 U2 ...
"""

from __future__ import annotations

import math

import pipelab.methods as methods
from pipelab.metrics import in_flight
from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import (
    ScheduleError,
    insert_minibatch_updates,
    insert_updates,
    one_f_one_b,
)
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
    """PipeDream-style 1F1B without flush: with ``microbatches = 1`` a ``U`` after every ``B``;
    with ``N > 1`` one ``U`` per stage per minibatch of ``N`` microbatches, after its last ``B``.

    ``extra_in_flight = e`` admits ``e * lcm(replicas)`` more minibatches at every stage than NOAM
    (``e`` more per stage of a straight pipeline): PipeDream's NOAM keeps the pipeline full only
    when transfers are short next to compute; with long transfers a minibatch's round trip outlasts
    NOAM minibatches of work. The price is more stashed versions and activations.
    """
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
    options: dict[str, object] = {
        "allreduce": allreduce and any(r > 1 for r in plan.replicas),
        "weights": rule,
        "vertical_sync": vertical_sync,
        "noam": plan.noam,
        "extra_in_flight": extra_in_flight,
    }
    options.update(extra or {})
    return Schedule(
        method=method,
        num_stages=plan.num_stages,
        stage_ranks=ranks,
        microbatches=M,
        minibatches=K,
        actions=tuple(tuple(a) for a in acts),
        versions=versions,
        options=options,
    )


def coalesced(plan: Plan, method: str, M: int, K: int, delay: int) -> Schedule:
    """2BW / buffered: 1F1B without flush over all ``M*K`` microbatches, one ``U`` per minibatch,
    minibatch ``k`` reading version ``max(0, k - delay)``."""
    g0 = in_flight(plan.replicas, 0, per_replica=False)
    # F of minibatch k's first microbatch needs U(k - delay - 1), i.e. the B of microbatch
    # (k - delay) * M - 1, done before it: g0 <= delay * M + 1.
    if g0 > delay * M + 1:
        need = math.ceil((g0 - 1) / delay)
        raise ScheduleError(
            f"{method} with {delay + 1} weight versions keeps {g0} microbatches in flight at the "
            f"input stage, so it needs microbatches >= {need} per minibatch; got {M}"
        )
    lists, local = _orders(plan, M * K)
    lead = {s: in_flight(plan.replicas, s, per_replica=False) for s in range(plan.num_stages)}
    acts = [insert_minibatch_updates(a, loc, M, K, lead) for a, loc in zip(lists, local)]
    ranks = tuple(s.ranks for s in plan.stages)
    versions = assign_versions("delay", acts, ranks, M, delay)
    return Schedule(
        method=method,
        num_stages=plan.num_stages,
        stage_ranks=ranks,
        microbatches=M,
        minibatches=K,
        actions=tuple(tuple(a) for a in acts),
        versions=versions,
        options={
            "allreduce": any(r > 1 for r in plan.replicas),
            "weights": "delay",
            "delay": delay,
            "versions": delay + 1,
        },
    )
