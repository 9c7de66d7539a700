"""Synchronous (flushing) schedules: ``dp``, ``gpipe``, ``1f1b-flush``, ``interleaved-1f1b``, ``zb-h1``.

Every worker ends minibatch ``k`` with one ``U`` per stage it hosts (replicas all-reduce there): plain
minibatch SGD with one weight version. Pictures (P=3, M=4, one minibatch, worker rows; ``U`` omitted)::

    gpipe        w0: F0 F1 F2 F3 .. .. .. .. B0 B1 B2 B3
                 w2: .. .. F0 F1 F2 F3 B0 B1 B2 B3
    1f1b-flush   w0: F0 F1 F2 .. B0 F3 B1 .. B2 .. B3
                 w2: .. .. F0 B0 F1 B1 F2 B2 F3 B3
"""

from __future__ import annotations

from collections.abc import Callable

from pipelab.metrics import in_flight
from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.messages import first_mismatch, pair_sequences
from pipelab.schedules.steps import ScheduleError, one_f_one_b


def _local(plan: Plan, stage: int, worker: int, mbs: range) -> list[int]:
    st = plan.stages[stage]
    j = st.ranks.index(worker)
    return [m for m in mbs if m % st.replicas == j]


Order = Callable[[list[int], int, int], list[Action]]


def _per_minibatch(plan: Plan, method: str, M: int, K: int, order: Order,
                   options: dict[str, object]) -> Schedule:
    """Build a flushing schedule: for each minibatch, ``order(local_mbs, stage, worker)`` then ``U``."""
    reps = plan.replicas
    lists: list[list[Action]] = [[] for _ in range(plan.num_workers)]
    for st in plan.stages:
        for w in st.ranks:
            for k in range(K):
                local = _local(plan, st.index, w, range(k * M, (k + 1) * M))
                lists[w] += order(local, st.index, w)
                lists[w].append(Action(st.index, "U", k))
    return Schedule(method=method, num_stages=plan.num_stages, microbatches=M, minibatches=K,
                    stage_ranks=tuple(s.ranks for s in plan.stages), actions=tuple(tuple(a) for a in lists),
                    options={"allreduce": any(r > 1 for r in reps), "weights": "single", **options})


def gpipe(plan: Plan, M: int, K: int) -> Schedule:
    """GPipe (Huang et al., NeurIPS'19): all forwards of the minibatch, then all backwards, then ``U``."""
    def order(local: list[int], s: int, w: int) -> list[Action]:
        return [Action(s, "F", m) for m in local] + [Action(s, "B", m) for m in local]
    return _per_minibatch(plan, "gpipe", M, K, order, {})


def one_f_one_b_flush(plan: Plan, M: int, K: int) -> Schedule:
    """PipeDream-Flush / Megatron 1F1B (Narayanan et al., ICML'21 §3.3): ``P - s`` forwards in
    flight at stage ``s`` (all workers of later stages, with replication), then one-forward-
    one-backward, drain, ``U``."""
    return _per_minibatch(plan, "1f1b-flush", M, K, _flush_order(plan.replicas), {})


def _flush_order(reps: tuple[int, ...]) -> Order:
    """1F1B's order of one stage's microbatches: ``in_flight`` forwards per replica first."""
    return lambda local, s, w: one_f_one_b(local, in_flight(reps, s), s) if local else []


def dp(plan: Plan, M: int, K: int) -> Schedule:
    """Data parallel: one stage (the whole model) on every worker, microbatch ``m`` on worker
    ``m % W``; each worker runs F, B per microbatch, then all-reduces at ``U``."""
    W = plan.num_workers
    if M % W:
        raise ScheduleError(f"dp splits each minibatch's {M} microbatches over {W} workers; "
                            f"use microbatches a multiple of {W} (e.g. {W})")
    lists = [[] for _ in range(W)]  # type: list[list[Action]]
    for w in range(W):
        for k in range(K):
            for m in range(k * M + w, (k + 1) * M, W):
                lists[w] += [Action(0, "F", m), Action(0, "B", m)]
            lists[w].append(Action(0, "U", k))
    return Schedule(method="dp", num_stages=1, stage_ranks=(tuple(range(W)),), microbatches=M, minibatches=K,
                    actions=tuple(tuple(a) for a in lists),
                    options={"allreduce": W > 1, "weights": "single", "num_layers": plan.num_layers})


