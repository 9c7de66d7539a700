"""Drained segments: a schedule built as consecutive complete schedules, for exact checkpoints.

An asynchronous schedule (``pipedream``, ``naive-async``, ``pipemare``, ``2bw``, ``buffered``,
``hetpipe``) never flushes: at any update some later minibatches are already in flight, holding
stashed weight versions and activations. A checkpoint taken there cannot be resumed to the same
trajectory. PipeDream checkpoints where its pipeline is empty: each stage saves its weights after
the backward pass of an epoch's last minibatch (Narayanan et al., SOSP'19, §4, checkpointing), and its
runtime drains the pipeline at the end of every epoch, paying one fill and one drain per epoch.

:func:`concat` joins complete schedules (fill, steady state, drain each) worker by worker, shifting
microbatch/minibatch indices and weight versions so that the result is one schedule of ``sum(K_j)``
minibatches whose weight versions continue across segments. Its ``options["segments"]`` lists the
segment lengths (minibatches). ``pl.schedules.build(..., drain_every=N)`` builds segments of ``N``
minibatches (the last one shorter when ``N`` does not divide ``K``).

The boundary after a segment is a *consistent cut*: every message of a segment is sent and received
inside it, every replica pair's all-reduce too, and a worker's last action of a segment is an
update (of the last minibatch it ran in the segment); so when each worker saves its state right after
its own last action of segment ``j``, nothing is in flight and each stage holds a single weight
version. Resuming from that state and executing the remaining segments reproduces the
uninterrupted run exactly.

Cost: every segment pays one pipeline fill and one drain. With unit costs (``F = f``, a full
backward ``B = b``, no transfers) a straight ``P``-stage 1F1B segment of ``n`` minibatches of ``M``
microbatches takes ``(n M + P - 1)(f + b)``; ``K`` minibatches in one schedule take
``(K M + P - 1)(f + b)`` and drained every ``N`` they take ``(K M + (K / N)(P - 1))(f + b)``, i.e.
``(K / N - 1)(P - 1)(f + b)`` more: one fill and drain per extra segment.
``pl.simulate(..., drain_every=N)`` times it with a profile's costs
(``reproductions/benchmarks/checkpoint_drain_cost.py`` prints both).

Version rules across segments (:func:`pipelab.schedules.versions.assign_versions`): ``stash``,
``vertical`` and ``latest`` count updates, so they continue unchanged; the delayed rule of 2BW and
``buffered`` restarts after a drain like a fresh pipeline: minibatch ``k`` of a segment starting
at minibatch ``k0`` reads version ``max(k0, k - d)`` (the segment's first minibatches read the
weights the drain left, which is the only version held at the cut).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError


def split_sizes(total: int, every: int) -> list[int]:
    """Segment lengths covering ``total`` minibatches, ``every`` each (the last one the remainder)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ScheduleError(f"drain_every={every!r} must be an int >= 1 (minibatches per drained segment)")
    if total < 1:
        raise ScheduleError(f"minibatches={total} must be >= 1")
    sizes = [every] * (total // every)
    if total % every:
        sizes.append(total % every)
    return sizes


def aligned_sizes(start: int, total: int, every: int) -> list[int]:
    """Segment lengths for minibatches ``start .. start + total - 1`` of a run drained after every
    global multiple of ``every`` (a resumed run whose checkpoint step ``start`` is not one)."""
    split_sizes(1, every)   # checks ``every``
    if start < 0:
        raise ScheduleError(f"start={start} must be >= 0")
    head = min((-start) % every, total)
    return ([head] if head else []) + (split_sizes(total - head, every) if total > head else [])


def boundaries(schedule: Schedule) -> list[int]:
    """Minibatch counts at which ``schedule`` is drained: the end of every segment (``[K]`` if
    unsegmented)."""
    sizes = schedule.options.get("segments") or [schedule.minibatches]
    out, n = [], 0
    for s in sizes:
        n += int(s)
        out.append(n)
    return out


def segment_start(minibatch: int, segments: Sequence[int] | None) -> int:
    """The first minibatch of the segment holding ``minibatch`` (0 without segments)."""
    if not segments:
        return 0
    start = 0
    for s in segments:
        if minibatch < start + int(s):
            return start
        start += int(s)
    raise ScheduleError(
        f"minibatch {minibatch} is beyond the segments {list(segments)} ({start} minibatches)"
    )


def concat(parts: Sequence[Schedule]) -> Schedule:
    """Join complete schedules of the same method and topology one after the other, per worker.

    Part ``j``'s microbatch ``m`` becomes ``m + M * K0`` and its updates' minibatch ``k`` becomes
    ``k + K0`` (``K0`` = minibatches of the parts before it); a version ``v`` read or produced on
    stage ``s`` of worker ``w`` becomes ``v + u`` with ``u`` the updates of ``s`` on ``w`` in earlier
    parts. ``options["segments"]`` of the result lists the parts' lengths (nested segments are
    flattened). Raises :class:`ScheduleError` if the parts differ in method, stages, workers or ``M``.
    """
    if not parts:
        raise ScheduleError("concat needs at least one schedule")
    first = parts[0]
    for j, p in enumerate(parts[1:], 1):
        same = (p.method, p.num_stages, p.stage_ranks, p.microbatches, p.versions is None)
        want = (first.method, first.num_stages, first.stage_ranks, first.microbatches, first.versions is None)
        if same != want:
            raise ScheduleError(
                f"part {j} ({p.method}, {p.num_stages} stages, ranks {p.stage_ranks}, "
                f"M={p.microbatches}) does not match part 0 ({first.method}, {first.num_stages} "
                f"stages, ranks {first.stage_ranks}, M={first.microbatches}); concat joins "
                "schedules of one method built for one plan"
            )
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
    """Raise :class:`ScheduleError` unless every segment boundary of ``schedule`` is a consistent cut.

    On every worker the actions of segment ``j`` all precede those of segment ``j + 1``, and each
    worker's last action in a segment is an update (where the runtime checkpoints). Messages and
    all-reduces never cross a boundary because they pair actions of the same microbatch/minibatch.
    """
    ends = boundaries(schedule)
    if ends[-1] != schedule.minibatches:
        raise ScheduleError(
            f"options['segments'] {schedule.options.get('segments')} cover {ends[-1]} minibatches "
            f"but the schedule has {schedule.minibatches}"
        )
    M = schedule.microbatches

    def seg(a: Action) -> int:
        k = a.microbatch if a.kind == "U" else a.microbatch // M
        return next(j for j, e in enumerate(ends) if k < e)

    for w, acts in enumerate(schedule.actions):
        segs = [seg(a) for a in acts]
        for i in range(1, len(acts)):
            if segs[i] < segs[i - 1]:
                raise ScheduleError(
                    f"worker {w} step {i} ({acts[i]}) belongs to segment {segs[i]} but runs after "
                    f"{acts[i - 1]} of segment {segs[i - 1]}: segments must not overlap on a worker"
                )
            if (segs[i] != segs[i - 1]) and acts[i - 1].kind != "U":
                raise ScheduleError(
                    f"worker {w}'s last action of segment {segs[i - 1]} is {acts[i - 1]}, not an "
                    "update; a checkpoint at the segment's end needs the update last"
                )
        if acts and acts[-1].kind != "U":
            raise ScheduleError(f"worker {w}'s last action {acts[-1]} is not an update")


def concat_built(build: Callable[[int], Schedule], sizes: Sequence[int]) -> Schedule:
    """``concat`` of ``build(n)`` for every segment length ``n`` in ``sizes`` (each length built once)."""
    cache: dict[int, Schedule] = {}
    parts = []
    for n in sizes:
        if n not in cache:
            cache[n] = build(n)
        parts.append(cache[n])
    return concat(parts)
