"""The schedule validator: structure, dependencies, weight-version rules, deadlock freedom.

``validate(schedule)`` raises :class:`ScheduleError` naming the rule broken, with the schedule grid
and the failing step in brackets. Rules, in order: (1) every action on the right worker, every
``F``/``B`` (and ``W``) exactly once; (2) ``B`` after its ``F``, ``W`` after its ``B``, ``U(k)`` after
the local gradients of minibatch ``k``, one ``U`` per minibatch per replica; (3) versions: a flush
for single-version methods, else the method's rule; (4) drained segments are consistent cuts;
(5) no deadlock with unit costs; (6) every pair of workers handles its messages in one order.
"""

from __future__ import annotations

from collections import Counter

from pipelab.schedules.actions import Schedule
from pipelab.schedules.dataflow import Deadlock, UnitCosts, run
from pipelab.schedules.messages import describe_mismatch, first_mismatch, pair_sequences
from pipelab.schedules.segments import check_drained
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.versions import assign_versions

_MAX_STEPS = 26


def _fail(schedule: Schedule, what: str, at: tuple[int, int] | None) -> ScheduleError:
    where = f" (worker {at[0]}, step {at[1]}: {schedule.actions[at[0]][at[1]]})" if at else ""
    return ScheduleError(f"invalid {schedule.method} schedule: {what}{where}\n"
                         f"{schedule.grid(mark=at, max_steps=_MAX_STEPS)}")


def validate(schedule: Schedule, *, in_order: bool = True) -> None:
    """Raise :class:`ScheduleError` (with the grid and the failing step marked) unless ``schedule`` is
    valid; ``in_order=False`` skips rule 6 (some of torch's schedules need their sends reordered)."""
    _structure(schedule)
    _order(schedule)
    _versions(schedule)
    _segments(schedule)
    _deadlock(schedule)
    if in_order:
        check_message_order(schedule)


def _segments(sch: Schedule) -> None:
    if not sch.options.get("segments"):
        return
    try:
        check_drained(sch)
    except ScheduleError as exc:
        raise _fail(sch, f"drained segments: {exc}", None) from None


def _structure(sch: Schedule) -> None:
    S, M, total = sch.num_stages, sch.microbatches, sch.num_microbatches
    if M < 1 or sch.minibatches < 1:
        raise _fail(sch, f"microbatches={M} and minibatches={sch.minibatches} must be >= 1", None)
    hosted = {r for rs in sch.stage_ranks for r in rs}
    if not all(sch.stage_ranks) or hosted != set(range(sch.num_workers)):
        raise _fail(sch, f"stage_ranks {sch.stage_ranks} must give every stage a worker and use exactly the "
                         f"workers 0..{sch.num_workers - 1} (one action list each)", None)
    split = {a.stage for acts in sch.actions for a in acts if a.kind == "W"}
    seen: Counter[tuple[int, str, int]] = Counter()
    for w, acts in enumerate(sch.actions):
        for i, a in enumerate(acts):
            if a.stage >= S:
                raise _fail(sch, f"stage {a.stage} does not exist (stages 0..{S - 1})", (w, i))
            if a.kind == "U":
                if w not in sch.stage_ranks[a.stage]:
                    raise _fail(sch, f"worker {w} updates stage {a.stage} which it does not host", (w, i))
                if a.microbatch >= (sch.minibatches if M > 1 or sch.versions is None else total):
                    raise _fail(sch, "update for a minibatch that does not exist", (w, i))
                continue
            if a.microbatch >= total:
                raise _fail(sch, f"microbatch {a.microbatch} is outside 0..{total - 1} (M*K)", (w, i))
            owner = sch.worker_of(a.stage, a.microbatch)
            if owner != w:
                raise _fail(sch, f"{a} belongs on worker {owner} (replica microbatch % replicas)", (w, i))
            key = (a.stage, a.kind, a.microbatch)
            seen[key] += 1
            if seen[key] > 1:
                raise _fail(sch, f"{a} appears twice", (w, i))
    for s in range(S):
        kinds = ("F", "B", "W") if s in split else ("F", "B")
        for m in range(total):
            for k in kinds:
                if not seen[(s, k, m)]:
                    raise _fail(sch, f"{s}{k}{m} is missing (expected on worker {sch.worker_of(s, m)})", None)


