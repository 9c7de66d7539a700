"""The dataflow core of a schedule: what each action waits for, and its discrete-event execution.

One definition of the dependency rules, shared by the validator's deadlock check, the simulator
(:mod:`pipelab.sim`, which supplies profile-based :class:`Costs`) and the Gantt view's unit-cost
layout (:func:`dependencies` for its list scheduler, :func:`run` with :class:`UnitCosts` otherwise).

Semantics (the same the runtime has): each worker runs its list in order; an action starts when
the worker is free and its inputs are there (``F`` of stage ``s`` needs the activation of ``F`` of
stage ``s-1`` for that microbatch; ``B`` needs its own ``F`` and the gradient of ``B`` of stage
``s+1``; ``W`` needs its ``B``). Sends are asynchronous: when an ``F``/``B`` ends, its output is
sent to the consumer's worker over the *channels* the costs name (by default the directed link;
:class:`pipelab.sim.simulate.ProfileCosts` adds each side's network port per level, which models
NIC contention); transfers sharing a channel run one at a time in the order they are issued, and a
transfer passes its channels in order, cut-through (the switch between them buffers).
Completions are processed in time order (a heap), so channels are claimed in time order.

A ``U`` of a replicated stage (``schedule.options["allreduce"]``) waits for the matching ``U`` of
every replica (their ``k``-th ``U``'s pair up). The gradient all-reduce may overlap the backward
or follow it, as the costs decide: they give a *tail*, the seconds from the start of a replica's
last gradient action of the stage to the reduced gradient being ready (see :class:`Costs.allreduce`).

Deadlock: if no worker can advance, :class:`Deadlock` lists every stuck worker's next step and what
it waits for.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass

from pipelab.schedules.actions import Action, Schedule
from pipelab.trace import Event

#: how many actions ahead pipelab's runtime posts its receives (:func:`pipelab.runtime.process.execute`);
#: with a rendezvous transport (gloo) a message moves only once its receive is posted
POST_AHEAD = 4


def dependencies(kind: str, stage: int, mb: int, last: int) -> list[tuple[str, int, int]]:
    """What action ``(kind, stage, mb)`` waits for besides its worker's previous action, as
    ``(kind, stage, microbatch)`` keys, in a pipeline whose last stage is ``last``.

    ``F(s, m)`` needs ``F(s-1, m)``; ``B(s, m)`` needs ``F(s, m)`` and ``B(s+1, m)``; ``W(s, m)``
    needs ``B(s, m)``; a ``U`` needs nothing else (its worker's own ``B``/``W`` come before it in the
    list). :func:`run` applies the same rules to the data those actions ship.
    """
    if kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    if kind == "B":
        return [("F", stage, mb)] + ([("B", stage + 1, mb)] if stage < last else [])
    if kind == "W":
        return [("B", stage, mb)]
    return []


class Costs:
    """What actions cost. Subclass or use :class:`UnitCosts`; ``pipelab.sim`` builds one from a profile."""

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """Seconds of ``action`` on ``worker``; ``split``: the stage has separate ``W`` actions."""
        raise NotImplementedError

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        """(seconds, bytes) to ship the output of ``action`` (F: activation, B: gradient) from ``src``
        to ``dst``."""
        raise NotImplementedError

    def channels(self, src: int, dst: int) -> tuple[Hashable, ...]:
        """Resources a transfer ``src -> dst`` passes, in order (default: the directed link alone).
        Each carries one transfer at a time per slot, in the order they are issued; a transfer holds
        each channel for its duration and enters the next one cut-through (not before it entered
        this one, and once that one is free)."""
        return ((src, dst),)

    def channel_slots(self, channel: Hashable) -> int:
        """How many transfers ``channel`` carries at once (e.g. a server's several uplinks)."""
        return 1

    def post_ahead(self) -> int | None:
        """Rendezvous: a message moves only once its receiver has posted the receive, which a worker
        does for its next ``post_ahead()`` actions when it starts each action. ``None`` (the default):
        data flows as soon as it is produced. This and the next two are hooks of the engine for a
        transport's behaviour; only the host effects (:mod:`pipelab.sim.host_effects`) set them."""
        return None

    def busy_sender_s(self, src: int) -> float:
        """Seconds a message waits to leave when its sender starts its next action at once (a
        backend whose sends progress on a thread that competes with the compute for a core)."""
        return 0.0

    def rendezvous_s(self, src: int, dst: int) -> float:
        """Seconds the receiver's "ready" notice takes to reach the sender when a message waited for
        its receive to be posted."""
        return 0.0

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """(tail, comm seconds, bytes) of stage ``stage``'s gradient all-reduce over ``workers``.

        ``tail`` counts from the start of the last gradient action (which takes ``grad_s``) to
        the reduced gradient; a tail of ``grad_s`` means the all-reduce hides completely.
        """
        raise NotImplementedError


class Delegating(Costs):
    """``base``'s costs in every respect; subclasses change one (the host effects,
    :mod:`pipelab.sim.host_effects`, and its later pass: :class:`pipelab.schedules.crossing.Stalled`)."""

    def __init__(self, base: Costs) -> None:
        self.base = base

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """As the base costs."""
        return self.base.compute(worker, action, split)

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        """As the base costs."""
        return self.base.send(src, dst, action)

    def channels(self, src: int, dst: int) -> tuple[Hashable, ...]:
        """As the base costs."""
        return self.base.channels(src, dst)

    def channel_slots(self, channel: Hashable) -> int:
        """As the base costs."""
        return self.base.channel_slots(channel)

    def post_ahead(self) -> int | None:
        """As the base costs."""
        return self.base.post_ahead()

    def busy_sender_s(self, src: int) -> float:
        """As the base costs."""
        return self.base.busy_sender_s(src)

    def rendezvous_s(self, src: int, dst: int) -> float:
        """As the base costs."""
        return self.base.rendezvous_s(src, dst)

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """As the base costs."""
        return self.base.allreduce(stage, workers, grad_s)


@dataclass(frozen=True)
class UnitCosts(Costs):
    """Fixed durations: ``F=f``, ``B=b`` (``b + w`` when the stage does not split off ``W``), ``W=w``,
    ``U=u``; transfers take ``send_s`` and all-reduces hide behind backward unless ``allreduce_s``."""

    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    u: float = 0.0
    send_s: float = 0.0
    allreduce_s: float = 0.0

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """See :meth:`Costs.compute`."""
        k = action.kind
        if k == "F":
            return self.f
        if k == "B":
            return self.b if split else self.b + self.w
        return self.w if k == "W" else self.u

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        """See :meth:`Costs.send`."""
        return (0.0 if src == dst else self.send_s), 0

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """See :meth:`Costs.allreduce`."""
        return max(grad_s, self.allreduce_s), self.allreduce_s, 0


class Deadlock(RuntimeError):
    """No worker can advance; ``stuck`` lists (worker, step index, action, waiting-for text)."""

    def __init__(self, message: str, stuck: list[tuple[int, int, Action, str]]) -> None:
        super().__init__(message)
        self.stuck = stuck


def run(schedule: Schedule, costs: Costs) -> list[Event]:
    """Execute ``schedule`` under ``costs``; return the events (one per action, plus sends/all-reduces)."""
    S = schedule.num_stages
    acts = schedule.actions
    nw = schedule.num_workers
    split = frozenset(a.stage for lst in acts for a in lst if a.kind == "W")
    allreduce = bool(schedule.options.get("allreduce", False))
    ranks = schedule.stage_ranks
    rep = [len(r) for r in ranks]
    ptr = [0] * nw
    free = [0.0] * nw
    avail: dict[tuple[str, int, int], float] = {}     # data/done keys -> time
    waiting: dict[tuple[str, int, int], list[int]] = {}
    chan_free: dict[Hashable, list[float]] = {}        # channel -> free time of each of its slots
    u_count: dict[tuple[int, int], int] = {}           # (worker, stage) -> U's done
    last_grad: dict[tuple[int, int], tuple[float, float]] = {}  # (worker, stage) -> (start, dur) of last B/W
    groups: dict[tuple[int, int], list[tuple[int, float, float, float]]] = {}
    ar_free = [0.0] * S
    events: list[Event] = []
    versions = schedule.versions
    # completion events in time order, so that transfers claim channels in the order they are issued
    heap: list[tuple[float, int, int]] = []           # (end time, seq, worker)
    seq = 0
    # rendezvous: where each worker runs each action, each action's end, and the sends waiting for
    # their receive to be posted (keyed by the receiver and the action whose end posts it)
    ahead = costs.post_ahead()
    index_of = ([{(a.kind, a.stage, a.microbatch): i for i, a in enumerate(lst)} for lst in acts]
                if ahead is not None else [])
    ends: list[list[float]] = [[] for _ in range(nw)]
    parked: dict[tuple[int, int], list[tuple[Action, int, int, float, tuple[str, int, int]]]] = {}

    def publish(key: tuple[str, int, int], t: float) -> None:
        avail[key] = t
        if key in waiting:
            for w2 in waiting.pop(key):
                start(w2)

    def deliver(a: Action, src: int, dst: int, end: float, key: tuple[str, int, int], delay: float) -> None:
        """Publish the data of ``a`` at ``dst`` once it can move: a hand-off on one worker at once;
        a message ``delay`` after ``end`` (a busy sender), and with a rendezvous once posted."""
        if dst == src:
            publish(key, end)
            return
        end += delay
        if ahead is not None:
            consumer = ("F", a.stage + 1, a.microbatch) if a.kind == "F" else ("B", a.stage - 1, a.microbatch)
            j = index_of[dst][consumer] - ahead      # the receive is posted when action j ends
            if j >= 0:
                if len(ends[dst]) <= j:              # not posted yet: wait for that action's end
                    parked.setdefault((dst, j), []).append((a, src, dst, end, key))
                    return
                posted = ends[dst][j]
                if posted > end:
                    publish(key, ship(a, src, dst, posted + costs.rendezvous_s(src, dst)))
                    return
        publish(key, ship(a, src, dst, end))

    def ship(a: Action, src: int, dst: int, end: float) -> float:
        secs, nbytes = costs.send(src, dst, a)
        if secs == 0.0 and nbytes == 0:
            return end
        # the channels form a path (egress port, then ingress port); each serialises its transfers,
        # and a transfer streams through them cut-through: it enters a channel once that channel is
        # free and it has entered the previous one, so a busy receiver does not idle the sender's port
        # (the switch buffers), and an uncontended transfer takes exactly ``secs``
        t = t0 = end
        for i, ch in enumerate(costs.channels(src, dst)):
            fr = chan_free.get(ch)
            if fr is None:
                fr = chan_free[ch] = [0.0] * costs.channel_slots(ch)
            j = 0 if len(fr) == 1 else min(range(len(fr)), key=fr.__getitem__)
            t = max(t, fr[j])
            fr[j] = t + secs
            if i == 0:
                t0 = t
        arrive = t + secs
        events.append(Event(src, a.stage, "send", a.microbatch, t0, arrive, nbytes, -1, -1, dst))
        return arrive

    def start(w: int) -> None:
        """Start worker ``w``'s next action if its inputs are known; else wait for the missing one."""
        nonlocal seq
        lst = acts[w]
        i = ptr[w]
        if i >= len(lst):
            return
        a = lst[i]
        s, kind, m = a.stage, a.kind, a.microbatch
        ready = free[w]
        need: tuple[str, int, int] | None = None
        if kind != "U":
            # the data each dependency ships: an activation ("a") or gradient ("g") from a neighbour
            # stage, or this stage's own F ("f") / B ("b") having run
            for k2, s2, m2 in dependencies(kind, s, m, S - 1):
                key = (("a" if k2 == "F" else "g") if s2 != s else k2.lower(), s2, m2)
                t = avail.get(key)
                if t is None:
                    need = key
                    break
                if t > ready:
                    ready = t
        elif allreduce and rep[s] > 1:
            k = u_count.get((w, s), 0)
            key = ("r", s, k)
            t = avail.get(key)
            if t is None:
                grp = groups.setdefault((s, k), [])
                if all(g[0] != w for g in grp):
                    gs, gd = last_grad.get((w, s), (ready, 0.0))
                    grp.append((w, ready, gs, gd))
                if len(grp) < rep[s]:
                    need = key
                else:
                    tails = [costs.allreduce(s, ranks[s], gd) for _, _, _, gd in grp]
                    done = max(max(g[1] for g in grp),
                               max(g[2] + tl[0] for g, tl in zip(grp, tails)), ar_free[s])
                    comm, nbytes = tails[0][1], tails[0][2]
                    ar_free[s] = done
                    for g in grp:
                        events.append(Event(g[0], s, "allreduce", m, done - comm, done, nbytes))
                    del groups[(s, k)]
                    avail[key] = done
                    for w2 in waiting.pop(key, []):
                        if w2 != w:
                            start(w2)
                    t = done
            if t is not None and t > ready:
                ready = t
        if need is not None:
            waiting.setdefault(need, []).append(w)
            return
        dur = costs.compute(w, a, s in split)
        end = ready + dur
        events.append(Event(w, s, kind, m, ready, end, 0, versions[w][i] if versions is not None else 0, i))
        free[w] = end
        ptr[w] = i + 1
        if kind in ("B", "W"):
            last_grad[(w, s)] = (ready, dur)
        elif kind == "U":
            u_count[(w, s)] = u_count.get((w, s), 0) + 1
        seq += 1
        heapq.heappush(heap, (end, seq, w))

    def complete(w: int) -> None:
        """Worker ``w``'s last started action has ended: send its output, then start its next one."""
        a = acts[w][ptr[w] - 1]
        s, kind, m = a.stage, a.kind, a.microbatch
        end = free[w]
        ends[w].append(end)
        for pa, psrc, pdst, pend, pkey in parked.pop((w, len(ends[w]) - 1), []):
            # this action's end posts those receives: the parked sends move now
            publish(pkey, ship(pa, psrc, pdst, max(pend, end) + costs.rendezvous_s(psrc, pdst)))
        # the worker's own data first, then its next action: whether it starts at once decides how
        # soon what this action sends can leave (costs.busy_sender_s)
        if kind in ("F", "B"):
            publish((kind.lower(), s, m), end)
        before = ptr[w]
        start(w)
        busy = ptr[w] > before and events[-1].worker == w and events[-1].start_s <= end
        delay = costs.busy_sender_s(w) if busy else 0.0
        if kind == "F" and s < S - 1:
            rs = ranks[s + 1]
            deliver(a, w, rs[m % len(rs)], end, ("a", s, m), delay)
        elif kind == "B" and s > 0:
            rs = ranks[s - 1]
            deliver(a, w, rs[m % len(rs)], end, ("g", s, m), delay)

    for w in range(nw):
        start(w)
    while heap:
        _, _, w = heapq.heappop(heap)
        complete(w)

    stuck = [(w, ptr[w], acts[w][ptr[w]]) for w in range(nw) if ptr[w] < len(acts[w])]
    if stuck:
        why = {w2: key for key, ws in waiting.items() for w2 in ws}
        rows = [(w, i, a, _explain(why.get(w))) for w, i, a in stuck]
        text = "; ".join(f"worker {w} step {i} ({a}) waits for {reason}" for w, i, a, reason in rows)
        raise Deadlock(f"schedule deadlocks: {text}", rows)
    return events


def _explain(key: tuple[str, int, int] | None) -> str:
    if key is None:
        return "nothing (internal error)"
    kind, s, m = key
    return {"a": f"the activation of {s}F{m}", "g": f"the gradient of {s}B{m}", "f": f"its own {s}F{m}",
            "b": f"its own {s}B{m}", "r": f"the all-reduce partners of stage {s}'s U number {m + 1}"}[kind]