def microbatch_groups(M: int, P: int) -> list[int]:
    """Sizes of interleaving's rounds: equal rounds of ``P`` or more microbatches, as many as divide
    ``M`` (at most ``M // P``): ``M = 10, P = 4``: ``[5, 5]``; ``M = 9``: ``[9]``; with ``M`` a
    multiple of ``P``, Megatron-LM's rounds of ``P``. (Unequal rounds break the per-pair message
    order, e.g. ``[3, 2]`` on two workers.)"""
    rounds = max(1, M // P)
    while M % rounds:
        rounds -= 1
    return [M // rounds] * rounds


def interleaved(plan: Plan, M: int, K: int, chunks: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., SC'21 §2.2) for any ``M >= P``: ``P`` workers each run ``v``
    chunks; virtual stage ``c * P + w`` is chunk ``c`` on worker ``w``. The plan's stages are the
    virtual stages (``v * P`` of them). Microbatches go in rounds (:func:`microbatch_groups`: of ``P``
    when ``P`` divides ``M``, Megatron-LM's; larger otherwise, as Llama 3 ran it, Dubey et al. 2024
    §3.3.2): forwards walk the chunks round by round, backwards walk them in reverse. Warm-up on
    worker ``w``: ``2(P - w - 1) + (v - 1) g`` forwards, ``g`` the first round's size."""
    v = chunks
    S = plan.num_stages
    if v < 1 or S % v:
        raise ScheduleError(f"chunks={v} does not divide the plan's {S} stages; interleaved-1f1b needs "
                            f"v * P stages (P workers); use a plan with a multiple of {v} stages")
    if any(r != 1 for r in plan.replicas):
        raise ScheduleError("interleaved-1f1b needs a plan without replicated stages (config 'straight')")
    P = S // v
    if M < P:
        raise ScheduleError(f"interleaved-1f1b needs microbatches >= the {P} workers (a round of P "
                            f"microbatches keeps every worker busy before the next chunk); got {M}: use "
                            f"microbatches={P} or more")
    total = M * v
    groups = microbatch_groups(M, P)
    # the i-th forward (and backward) of a worker: (chunk index in walking order, microbatch)
    walk = [(c, sum(groups[:r]) + j) for r, g in enumerate(groups) for c in range(v) for j in range(g)]

    lists = [[] for _ in range(P)]  # type: list[list[Action]]
    for w in range(P):
        warm = min(2 * (P - w - 1) + (v - 1) * groups[0], total)
        for k in range(K):
            def f(i: int) -> Action:
                return Action(walk[i][0] * P + w, "F", k * M + walk[i][1])  # noqa: B023

            def b(i: int) -> Action:
                return Action((v - 1 - walk[i][0]) * P + w, "B", k * M + walk[i][1])  # noqa: B023
            acts = [f(i) for i in range(warm)]
            for i in range(total - warm):
                acts += [f(warm + i), b(i)]
            acts += [b(i) for i in range(total - warm, total)]
            acts += [Action(c * P + w, "U", k) for c in range(v)]
            lists[w] += acts
    sch = Schedule(method="interleaved-1f1b", num_stages=S, stage_ranks=tuple((s % P,) for s in range(S)),
                   microbatches=M, minibatches=K, actions=tuple(tuple(a) for a in lists),
                   options={"allreduce": False, "weights": "single", "chunks": v})
    if M % P:   # rounds larger than P: on few workers the warm-up can cross messages of one pair
        for seq in pair_sequences(sch).values():
            if first_mismatch(seq) is not None:
                raise ScheduleError(
                    f"interleaved-1f1b on {P} workers with {M} microbatches (rounds {groups}) would send "
                    f"and receive the messages of workers {seq.src} -> {seq.dst} in different orders "
                    f"(a hang under NCCL's in-order matching); use microbatches a multiple of {P} "
                    f"(e.g. {M - M % P} or {M - M % P + P})")
    return sch


def zb_h1(plan: Plan, M: int, K: int) -> Schedule:
    """ZB-H1 (Qi et al., ICLR'24 §3.1): 1F1B's order of ``F`` and ``B`` (input gradient), with ``W``
    (weight gradient) of microbatch ``k - s`` right after ``B`` of ``k`` on stage ``s``, so the last
    stages fill 1F1B's bubbles; with equal F, B, W the bubble is a third of 1F1B's once ``M >= P``::

        P=3, M=4   w0: F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3
                   w2: F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
    """
    flush = _flush_order(plan.replicas)

    def order(local: list[int], s: int, w: int) -> list[Action]:
        out: list[Action] = []
        pending: list[int] = []
        for a in flush(local, s, w):
            out.append(a)
            if a.kind == "B":
                pending.append(a.microbatch)
                if len(pending) > s:
                    out.append(Action(s, "W", pending.pop(0)))
        return out + [Action(s, "W", m) for m in pending]
    return _per_minibatch(plan, "zb-h1", M, K, order, {"split_backward": True})
