"""Drained segments: a schedule built as consecutive complete schedules, for exact checkpoints.

An asynchronous schedule never flushes, so a checkpoint at an update cannot resume the same
trajectory. :func:`concat` joins complete schedules (fill, steady state, drain), shifting indices
and weight versions so that versions continue; each boundary is a consistent cut (nothing in flight,
each worker's last action an update), so resuming there reproduces the run. docs/schedules.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError


def split_sizes(total: int, every: int) -> list[int]:
    """Segment lengths covering ``total`` minibatches, ``every`` each (the last one the remainder)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ScheduleError(f"drain_every={every!r} must be an int >= 1 (minibatches per drained segment)")
    if total < 1:
        raise ScheduleError(f"minibatches={total} must be >= 1")
    return [every] * (total // every) + ([total % every] if total % every else [])


def aligned_sizes(start: int, total: int, every: int) -> list[int]:
    """Segment lengths for minibatches ``start .. start + total - 1`` of a run drained after every
    global multiple of ``every`` (a resumed run whose checkpoint step ``start`` is not one)."""
    split_sizes(1, every)
    if start < 0:
        raise ScheduleError(f"start={start} must be >= 0")
    head = min((-start) % every, total)
    return ([head] if head else []) + (split_sizes(total - head, every) if total > head else [])


def boundaries(schedule: Schedule) -> list[int]:
    """Minibatch counts at which ``schedule`` is drained (``[K]`` if unsegmented)."""
    sizes = schedule.options.get("segments") or [schedule.minibatches]
    return list(itertools.accumulate(int(s) for s in sizes))


def concat(parts: Sequence[Schedule]) -> Schedule:
    """Join complete schedules of one method and topology, per worker, indices and versions shifted by
    the parts before; ``options["segments"]`` lists the parts' lengths."""
    if not parts:
        raise ScheduleError("concat needs at least one schedule")
    first = parts[0]
    for j, p in enumerate(parts[1:], 1):
        same = (p.method, p.num_stages, p.stage_ranks, p.microbatches, p.versions is None)
        want = (first.method, first.num_stages, first.stage_ranks, first.microbatches, first.versions is None)
        if same != want:
            raise ScheduleError(f"part {j} ({p.method}, {p.num_stages} stages, ranks {p.stage_ranks}, "
                                f"M={p.microbatches}) does not match part 0 ({first.method}, "
                                f"{first.num_stages} stages, ranks {first.stage_ranks}, "
                                f"M={first.microbatches}); concat joins schedules of one method built "
                                "for one plan")
    M, W = first.microbatches, first.num_workers
    actions: list[list[Action]] = [[] for _ in range(W)]
    versions: list[list[int]] | None = None if first.versions is None else [[] for _ in range(W)]
    updates: list[dict[int, int]] = [{} for _ in range(W)]     # worker -> stage -> updates so far
    sizes: list[int] = []
    k0 = 0
    for p in parts:
        for w in range(W):
            done = dict(updates[w])
            for i, a in enumerate(p.actions[w]):
                shift = k0 if a.kind == "U" else k0 * M
                actions[w].append(Action(a.stage, a.kind, a.microbatch + shift))
                if versions is not None:
                    versions[w].append(p.version_of(w, i) + done.get(a.stage, 0))
                if a.kind == "U":
                    updates[w][a.stage] = updates[w].get(a.stage, 0) + 1
        sizes.extend(int(s) for s in (p.options.get("segments") or [p.minibatches]))
        k0 += p.minibatches
    options: dict[str, Any] = {**first.options, "segments": sizes}
    return Schedule(method=first.method, num_stages=first.num_stages, stage_ranks=first.stage_ranks,
                    microbatches=M, minibatches=k0, actions=tuple(tuple(a) for a in actions),
                    versions=None if versions is None else tuple(tuple(v) for v in versions), options=options)


def check_drained(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless on every worker the segments do not overlap and each ends with
    an update (where the runtime checkpoints)."""
    ends = boundaries(schedule)
    if ends[-1] != schedule.minibatches:
        raise ScheduleError(f"options['segments'] {schedule.options.get('segments')} cover {ends[-1]} "
                            f"minibatches but the schedule has {schedule.minibatches}")
    M = schedule.microbatches

    def seg(a: Action) -> int:
        k = a.microbatch if a.kind == "U" else a.microbatch // M
        return next(j for j, e in enumerate(ends) if k < e)

    for w, acts in enumerate(schedule.actions):
        segs = [seg(a) for a in acts]
        for i in range(1, len(acts)):
            if segs[i] < segs[i - 1]:
                raise ScheduleError(f"worker {w} step {i} ({acts[i]}) belongs to segment {segs[i]} but "
                                    f"runs after {acts[i - 1]} of segment {segs[i - 1]}: segments must not "
                                    "overlap on a worker")
            if (segs[i] != segs[i - 1]) and acts[i - 1].kind != "U":
                raise ScheduleError(f"worker {w}'s last action of segment {segs[i - 1]} is {acts[i - 1]}, "
                                    "not an update; a checkpoint at the segment's end needs the update last")
        if acts and acts[-1].kind != "U":
            raise ScheduleError(f"worker {w}'s last action {acts[-1]} is not an update")
