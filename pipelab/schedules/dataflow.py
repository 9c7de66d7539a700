"""The dataflow core of a schedule: what each action waits for, and its discrete-event execution.

One definition of the dependency rules (:func:`dependencies`), shared by the validator's deadlock
check, the simulator (which supplies profile-based :class:`Costs`) and the Gantt view. Each worker
runs its list in order; an action starts once its worker is free and its inputs have arrived; sends
are asynchronous and serialise on the channels the costs name, in the order they are issued; a
replicated stage's ``U`` waits for its replicas' all-reduce. docs/schedules.md has the details.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass

from pipelab.schedules.actions import Action, Schedule
from pipelab.trace import Event


def dependencies(kind: str, stage: int, mb: int, last: int) -> list[tuple[str, int, int]]:
    """What action ``(kind, stage, mb)`` waits for besides its worker's previous action: ``F(s, m)``
    needs ``F(s-1, m)``; ``B(s, m)`` needs ``F(s, m)`` and ``B(s+1, m)``; ``W(s, m)`` needs ``B(s, m)``."""
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
        """Resources a transfer ``src -> dst`` passes, in order (default: the directed link alone); each
        carries one transfer per slot at a time, entered cut-through. A function of ``(src, dst)`` alone:
        the engine asks once per pair."""
        return ((src, dst),)

    def channel_slots(self, channel: Hashable) -> int:
        """How many transfers ``channel`` carries at once (e.g. a server's several uplinks)."""
        return 1

    def busy_sender_s(self, src: int) -> float:
        """Seconds a message waits to leave when its sender starts its next action at once (set by
        :mod:`pipelab.sim.host_effects`)."""
        return 0.0

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """(tail, comm seconds, bytes) of stage ``stage``'s all-reduce over ``workers``; ``tail`` counts from
        the start of the last gradient action (``grad_s`` long: hidden completely) to the reduced gradient."""
        raise NotImplementedError


class Delegating(Costs):
    """``base``'s costs in every respect; subclasses change one (the host effects,
    :mod:`pipelab.sim.host_effects`)."""

    def __init__(self, base: Costs) -> None:
        self.base = base

    def compute(self, worker: int, action: Action, split: bool) -> float:
        return self.base.compute(worker, action, split)

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        return self.base.send(src, dst, action)

    def channels(self, src: int, dst: int) -> tuple[Hashable, ...]:
        return self.base.channels(src, dst)

    def channel_slots(self, channel: Hashable) -> int:
        return self.base.channel_slots(channel)

    def busy_sender_s(self, src: int) -> float:
        return self.base.busy_sender_s(src)

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
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
        k = action.kind
        if k == "F":
            return self.f
        if k == "B":
            return self.b if split else self.b + self.w
        return self.w if k == "W" else self.u

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        return (0.0 if src == dst else self.send_s), 0

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        return max(grad_s, self.allreduce_s), self.allreduce_s, 0


class Deadlock(RuntimeError):
    """No worker can advance; ``stuck`` lists (worker, step index, action, waiting-for text)."""

    def __init__(self, message: str, stuck: list[tuple[int, int, Action, str]]) -> None:
        super().__init__(message)
        self.stuck = stuck


Key = tuple[str, int, int]   # data or done key: ("a"|"g"|"f"|"b"|"r", stage, microbatch or U number)
_FROM_NEIGHBOUR = {"F": "a", "B": "g"}   # the letter of a key published by another stage's action
_OWN = {"F": "f", "B": "b"}              # ... by this stage's own action


class Engine:
    """The discrete-event execution of one schedule under one set of costs (:func:`run`): :meth:`start`
    an action once its inputs are published; :meth:`complete` its end, in time order (a heap), which
    publishes its data, starts the next action and ships the output (:meth:`deliver`, :meth:`ship`)."""

    def __init__(self, schedule: Schedule, costs: Costs) -> None:
        self.costs = costs
        self.acts = schedule.actions
        self.S = schedule.num_stages
        self.nw = schedule.num_workers
        self.versions = schedule.versions
        self.ranks = schedule.stage_ranks
        self.split = frozenset(a.stage for lst in self.acts for a in lst if a.kind == "W")
        self.allreduce = bool(schedule.options.get("allreduce", False))
        self.ptr = [0] * self.nw
        self.free = [0.0] * self.nw
        self.avail: dict[Key, float] = {}                    # published keys -> time
        self.waiting: dict[Key, list[int]] = {}              # missing key -> workers waiting for it
        self.chan_free: dict[Hashable, list[float]] = {}     # channel -> free time of each of its slots
        self.route: dict[tuple[int, int], tuple[Hashable, ...]] = {}   # (src, dst) -> its channels
        self.u_count: dict[tuple[int, int], int] = {}        # (worker, stage) -> U's done
        self.last_grad: dict[tuple[int, int], tuple[float, float]] = {}  # (worker, stage) -> last B/W
        self.groups: dict[tuple[int, int], list[tuple[int, float, float, float]]] = {}
        self.ar_free = [0.0] * self.S
        self.events: list[Event] = []
        self.heap: list[tuple[float, int, int]] = []         # (end time, seq, worker)
        self.seq = 0

    def run(self) -> list[Event]:
        """Run every worker to its end; raise :class:`Deadlock` naming the stuck ones."""
        for w in range(self.nw):
            self.start(w)
        while self.heap:
            _, _, w = heapq.heappop(self.heap)
            self.complete(w)
        self._check_done()
        return self.events

    def publish(self, key: Key, t: float) -> None:
        """``key`` is available from ``t``: start the workers waiting for it."""
        self.avail[key] = t
        if key in self.waiting:
            for w2 in self.waiting.pop(key):
                self.start(w2)

    def deliver(self, a: Action, src: int, dst: int, end: float, key: Key, delay: float) -> None:
        """Publish the data of ``a`` at ``dst`` once it can move: a hand-off on one worker at once;
        a message ``delay`` after ``end`` (a busy sender)."""
        self.publish(key, end if dst == src else self.ship(a, src, dst, end + delay))

    def ship(self, a: Action, src: int, dst: int, end: float) -> float:
        """Send ``a``'s output from ``end`` over its channels (each serialising, entered cut-through);
        return its arrival time."""
        secs, nbytes = self.costs.send(src, dst, a)
        if secs == 0.0 and nbytes == 0:
            return end
        t = t0 = end
        route = self.route.get((src, dst))
        if route is None:
            route = self.route[(src, dst)] = self.costs.channels(src, dst)
        for i, ch in enumerate(route):
            fr = self.chan_free.get(ch)
            if fr is None:
                fr = self.chan_free[ch] = [0.0] * self.costs.channel_slots(ch)
            j = 0 if len(fr) == 1 else min(range(len(fr)), key=fr.__getitem__)
            t = max(t, fr[j])
            fr[j] = t + secs
            if i == 0:
                t0 = t
        arrive = t + secs
        self.events.append(Event(src, a.stage, "send", a.microbatch, t0, arrive, nbytes, -1, -1, dst))
        return arrive

    def _inputs(self, a: Action, ready: float) -> tuple[float, Key | None]:
        """(when ``a``'s shipped inputs are all there, or the first missing key)."""
        # an activation ("a") or gradient ("g") from a neighbour stage, or this stage's own F ("f") / B ("b")
        avail = self.avail
        for k2, s2, m2 in dependencies(a.kind, a.stage, a.microbatch, self.S - 1):
            key = (_FROM_NEIGHBOUR[k2] if s2 != a.stage else _OWN[k2], s2, m2)
            t = avail.get(key)
            if t is None:
                return ready, key
            ready = max(ready, t)
        return ready, None

    def _reduced(self, w: int, a: Action, ready: float) -> tuple[float, Key | None]:
        """(when the all-reduce of ``w``'s next ``U`` is done, or its key while partners are missing)."""
        s = a.stage
        k = self.u_count.get((w, s), 0)
        key = ("r", s, k)
        t = self.avail.get(key)
        if t is None:
            grp = self.groups.setdefault((s, k), [])
            if all(g[0] != w for g in grp):
                gs, gd = self.last_grad.get((w, s), (ready, 0.0))
                grp.append((w, ready, gs, gd))
            if len(grp) < len(self.ranks[s]):
                return ready, key
            tails = [self.costs.allreduce(s, self.ranks[s], gd) for _, _, _, gd in grp]
            done = max(max(g[1] for g in grp), max(g[2] + tl[0] for g, tl in zip(grp, tails)),
                       self.ar_free[s])
            comm, nbytes = tails[0][1], tails[0][2]
            self.ar_free[s] = done
            for g in grp:
                self.events.append(Event(g[0], s, "allreduce", a.microbatch, done - comm, done, nbytes))
            del self.groups[(s, k)]
            self.avail[key] = done
            for w2 in self.waiting.pop(key, []):
                if w2 != w:
                    self.start(w2)
            t = done
        return max(ready, t), None

    def start(self, w: int) -> None:
        """Start worker ``w``'s next action if its inputs are known; else wait for the missing one."""
        lst = self.acts[w]
        i = self.ptr[w]
        if i >= len(lst):
            return
        a = lst[i]
        s, kind = a.stage, a.kind
        ready, need = self.free[w], None
        if kind != "U":
            ready, need = self._inputs(a, ready)
        elif self.allreduce and len(self.ranks[s]) > 1:
            ready, need = self._reduced(w, a, ready)
        if need is not None:
            self.waiting.setdefault(need, []).append(w)
            return
        dur = self.costs.compute(w, a, s in self.split)
        end = ready + dur
        version = self.versions[w][i] if self.versions is not None else 0
        self.events.append(Event(w, s, kind, a.microbatch, ready, end, 0, version, i))
        self.free[w] = end
        self.ptr[w] = i + 1
        if kind in ("B", "W"):
            self.last_grad[(w, s)] = (ready, dur)
        elif kind == "U":
            self.u_count[(w, s)] = self.u_count.get((w, s), 0) + 1
        self.seq += 1
        heapq.heappush(self.heap, (end, self.seq, w))

    def complete(self, w: int) -> None:
        """Worker ``w``'s last started action has ended: send its output, then start its next one."""
        a = self.acts[w][self.ptr[w] - 1]
        s, kind, m = a.stage, a.kind, a.microbatch
        end = self.free[w]
        # own data first, then the next action: whether it starts at once delays the send (busy_sender_s)
        if kind in ("F", "B"):
            self.publish((kind.lower(), s, m), end)
        before = self.ptr[w]
        self.start(w)
        busy = self.ptr[w] > before and self.events[-1].worker == w and self.events[-1].start_s <= end
        delay = self.costs.busy_sender_s(w) if busy else 0.0
        if (kind == "F" and s < self.S - 1) or (kind == "B" and s > 0):
            rs = self.ranks[s + 1 if kind == "F" else s - 1]
            self.deliver(a, w, rs[m % len(rs)], end, ("a" if kind == "F" else "g", s, m), delay)

    def _check_done(self) -> None:
        acts, ptr = self.acts, self.ptr
        stuck = [(w, ptr[w], acts[w][ptr[w]]) for w in range(self.nw) if ptr[w] < len(acts[w])]
        if stuck:
            why = {w2: key for key, ws in self.waiting.items() for w2 in ws}
            rows = [(w, i, a, _explain(why.get(w))) for w, i, a in stuck]
            text = "; ".join(f"worker {w} step {i} ({a}) waits for {reason}" for w, i, a, reason in rows)
            raise Deadlock(f"schedule deadlocks: {text}", rows)


def run(schedule: Schedule, costs: Costs) -> list[Event]:
    """Execute ``schedule`` under ``costs``; return the events (one per action, plus sends/all-reduces)."""
    return Engine(schedule, costs).run()


def _explain(key: tuple[str, int, int] | None) -> str:
    if key is None:
        return "nothing (internal error)"
    kind, s, m = key
    return {"a": f"the activation of {s}F{m}", "g": f"the gradient of {s}B{m}", "f": f"its own {s}F{m}",
            "b": f"its own {s}B{m}", "r": f"the all-reduce partners of stage {s}'s U number {m + 1}"}[kind]