def _order(sch: Schedule) -> None:
    M = sch.microbatches
    per_mb_updates = sch.versions is not None and M == 1
    split = {a.stage for acts in sch.actions for a in acts if a.kind == "W"}
    counts: dict[int, list[int]] = {}
    for w, acts in enumerate(sch.actions):
        done: set[tuple[int, str, int]] = set()
        need = Counter((a.stage, a.microbatch // M) for a in acts     # (stage, minibatch) -> local gradients
                       if a.kind == ("W" if a.stage in split else "B"))
        got: Counter[tuple[int, int]] = Counter()
        nu: Counter[int] = Counter()
        last_u: dict[int, int] = {}
        for i, a in enumerate(acts):
            s, m = a.stage, a.microbatch
            if a.kind == "B" and (s, "F", m) not in done:
                raise _fail(sch, f"{a} runs before its forward {s}F{m} on this worker", (w, i))
            if a.kind == "W" and (s, "B", m) not in done:
                raise _fail(sch, f"{a} runs before its backward {s}B{m} on this worker", (w, i))
            if a.kind == ("W" if s in split else "B"):
                got[(s, m // M)] += 1
            if a.kind == "U":
                if got[(s, m)] < need[(s, m)]:
                    raise _fail(sch, f"{a} updates before all of minibatch {m}'s gradients on stage {s} "
                                     f"are computed on this worker", (w, i))
                if not per_mb_updates and m != last_u.get(s, -1) + 1:
                    raise _fail(sch, f"{a} is out of order: stage {s}'s updates must close minibatches "
                                     f"0, 1, 2, ... (previous was {last_u.get(s, -1)})", (w, i))
                last_u[s] = m
                nu[s] += 1
            done.add((s, a.kind, m))
        for s in sch.stages_of(w):
            counts.setdefault(s, []).append(nu[s])
    for s, ns in counts.items():
        expect = sch.num_microbatches // len(sch.stage_ranks[s]) if per_mb_updates else sch.minibatches
        if per_mb_updates:
            if len(set(ns)) > 1 and sch.options.get("allreduce", False):
                raise _fail(sch, f"replicas of stage {s} have {ns} updates; replicas all-reduce pairwise, "
                                 f"so they need the same number", None)
        elif any(n != expect for n in ns):
            raise _fail(sch, f"stage {s} needs one U per minibatch ({expect}) on every replica; found {ns}",
                        None)


def _versions(sch: Schedule) -> None:
    M = sch.microbatches
    if sch.versions is None:
        for w, acts in enumerate(sch.actions):
            last: dict[int, int] = {}
            for i, a in enumerate(acts):
                if a.kind == "U":
                    last[a.stage] = a.microbatch
                elif a.microbatch // M != last.get(a.stage, -1) + 1:
                    k, want = a.microbatch // M, last.get(a.stage, -1) + 1
                    when = (f"before stage {a.stage}'s update of minibatch {want}" if k > want
                            else f"after stage {a.stage}'s update of minibatch {k}")
                    raise _fail(sch, f"{a} belongs to minibatch {k} but runs {when}: a single-version method "
                                     f"must flush (all of a minibatch between two updates)", (w, i))
        return
    for w, acts in enumerate(sch.actions):
        produced: Counter[int] = Counter()
        for i, a in enumerate(acts):
            v = sch.versions[w][i]
            if a.kind == "U":
                produced[a.stage] += 1
                if v != produced[a.stage]:
                    raise _fail(sch, f"{a} must produce version {produced[a.stage]} (updates so far), not "
                                     f"{v}", (w, i))
            elif v > produced[a.stage] or v < 0:
                raise _fail(sch, f"{a} reads version {v} but only versions 0..{produced[a.stage]} of stage "
                                 f"{a.stage} exist on this worker at that point", (w, i))
    rule = str(sch.options.get("weights", ""))
    if rule in ("stash", "vertical", "latest", "delay"):
        expect = assign_versions(rule, sch.actions, sch.stage_ranks, M, int(sch.options.get("delay", 0)),
                                 sch.options.get("segments"))
        for w, (got, exp) in enumerate(zip(sch.versions, expect)):
            for i, (g, e) in enumerate(zip(got, exp)):
                if g != e:
                    raise _fail(sch, f"weight version {g} breaks the {rule!r} rule of {sch.method} "
                                     f"(expected {e})", (w, i))


def _deadlock(sch: Schedule) -> None:
    try:
        run(sch, UnitCosts())
    except Deadlock as exc:
        w, i, _, _ = exc.stuck[0]
        raise _fail(sch, f"deadlock: {exc}", (w, i)) from None


def check_message_order(sch: Schedule) -> None:
    """Rule 6 alone: every ordered pair of workers sends and receives its messages in one sequence."""
    for seq in pair_sequences(sch).values():
        k = first_mismatch(seq)
        if k is not None:
            at = (seq.dst, seq.recv_at[k]) if k < len(seq.recv_at) else (seq.src, seq.send_at[k])
            raise _fail(sch, describe_mismatch(seq, k), at)
