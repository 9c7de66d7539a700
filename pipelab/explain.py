"""Bubbles explained: split each worker's idle time into its causes, and find the critical path.

:func:`explain` replays the schedule (:func:`pipelab.schedules.dataflow.run`) with the trace's
durations, adding one cause at a time, and reads each cause as the idle time it adds:

0. **fill/drain**: every action at its kind's typical duration, no transfers, no updates;
1. **imbalance**: each stage at its own median durations (slowdown removed);
2. **straggler**: every action at its measured duration (slowed workers, single stalls);
3. **transfer**: plus each message's measured latency;
4. **update**: the measured trace itself (updates, all-reduces, and what the replay does not model).

Part ``k`` on worker ``w`` is ``idle_k(w) - idle_{k-1}(w)``, so a worker's parts sum to its idle time
exactly; a part may be negative (a straggler's own row). ``straggler_by_culprit[j]``: the idle time the
other workers gain when ``j`` alone runs at its measured durations.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab.metrics import COMPUTE_KINDS
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import Costs, dependencies, run
from pipelab.trace import Event, Trace

#: the parts of idle time, in the order they are peeled off
PARTS = ("fill_drain", "imbalance", "straggler", "transfer", "update")

_Key = tuple[int, int, str, int]   # (worker, stage, kind, microbatch)


@dataclass(frozen=True, repr=False)
class BubbleBreakdown(Described):
    """Per worker, seconds of busy and idle time and the idle time's parts (:data:`PARTS`)."""

    table: pd.DataFrame                      # index worker; busy, idle, one column per part
    makespan: float
    straggler_by_culprit: dict[int, float] = field(default_factory=dict)
    critical_path: tuple[Event, ...] = ()

    def fractions(self) -> pd.DataFrame:
        """The table over the makespan: each part as a share of the worker's time."""
        return self.table / self.makespan if self.makespan > 0 else self.table * 0.0

    def totals(self) -> dict[str, float]:
        """Each part summed over workers, as a share of all workers' time (sums to the bubble fraction)."""
        n = len(self.table)
        denom = self.makespan * n if self.makespan > 0 and n else 1.0
        return {p: float(self.table[p].sum()) / denom for p in ("idle", *PARTS)}

    def describe(self) -> str:
        """The idle time's parts over all workers, and the critical path's length."""
        return (f"idle time over {len(self.table)} workers and {self.makespan * 1e3:.2f} ms: {self.summary()}"
                + (f"; critical path {len(self.critical_path)} events" if self.critical_path else ""))

    def summary(self) -> str:
        """One line per part, for humans."""
        t = self.totals()
        return "; ".join(f"{p.replace('_', '/')} {t[p]:.1%}" for p in ("idle", *PARTS))


class _TraceCosts(Costs):
    """Durations of the actions from a table, messages from a table (fixed latencies, no contention);
    updates take no time (they are the last part, read off the measured trace)."""

    def __init__(self, durations: Mapping[_Key, float], latency: Mapping[_Key, float]) -> None:
        self.durations, self.latency = durations, latency

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """The table's duration (0 for a ``U``)."""
        key = (worker, action.stage, action.kind, action.microbatch)
        return 0.0 if action.kind == "U" else self.durations.get(key, 0.0)

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        """The message's measured latency (0 when transfers do not count)."""
        return self.latency.get((src, action.stage, action.kind, action.microbatch), 0.0), 0

    def channels(self, src: int, dst: int) -> tuple[Hashable, ...]:
        """No shared channel: the latencies measured already include any queueing."""
        return ()

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """All-reduces are left to the last part (the measured trace): hidden here."""
        return grad_s, 0.0, 0


def _idle(events: Sequence[Event], workers: int) -> tuple[float, list[float]]:
    """(makespan, per-worker idle seconds) of ``events`` (compute actions only)."""
    comp = metrics.compute_events(events)
    makespan = metrics.span(comp)
    busy = [0.0] * workers
    for e in comp:
        if 0 <= e.worker < workers:
            busy[e.worker] += e.end_s - e.start_s
    return makespan, [makespan - b for b in busy]


