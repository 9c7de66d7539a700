"""A worker's view of its schedule: what it precomputes before its first action (no processes).

:func:`update_pairs` (each ``U``'s all-reduce partner index and gradient divisor),
:func:`checkpoint_points`, :func:`stage_reads` (the versions the runtime's weight policies keep) and
:func:`stage_delays` (PipeMare's delays) live here so that they can be tested without a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pipelab.methods as methods
from pipelab.schedules.actions import Schedule
from pipelab.schedules.segments import boundaries


def update_pairs(schedule: Schedule, rank: int, stages: Iterable[int], syncs: Callable[[int], bool],
                 microbatches: int) -> tuple[dict[int, int], dict[int, float]]:
    """For each ``U`` of worker ``rank`` (by action index): its index among its stage's updates, and the
    divisor of the summed gradient; ``syncs(s)``: whether stage ``s``'s replicas all-reduce."""
    counts: dict[tuple[int, int], list[int]] = {}   # (worker, stage) -> contributions per U
    for s in stages:
        for w in (schedule.stage_ranks[s] if syncs(s) else (rank,)):
            grad_kind = "W" if any(a.kind == "W" and a.stage == s for a in schedule.actions[w]) else "B"
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
    """Action index -> run step of every checkpoint worker ``rank`` takes (after a minibatch's last ``U``,
    or a drained segment's end), at steps that are multiples of ``every``; ``start``: a resumed run's."""
    ends: list[int] = boundaries(schedule) if every and schedule.options.get("segments") else []
    last: dict[int, int] = {}    # step -> index of this worker's last action before it
    M = schedule.microbatches
    for i, a in enumerate(schedule.actions[rank]):
        k = a.microbatch if a.kind == "U" else a.microbatch // M
        # the end of k's segment, else the minibatch a U closes
        step = next(e for e in ends if k < e) if ends else k + 1 if a.kind == "U" else -1
        if every and step > 0 and (start + step) % every == 0:
            last[start + step] = i
    return {i: step for step, i in last.items()}


@dataclass(frozen=True)
class StageReads:
    """The versions one worker's actions on one stage read: ``forward`` ``(microbatch, version)`` in order,
    ``backward`` microbatch -> version (``B`` and ``W``); ``single`` for single-version methods."""

    forward: tuple[tuple[int, int], ...] = ()
    backward: Mapping[int, int] = field(default_factory=dict)
    single: bool = True


def stage_reads(schedule: Schedule, rank: int, stage: int) -> StageReads:
    """The versions worker ``rank``'s actions on ``stage`` read (a multi-version schedule without
    recorded versions raises: the runtime does not guess them)."""
    spec = methods.METHODS.get(schedule.method)    # the schedule's own weights option, else the method's
    rule = str(schedule.options.get("weights") or (spec.versions if spec is not None else "single"))
    if schedule.versions is None:
        if rule != "single":
            raise ValueError(f"the {schedule.method} schedule records no weight versions, but the method "
                             f"keeps several ({rule!r}); build it with pl.schedules.build or give "
                             "Schedule(versions=...)")
        return StageReads()
    mine = [(a, v) for a, v in zip(schedule.actions[rank], schedule.versions[rank]) if a.stage == stage]
    return StageReads(tuple((a.microbatch, v) for a, v in mine if a.kind == "F"),
                      {a.microbatch: v for a, v in mine if a.kind in ("B", "W")}, rule == "single")


def stage_delays(schedule: Schedule) -> dict[int, tuple[int, int]]:
    """Per stage ``(tau_fwd, tau_bwd)``: the most updates between the version a minibatch's ``F`` (``B``)
    reads and the one its update changes (PipeMare's delays, Yang et al., MLSys'21 §3)."""
    if schedule.versions is None:
        raise ValueError("the schedule has no per-action weight versions; build it with "
                         "pl.schedules.build('pipemare' or 'naive-async', ...)")
    per: dict[int, tuple[dict[int, int], dict[int, int], dict[int, int]]] = {}
    for w, acts in enumerate(schedule.actions):
        for a, v in zip(acts, schedule.versions[w]):
            f, b, u = per.setdefault(a.stage, ({}, {}, {}))
            if a.kind == "U":
                u[a.microbatch] = v
                continue
            mb = schedule.minibatch_of(a.microbatch)
            if a.kind == "F":
                f[mb] = min(v, f.get(mb, v))
            elif a.kind == "B":
                b[mb] = min(v, b.get(mb, v))
    def most(reads: dict[int, int], u: dict[int, int]) -> int:
        return max(0, max((v - 1 - reads[m] for m, v in u.items() if m in reads), default=0))

    return {s: (most(f, u), most(b, u)) for s, (f, b, u) in sorted(per.items())}
