"""Facts about one worker's part of a schedule, computed from the schedule alone (no processes).

The runtime's workers precompute these once, before their first action; they live here so that
they can be tested, and read, without starting a run:

* :func:`input_versions`: per microbatch a worker forwards on a stage, the version of the input
  stage's weights that microbatch entered with (vertical sync carries it along);
* :func:`update_pairs`: for each ``U``, its index among its stage's updates (replicas pair their
  ``k``-th updates in the all-reduce) and the divisor of the summed gradient;
* :func:`checkpoint_points`: at which actions a worker takes the checkpoints of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pipelab.schedules.actions import Schedule
from pipelab.schedules.segments import boundaries


def input_versions(schedule: Schedule, rank: int, stage: int) -> list[int]:
    """Per microbatch worker ``rank`` forwards on ``stage`` (in list order), the input stage's version.

    The input stage's version for microbatch ``m`` is the number of input-stage updates that
    precede ``0Fm`` in the action list of the worker that runs it (vertical sync keeps them).
    Empty for stage 0.
    """
    if stage == 0:
        return []
    v_of: dict[int, int] = {}
    for w in schedule.stage_ranks[0]:
        n_updates = 0
        for a in schedule.actions[w]:
            if a.stage == 0 and a.kind == "U":
                n_updates += 1
            elif a.stage == 0 and a.kind == "F":
                v_of[a.microbatch] = n_updates
    return [v_of.get(a.microbatch, 0) for a in schedule.actions[rank] if a.stage == stage and a.kind == "F"]


def update_pairs(schedule: Schedule, rank: int, stages: Iterable[int], syncs: Callable[[int], bool],
                 microbatches: int) -> tuple[dict[int, int], dict[int, float]]:
    """For each ``U`` of worker ``rank`` (by action index): its index among its stage's updates, and
    the divisor of the summed gradient (gradient actions the update covers, over all replicas that
    all-reduce, per ``microbatches``). ``syncs(s)``: whether stage ``s``'s replicas all-reduce.

    Raises ``ValueError`` when replicas of a stage do not update in lockstep.
    """
    counts: dict[tuple[int, int], list[int]] = {}   # (worker, stage) -> contributions per U
    for s in stages:
        for w in (schedule.stage_ranks[s] if syncs(s) else (rank,)):
            has_w = any(a.kind == "W" and a.stage == s for a in schedule.actions[w])
            grad_kind = "W" if has_w else "B"
            n, per_u = 0, []
            for a in schedule.actions[w]:
                if a.stage != s:
                    continue
                if a.kind == grad_kind:
                    n += 1
                elif a.kind == "U":
                    per_u.append(n)
                    n = 0
            counts[(w, s)] = per_u
    pair: dict[int, int] = {}
    divisor: dict[int, float] = {}
    seen: dict[int, int] = {}
    for i, a in enumerate(schedule.actions[rank]):
        if a.kind != "U":
            continue
        k = seen.get(a.stage, 0)
        seen[a.stage] = k + 1
        pair[i] = k
        total = 0
        for w in (schedule.stage_ranks[a.stage] if syncs(a.stage) else (rank,)):
            per_u = counts[(w, a.stage)]
            if k >= len(per_u):
                raise ValueError(f"worker {rank}'s update {a} is its stage's update #{k} but replica worker "
                                 f"{w} has only {len(per_u)} updates; replicas must update in lockstep")
            total += per_u[k]
        divisor[i] = max(total / microbatches, 1e-12) if total else 1.0
    return pair, divisor


def checkpoint_points(schedule: Schedule, rank: int, every: int, start: int = 0) -> dict[int, int]:
    """Action index -> run step (minibatches done) of every checkpoint worker ``rank`` takes.

    Flushed methods: the last ``U`` of minibatch ``k`` on this worker, step ``start + k + 1``.
    Drained asynchronous schedules (built with ``segments``): this worker's last action (an update)
    of every segment, step ``start +`` the segment's end. Only steps that are multiples of
    ``every`` (none when ``every`` is 0). ``start``: the step a resumed run starts from.
    """
    ends: list[int] = boundaries(schedule) if every and schedule.options.get("segments") else []
    last: dict[int, int] = {}    # step -> index of this worker's last action before it
    M = schedule.microbatches
    for i, a in enumerate(schedule.actions[rank]):
        k = a.microbatch if a.kind == "U" else a.microbatch // M
        if ends:
            step = next(e for e in ends if k < e)     # the end of k's segment
        else:
            step = k + 1 if a.kind == "U" else -1
        if every and step > 0 and (start + step) % every == 0:
            last[start + step] = i
    return {i: step for step, i in last.items()}