def _latencies(trace: Trace, comp: Mapping[_Key, Event], schedule: Schedule) -> dict[_Key, float]:
    """Per message (sender, stage, kind, microbatch): seconds from the sender's end to its arrival
    (from ``send`` events, else the receiver's wait past the producer and its own previous action)."""
    out: dict[_Key, float] = {}
    sends = [e for e in trace.events if e.kind == "send"]
    for s in sends:
        # the message's producer: this worker's F or B of the microbatch that ended last before it left
        prods = [p for p in (comp.get((s.worker, s.stage, kind, s.microbatch)) for kind in ("F", "B"))
                 if p is not None and p.end_s <= s.start_s + 1e-12]
        if prods:
            prod = max(prods, key=lambda p: p.end_s)
            out[(s.worker, s.stage, prod.kind, s.microbatch)] = max(0.0, s.end_s - prod.end_s)
    if sends:
        return out
    by_key = {(e.stage, e.kind, e.microbatch): e for e in comp.values()}
    last = schedule.num_stages - 1
    for w, lst in enumerate(schedule.actions):
        prev_end = -float("inf")
        for a in lst:
            e = comp.get((w, a.stage, a.kind, a.microbatch))
            if e is None:
                continue
            for k2, s2, m2 in dependencies(a.kind, a.stage, a.microbatch, last):
                p = by_key.get((s2, k2, m2))
                if s2 != a.stage and p is not None and p.worker != w:
                    out[(p.worker, s2, k2, m2)] = max(0.0, e.start_s - max(p.end_s, prev_end))
            prev_end = e.end_s
    return out


def critical_path(trace: Trace, schedule: Schedule, *, tol: float = 1e-9) -> tuple[Event, ...]:
    """The chain of actions (and messages) that ends last: from the last action back, each step's
    binding predecessor, its worker's previous action or the input it waited for, whichever came later.
    Returned in time order."""
    comp = metrics.compute_events(trace.events)
    if not comp:
        return ()
    by_key = {(e.stage, e.kind, e.microbatch): e for e in comp if e.kind != "U"}
    ordered = sorted(comp, key=lambda e: (e.worker, e.start_s, e.end_s))
    prev = {(b.worker, b.start_s): a for a, b in zip(ordered, ordered[1:]) if a.worker == b.worker}
    sends = {(s.worker, s.stage, s.microbatch, s.peer): s for s in trace.events if s.kind == "send"}
    last = schedule.num_stages - 1
    path: list[Event] = []
    cur: Event | None = max(comp, key=lambda e: (e.end_s, e.start_s))
    seen: set[int] = set()
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        path.append(cur)
        best: Event | None = prev.get((cur.worker, cur.start_s))
        best_t = best.end_s if best is not None else -float("inf")
        msg: Event | None = None
        for k2, s2, m2 in dependencies(cur.kind, cur.stage, cur.microbatch, last):
            p = by_key.get((s2, k2, m2))
            if p is None or p.end_s > cur.start_s + tol:
                continue
            snd = sends.get((p.worker, p.stage, p.microbatch, cur.worker)) if p.worker != cur.worker else None
            arrive = snd.end_s if snd is not None and snd.end_s <= cur.start_s + tol else p.end_s
            if arrive >= best_t - tol:   # waiting on data (ties go to the data: the chain crosses workers)
                best, best_t, msg = p, arrive, (snd if arrive > p.end_s else None)
        if msg is not None:
            path.append(msg)
        cur = best
    path.reverse()
    return tuple(path)


