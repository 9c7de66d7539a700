"""Orders defined by a rule: each worker picks its next action on a unit-time clock, messages in FIFO.

Zero-bubble schedules (ZB-H2, ZB-V) and DualPipe's are defined by what a worker does when it is free
(a backward first, a forward while its activations stay under a bound, a weight gradient to fill a
gap) rather than by one closed formula. :func:`rule_orders` runs such a rule: every action takes its
cost in ticks (``F``, ``B``, ``W`` one each by default), a message leaves when its action ends, and
the messages between an ordered pair of workers are received in the order they were sent (NCCL's and
MPI's in-order matching, :mod:`.messages`). Invariants of what it returns: every ``F``/``B`` (and
``W`` when split) once, each stage's forwards and backwards in ascending microbatch order, rule 6 of
the validator holds by construction, and the order ran to the end on this clock, so it cannot
deadlock (a fixed per-worker order that completes under one set of costs completes under any).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipelab.schedules.actions import Action
from pipelab.schedules.steps import ScheduleError


@dataclass
class WorkerState:
    """What a rule sees of one worker: per hosted stage, forwards, backwards and weight gradients done."""

    worker: int
    stages: tuple[int, ...]
    f_done: dict[int, int] = field(default_factory=dict)
    b_done: dict[int, int] = field(default_factory=dict)
    w_done: dict[int, int] = field(default_factory=dict)
    last: Action | None = None

    def held(self, split: bool) -> int:
        """Microbatch-stages whose activations this worker still holds (F done, last gradient not)."""
        done = self.w_done if split else self.b_done
        return sum(self.f_done[s] - done[s] for s in self.stages)


#: ``rule(state, ready) -> action or None``: ``ready`` lists the actions whose inputs are here
Rule = Callable[[WorkerState, list[Action]], Action | None]


def rule_orders(num_stages: int, num_workers: int, microbatches: int,
                worker_of: Callable[[int, int], int], rule: Rule, *, split: bool,
                costs: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> list[list[Action]]:
    """Per worker, the order ``rule`` produces for one minibatch of ``microbatches`` microbatches.

    Args:
        worker_of: ``(stage, microbatch) -> worker`` (a replicated stage names a replica per microbatch).
        split: backward split into ``B`` (input gradient) and ``W`` (weight gradient).
        costs: ticks of ``F``, ``B``, ``W``.

    Raises:
        ScheduleError: the rule left every worker idle with work remaining.
    """
    S, M = num_stages, microbatches
    cost = {"F": costs[0], "B": costs[1], "W": costs[2]}
    mine: dict[tuple[int, int], list[int]] = {}           # (worker, stage) -> its microbatches
    for s in range(S):
        for m in range(M):
            mine.setdefault((worker_of(s, m), s), []).append(m)
    states = [WorkerState(w, tuple(sorted(s for (ww, s) in mine if ww == w))) for w in range(num_workers)]
    for st in states:
        for s in st.stages:
            st.f_done[s] = st.b_done[s] = st.w_done[s] = 0
    done: set[tuple[str, int, int]] = set()
    queues: dict[tuple[int, int], deque[tuple[str, int, int]]] = {}
    pending_w: dict[tuple[int, int], deque[int]] = {k: deque() for k in mine}
    orders: list[list[Action]] = [[] for _ in range(num_workers)]
    free_at = [0.0] * num_workers
    running: list[tuple[float, int, Action]] = []
    total = S * M * 3      # F, B, W of every (stage, microbatch); unsplit, B stands for its W too
    t = 0.0

    def arrived(w: int, kind: str, s: int, m: int) -> bool:
        """Is the input (kind, s, m) here: done on this worker, or at the head of its FIFO."""
        src = worker_of(s, m)
        if src == w:
            return (kind, s, m) in done
        q = queues.get((src, w))
        return q is not None and bool(q) and q[0] == (kind, s, m)

    def ready(st: WorkerState) -> list[Action]:
        w, out = st.worker, []
        for s in st.stages:
            mbs = mine[(w, s)]
            if st.f_done[s] < len(mbs):
                m = mbs[st.f_done[s]]
                if s == 0 or arrived(w, "F", s - 1, m):
                    out.append(Action(s, "F", m))
            if st.b_done[s] < st.f_done[s]:
                m = mbs[st.b_done[s]]
                if s == S - 1 or arrived(w, "B", s + 1, m):
                    out.append(Action(s, "B", m))
            if pending_w[(w, s)]:
                out.append(Action(s, "W", pending_w[(w, s)][0]))
        return out

    while len(done) < total:
        for _end, w, a in sorted(x for x in running if x[0] <= t):
            done.add((a.kind, a.stage, a.microbatch))
            nxt = a.stage + 1 if a.kind == "F" else a.stage - 1
            if a.kind != "W" and 0 <= nxt < S and worker_of(nxt, a.microbatch) != w:
                queues.setdefault((w, worker_of(nxt, a.microbatch)), deque()).append(
                    (a.kind, a.stage, a.microbatch))
        running = [x for x in running if x[0] > t]
        for st in states:
            w = st.worker
            if free_at[w] > t:
                continue
            chosen = rule(st, ready(st))
            if chosen is None:
                continue
            a = chosen
            s, m = a.stage, a.microbatch
            prev = s - 1 if a.kind == "F" else s + 1       # the stage whose output this action takes
            if a.kind != "W" and 0 <= prev < S and worker_of(prev, m) != w:
                queues[(worker_of(prev, m), w)].popleft()
            if a.kind == "F":
                st.f_done[s] += 1
            elif a.kind == "B":
                st.b_done[s] += 1
                if split:
                    pending_w[(w, s)].append(m)
                else:
                    done.add(("W", s, m))   # counted so that ``total`` is reached either way
            else:
                st.w_done[s] += 1
                pending_w[(w, s)].popleft()
            st.last = a
            orders[w].append(a)
            free_at[w] = t + cost[a.kind]
            running.append((free_at[w], w, a))
        later = [x[0] for x in running]
        if not later and len(done) < total:
            left = total - len(done)
            raise ScheduleError(f"the schedule's rule left every worker idle with {left} actions to place "
                                f"({S} stages, M={M}); this rule needs more microbatches or another bound")
        t = min(later) if later else t
    return orders


def pick(order: Sequence[str], ready: list[Action], *, stage_first: Callable[[Action], int] = lambda a: 0,
         allow: Callable[[Action], bool] = lambda a: True) -> Action | None:
    """The first ready action by kind in ``order`` (e.g. ``"BFW"``), ties broken by ``stage_first``
    (lowest first), skipping those ``allow`` refuses."""
    for kind in order:
        cands = sorted((a for a in ready if a.kind == kind and allow(a)), key=stage_first)
        if cands:
            return cands[0]
    return None