def explain(trace: Trace | Any, schedule: Schedule | None = None, *,
            slowdown: Mapping[int, float] | None = None, culprits: bool = True) -> BubbleBreakdown:
    """Split each worker's idle time in ``trace`` (or a result's ``.trace``) into :data:`PARTS`.

    Args:
        schedule: the schedule the trace ran (default ``trace.schedule``).
        slowdown: {worker: factor} of workers known to be slower (default ``trace.meta["slowdown"]``);
            without it a worker slower on every action reads as imbalance.
        culprits: also compute ``straggler_by_culprit`` (one replay per slowed worker).
    """
    trace, schedule, slowdown = _inputs(trace, schedule, slowdown)
    nw = schedule.num_workers
    comp = _compute_events(trace, schedule)
    level2 = {k: e.end_s - e.start_s for k, e in comp.items()}
    level0, level1 = _typical_durations(level2, slowdown)
    lat = _latencies(trace, comp, schedule)

    def idle(durations: Mapping[_Key, float], transfers: bool) -> tuple[float, list[float]]:
        return _idle(run(schedule, _TraceCosts(durations, lat if transfers else {})), nw)

    levels = [idle(level0, False), idle(level1, False), idle(level2, False), idle(level2, True),
              _idle(trace.events, nw)]
    busy = metrics.busy_time(comp.values(), range(nw))
    rows = [{"busy": busy[w], "idle": levels[-1][1][w],
             **{p: levels[i][1][w] - (levels[i - 1][1][w] if i else 0.0) for i, p in enumerate(PARTS)}}
            for w in range(nw)]
    table = pd.DataFrame(rows, index=pd.RangeIndex(nw, name="worker"))
    by_culprit: dict[int, float] = {}
    if culprits:
        base = sum(levels[1][1])
        excess = sorted({k[0] for k in comp if abs(level2[k] - level1[k]) > 1e-12 * max(level1[k], 1e-30)})
        for j in excess:
            mixed = {k: (level2[k] if k[0] == j else level1[k]) for k in comp}
            _, idl = idle(mixed, False)
            by_culprit[j] = sum(idl[w] for w in range(nw) if w != j) - (base - levels[1][1][j])
    return BubbleBreakdown(table=table, makespan=levels[-1][0], straggler_by_culprit=by_culprit,
                           critical_path=critical_path(trace, schedule))


def _inputs(trace: Trace | Any, schedule: Schedule | None, slowdown: Mapping[int, float] | None
            ) -> tuple[Trace, Schedule, Mapping[int, float]]:
    """The trace, its schedule and the slowed workers, checked."""
    if schedule is None:
        schedule = getattr(trace, "schedule", None)
    trace = getattr(trace, "trace", trace)
    if not isinstance(trace, Trace):
        raise TypeError(f"explain() needs a pipelab Trace (or a result with .trace), got "
                        f"{type(trace).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError("explain() needs the Schedule the trace ran: pass schedule=, "
                        "or a SimResult / run result")
    if slowdown is None:
        slowdown = {int(k): float(v) for k, v in (trace.meta.get("slowdown") or {}).items()}
    for w, f in slowdown.items():
        if f <= 0:
            raise ValueError(f"slowdown[{w}] = {f}: factors must be > 0 (1 = normal speed)")
    return trace, schedule, slowdown


def _compute_events(trace: Trace, schedule: Schedule) -> dict[_Key, Event]:
    """The trace's compute event of every action of the schedule (exactly one each)."""
    comp: dict[_Key, Event] = {}
    for e in trace.events:
        if e.kind in COMPUTE_KINDS:
            key = (e.worker, e.stage, e.kind, e.microbatch)
            if key in comp:
                raise ValueError(f"the trace has two {e.stage}{e.kind}{e.microbatch} actions on worker "
                                 f"{e.worker}; explain() needs one event per action of the schedule")
            comp[key] = e
    missing = [f"w{w}:{a}" for w, lst in enumerate(schedule.actions) for a in lst
               if (w, a.stage, a.kind, a.microbatch) not in comp]
    if missing:
        raise ValueError(f"the trace lacks {len(missing)} action(s) of the schedule (first: {missing[:3]}); "
                         f"pass the schedule this trace ran")
    return comp


def _typical_durations(actual: Mapping[_Key, float], slowdown: Mapping[int, float]
                       ) -> tuple[dict[_Key, float], dict[_Key, float]]:
    """Every action at its kind's mean over stages, and at its stage and kind's median (slowdowns off)."""
    nominal = {k: d / slowdown.get(k[0], 1.0) for k, d in actual.items()}
    by_sk: dict[tuple[int, str], list[float]] = {}
    for (_w, s, kind, _m), d in nominal.items():
        by_sk.setdefault((s, kind), []).append(d)
    median = {sk: statistics.median(v) for sk, v in by_sk.items()}
    by_kind: dict[str, list[float]] = {}
    for (_s, kind), v in median.items():
        by_kind.setdefault(kind, []).append(v)
    mean_kind = {k: sum(v) / len(v) for k, v in by_kind.items()}
    return {k: mean_kind[k[2]] for k in actual}, {k: median[(k[1], k[2])] for k in actual}
