"""Searching a zero-bubble order under a per-stage activation budget.

Given per-stage times of ``F`` (forward), ``B`` (input gradient) and ``W`` (weight gradient), the
time ``c`` a message takes between neighbour stages, and a budget of activations per stage (counted in
microbatches: an ``F`` takes one; its ``B`` frees the share ``input_grad_frees`` of it and its ``W``
the rest), find each stage's order of ``m`` microbatches' ``F``, ``B`` and ``W``. The paper's own
scheduler (sail-sg/zero-bubble-pipeline-parallelism, ``auto_schedule.py``: ``mem_f = 2``,
``mem_b = mem_w = -1``, ``max_mem`` = twice the pending backwards, so ZB-1p's ``p`` and ZB-2p's
``2p``) counts half: ``input_grad_frees=0.5``; the default ``0`` (``W`` frees all) is the stricter
count pipelab's runtime holds. Two searches:

- :func:`heuristic_order`: the greedy of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024,
  §3.1 "automatic scheduling"): in the warm-up run as many ``F`` as the budget allows before the first
  ``B`` arrives; then one ``F`` and one ``B`` per round, filling waits with ``W`` (a wait at least
  ``T_W`` long always, a shorter one when it would otherwise become the largest accumulated wait of all
  stages); run ``W`` early when the budget is full; finish with the ``W`` left. Two yes/no knobs (the
  paper's "hyperparameters") are searched over and the best order kept.
- :func:`exact_order`: every order of every stage within the budget (small cases only), the oracle
  the heuristic is checked against.

Invariants: every order keeps each kind in microbatch order and ``F < B < W`` per microbatch, never
holds more activations than the budget, and is timed the paper's way (:func:`evaluate`): an action
starts when its stage is free and its inputs have arrived (``c`` after the producing action ends);
the cost is the longest span of any stage, from its first action's start to its last action's end.
The result is a pipelab :class:`~pipelab.schedules.actions.Schedule` that validates and simulates.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import Costs
from pipelab.schedules.steps import ScheduleError

Node = tuple[str, int, int]        # (kind, stage, microbatch)
Orders = tuple[tuple[tuple[str, int], ...], ...]   # per stage: (kind, microbatch) in order

#: the method name searched schedules carry (not a registry entry: a schedule, not a builder)
METHOD = "zb-search"


@dataclass(frozen=True)
class StageTimes:
    """Per-stage seconds of ``F``, ``B`` (input gradient) and ``W`` (weight gradient), and the seconds
    ``send_s`` a message takes between neighbour stages (latency: messages never queue)."""

    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    send_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("forward", "backward_input", "backward_weight"):
            object.__setattr__(self, name, tuple(float(x) for x in getattr(self, name)))
        n = len(self.forward)
        if n < 1 or len(self.backward_input) != n or len(self.backward_weight) != n:
            raise ScheduleError(f"forward, backward_input and backward_weight need one time per stage, the "
                                f"same count; got {len(self.forward)}, {len(self.backward_input)}, "
                                f"{len(self.backward_weight)}")
        if any(not (x > 0 and math.isfinite(x)) for x in self.forward + self.backward_input
               + self.backward_weight):
            raise ScheduleError("every F, B and W time must be a finite number > 0")
        if not (self.send_s >= 0 and math.isfinite(self.send_s)):
            raise ScheduleError(f"send_s={self.send_s!r} must be a finite number >= 0")

    @classmethod
    def uniform(cls, stages: int, *, forward: float = 1.0, backward_input: float = 1.0,
                backward_weight: float = 1.0, send_s: float = 0.0) -> StageTimes:
        """The same times on every one of ``stages`` stages."""
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise ScheduleError(f"stages={stages!r} must be an int >= 1")
        return cls((forward,) * stages, (backward_input,) * stages, (backward_weight,) * stages, send_s)

    @property
    def stages(self) -> int:
        """Number of stages."""
        return len(self.forward)

    def cost(self, kind: str, stage: int) -> float:
        """Seconds of one ``kind`` action on ``stage``."""
        return {"F": self.forward, "B": self.backward_input, "W": self.backward_weight}[kind][stage]

    def work(self, stage: int, microbatches: int) -> float:
        """Seconds ``stage`` computes for ``microbatches`` microbatches."""
        return microbatches * (self.forward[stage] + self.backward_input[stage] + self.backward_weight[stage])


class StageCosts(Costs):
    """:class:`StageTimes` as the dataflow engine's costs (one worker per stage; messages never queue,
    as in the paper's model, so each link carries as many at once as there are microbatches)."""

    def __init__(self, times: StageTimes, microbatches: int) -> None:
        self.times = times
        self.slots = max(1, 2 * microbatches)

    def compute(self, worker: int, action: Action, split: bool) -> float:
        t = self.times
        if action.kind == "F":
            return t.forward[action.stage]
        if action.kind == "B":
            b = t.backward_input[action.stage]
            return b if split else b + t.backward_weight[action.stage]
        return t.backward_weight[action.stage] if action.kind == "W" else 0.0

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        return (0.0 if src == dst else self.times.send_s), 0

    def channel_slots(self, channel: object) -> int:
        return self.slots

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        return grad_s, 0.0, 0


def evaluate(orders: Orders, times: StageTimes, *, fused: frozenset[int] = frozenset()
             ) -> tuple[float, dict[Node, float]] | None:
    """(cost, end time of every action) of per-stage ``orders``, or None if they deadlock.

    The cost is the paper's: the longest span of any stage from its first start to its last end.
    ``fused``: stages that do not split their backward (each ``B`` takes ``T_B + T_W`` and sends its
    gradient at the end of both; the ``W`` after it takes no time): :func:`fused_stages`."""
    p = len(orders)
    end: dict[Node, float] = {}
    ptr = [0] * p
    free = [0.0] * p
    first = [0.0] * p
    c = times.send_s
    moved = True
    while moved:
        moved = False
        for j in range(p):
            seq = orders[j]
            while ptr[j] < len(seq):
                kind, mb = seq[ptr[j]]
                if kind == "F":
                    deps = [(("F", j - 1, mb), c)] if j > 0 else []
                elif kind == "B":
                    deps = [(("F", j, mb), 0.0)] + ([(("B", j + 1, mb), c)] if j < p - 1 else [])
                else:
                    deps = [(("B", j, mb), 0.0)]
                if any(d not in end for d, _ in deps):
                    break
                start = max([free[j]] + [end[d] + lag for d, lag in deps])
                if ptr[j] == 0:
                    first[j] = start
                dur = times.cost(kind, j)
                if j in fused:
                    dur = 0.0 if kind == "W" else dur + times.backward_weight[j] if kind == "B" else dur
                free[j] = end[(kind, j, mb)] = start + dur
                ptr[j] += 1
                moved = True
    if any(ptr[j] < len(orders[j]) for j in range(p)):
        return None
    return max(free[j] - first[j] for j in range(p) if orders[j]), end


def _freed(input_grad_frees: float) -> float:
    x = float(input_grad_frees)
    if not 0.0 <= x <= 1.0:
        raise ScheduleError(f"input_grad_frees={input_grad_frees!r} is the share of a microbatch's "
                            "activations its B frees (its W frees the rest): give a number in [0, 1] (the "
                            "paper's scheduler: 0.5; pipelab's runtime: 0)")
    return x


def peak_activations(order: Sequence[tuple[str, int]], *, input_grad_frees: float = 0.0) -> float:
    """Most microbatches' activations one stage's order holds at once (``F`` adds one, ``B`` frees
    ``input_grad_frees`` of it, ``W`` the rest)."""
    x = _freed(input_grad_frees)
    live = best = 0.0
    for kind, _ in order:
        live += 1.0 if kind == "F" else -x if kind == "B" else -(1.0 - x) if kind == "W" else 0.0
        best = max(best, live)
    return best


def _budget(budget: float | Sequence[float], p: int, m: int) -> tuple[float, ...]:
    caps = tuple(float(b) for b in budget) if isinstance(budget, Sequence) else (float(budget),) * p
    if len(caps) != p:
        raise ScheduleError(f"activation budget has {len(caps)} entries for {p} stages; give one per stage "
                            "or a single number")
    low = [j for j, b in enumerate(caps) if not b >= 1]
    if low:
        raise ScheduleError(f"an activation budget of {caps[low[0]]:g} microbatches on stage {low[0]} is "
                            "below what any order needs: every stage holds at least 1 microbatch's "
                            "activations (F, then B, then W of one microbatch at a time); give a budget >= 1 "
                            "per stage")
    return caps


def _microbatches(m: int) -> int:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ScheduleError(f"microbatches={m!r} must be an int >= 1")
    return m


class _Placer:
    """The greedy's state: per stage what is placed, when it ends, and the activations held."""

    def __init__(self, times: StageTimes, m: int, caps: tuple[float, ...], freed_by_b: float) -> None:
        p = times.stages
        self.times, self.m, self.caps, self.freed_by_b = times, m, caps, freed_by_b
        self.count = {k: [0] * p for k in "FBW"}
        self.end = [0.0] * p
        self.t: dict[Node, float] = {}
        self.order: list[list[tuple[str, int]]] = [[] for _ in range(p)]
        self.waited = [0.0] * p

    def live(self, j: int) -> float:
        x = self.freed_by_b
        return self.count["F"][j] - x * self.count["B"][j] - (1.0 - x) * self.count["W"][j]

    def arrival(self, kind: str, j: int) -> float:
        """When the input of stage ``j``'s next ``kind`` is there (its producer must be placed)."""
        i, c, last = self.count[kind][j], self.times.send_s, self.times.stages - 1
        if kind == "F":
            return self.t[("F", j - 1, i)] + c if j > 0 else 0.0
        if kind == "B":
            return self.t[("B", j + 1, i)] + c if j < last else self.t[("F", j, i)]
        return self.t[("B", j, i)]

    def put(self, j: int, kind: str) -> None:
        i = self.count[kind][j]
        start = max(self.end[j], self.arrival(kind, j))
        if self.order[j]:
            self.waited[j] += start - self.end[j]
        self.end[j] = self.t[(kind, j, i)] = start + self.times.cost(kind, j)
        self.count[kind][j] += 1
        self.order[j].append((kind, i))

    def fill(self, j: int, kind: str, fill_short: bool) -> None:
        """Place ``W``s on stage ``j`` while it would otherwise wait for its next ``kind``'s input."""
        w_cost = self.times.backward_weight[j]
        if kind == "F":       # the budget first: an F needs room for one more microbatch
            while self.live(j) + 1 > self.caps[j] + 1e-9:
                if self.count["W"][j] >= self.count["B"][j]:
                    raise ScheduleError(f"stage {j} holds {self.live(j):g} microbatches' activations with no "
                                        f"W left to free them: the budget {self.caps[j]:g} is too small")
                self.put(j, "W")
        arrive = self.arrival(kind, j)
        while self.count["W"][j] < self.count["B"][j] and self.end[j] + w_cost <= arrive:
            self.put(j, "W")
        if self.count["W"][j] < self.count["B"][j] and self.end[j] < arrive:
            gap = arrive - self.end[j]
            # a wait shorter than W: fill it anyway when it would become the largest wait of all stages
            if fill_short or self.waited[j] + gap > max(self.waited):
                self.put(j, "W")


def heuristic_order(times: StageTimes, microbatches: int, budget: float | Sequence[float], *,
                    eager_warmup: bool, fill_short_waits: bool, input_grad_frees: float = 0.0) -> Orders:
    """The paper's greedy order for one setting of its two knobs.

    Args:
        eager_warmup: in the warm-up, start another ``F`` while the first ``B``'s input has not
            arrived even if that ``F`` then delays it (by less than ``T_F``); else only ``F`` that end
            before it arrives.
        fill_short_waits: fill every wait shorter than ``T_W`` with a ``W``; else only those that would
            become the largest accumulated wait of all stages.
        input_grad_frees: the share of a microbatch's activations its ``B`` frees (its ``W`` the rest).
    """
    m = _microbatches(microbatches)
    p = times.stages
    caps = _budget(budget, p, m)
    st = _Placer(times, m, caps, _freed(input_grad_frees))
    for j in range(p):
        st.put(j, "F")
    # warm-up: extra forwards per stage before its first backward's input arrives (walking back)
    extra = [0] * p
    b_end = st.t[("F", p - 1, 0)] + times.backward_input[p - 1]
    for j in range(p - 2, -1, -1):
        end, n = st.end[j], 0
        arrive = b_end + times.send_s
        while 1 + n < m and 1 + n + 1 <= caps[j]:
            fits = end < arrive if eager_warmup else end + times.forward[j] <= arrive
            if not fits:
                break
            end += times.forward[j]
            n += 1
        extra[j] = n
        b_end = max(end, arrive) + times.backward_input[j]
    for j in range(1, p):            # stage j runs fewer forwards than stage j-1 (it feeds them)
        extra[j] = max(0, min(extra[j], extra[j - 1] - 1)) if 1 + extra[j - 1] < m else extra[j]
    for j in range(p):
        for _ in range(extra[j]):
            st.put(j, "F")
    for j in range(p - 1, -1, -1):
        st.put(j, "B")
    for i in range(1, m):
        for j in range(p):
            if st.count["F"][j] < m:
                st.fill(j, "F", fill_short_waits)
                st.put(j, "F")
        for j in range(p - 1, -1, -1):
            if st.count["B"][j] != i:
                raise ScheduleError(f"internal: stage {j} has {st.count['B'][j]} backwards in round {i}")
            st.fill(j, "B", fill_short_waits)
            st.put(j, "B")
    for j in range(p):
        while st.count["W"][j] < m:
            st.put(j, "W")
    return tuple(tuple(o) for o in st.order)


def _fits(f: int, b: int, w: int, cap: float, x: float) -> bool:
    """May a stage that has run ``f`` F, ``b`` B and ``w`` W start another ``F`` under ``cap``?"""
    return f - x * b - (1.0 - x) * w + 1 <= cap + 1e-9


def _stage_orders(m: int, cap: float, x: float = 0.0) -> list[tuple[tuple[str, int], ...]]:
    """Every order of one stage's ``m`` microbatches (each kind in microbatch order, ``F < B < W`` per
    microbatch) holding at most ``cap`` activations (``B`` frees the share ``x``)."""
    out: list[tuple[tuple[str, int], ...]] = []

    def rec(f: int, b: int, w: int, acc: list[tuple[str, int]]) -> None:
        if w == m:
            out.append(tuple(acc))
            return
        if f < m and _fits(f, b, w, cap, x):
            rec(f + 1, b, w, [*acc, ("F", f)])
        if b < f:
            rec(f, b + 1, w, [*acc, ("B", b)])
        if w < b:
            rec(f, b, w + 1, [*acc, ("W", w)])
    rec(0, 0, 0, [])
    return out


def _count_orders(m: int, cap: float, x: float = 0.0) -> int:
    """How many orders :func:`_stage_orders` would list (counted without listing them)."""
    @functools.cache
    def n(f: int, b: int, w: int) -> int:
        if w == m:
            return 1
        return ((n(f + 1, b, w) if f < m and _fits(f, b, w, cap, x) else 0) + (n(f, b + 1, w) if b < f else 0)
                + (n(f, b, w + 1) if w < b else 0))
    return n(0, 0, 0)


#: the most order combinations :func:`exact_order` tries
EXACT_LIMIT = 200_000


def exact_order(times: StageTimes, microbatches: int, budget: float | Sequence[float], *,
                limit: int = EXACT_LIMIT, input_grad_frees: float = 0.0) -> tuple[float, Orders]:
    """(cost, orders) of the best orders within ``budget``, by trying every combination of every stage's
    orders; refuses cases with more than ``limit`` combinations (use :func:`search_order`'s heuristic)."""
    m = _microbatches(microbatches)
    p = times.stages
    caps = _budget(budget, p, m)
    x = _freed(input_grad_frees)
    n = math.prod(_count_orders(m, cap, x) for cap in caps)
    if n > limit:
        raise ScheduleError(f"the exact search would try {n} order combinations for {p} stages and {m} "
                            f"microbatches (limit {limit}); it is for small cases: use search_order(..., "
                            "exact=False), the heuristic, or fewer stages/microbatches")
    per_stage = [_stage_orders(m, cap, x) for cap in caps]
    best: tuple[float, Orders] | None = None
    for combo in itertools.product(*per_stage):
        got = evaluate(combo, times)
        if got is not None and (best is None or got[0] < best[0] - 1e-12):
            best = (got[0], combo)
    if best is None:
        raise ScheduleError(f"no order of {m} microbatches fits the budget {caps}")
    return best


@dataclass(frozen=True)
class SearchResult:
    """A searched order: its ``schedule``, ``cost`` (longest stage span, the paper's), ``bubble_rate``
    ``(cost - most stage work) / cost``, the most activations each stage holds (in microbatches, counted
    as the search was told: ``input_grad_frees``), and the knobs that won."""

    schedule: Schedule
    cost: float
    bubble_rate: float
    peak_activations: tuple[float, ...]
    budget: tuple[float, ...]
    how: str
    knobs: dict[str, bool] = field(default_factory=dict)


def to_schedule(orders: Orders, microbatches: int, *, budget: Sequence[float] = (),
                input_grad_frees: float = 0.0) -> Schedule:
    """Per-stage orders as a one-minibatch pipelab Schedule (one worker per stage, a ``U`` at the end);
    its options record the budget and how it was counted."""
    p = len(orders)
    acts = tuple(tuple(Action(j, k, i) for k, i in orders[j]) + (Action(j, "U", 0),) for j in range(p))
    return Schedule(method=METHOD, num_stages=p, stage_ranks=tuple((j,) for j in range(p)),
                    microbatches=microbatches, minibatches=1, actions=acts,
                    options={"allreduce": False, "weights": "single", "split_backward": True,
                             "activation_budget": list(budget), "input_grad_frees": float(input_grad_frees)})


def search_order(times: StageTimes, microbatches: int, budget: float | Sequence[float], *,
                 exact: bool = False, input_grad_frees: float = 0.0) -> SearchResult:
    """The best order of ``microbatches`` microbatches within ``budget`` activations per stage.

    Args:
        times: per-stage F, B, W seconds and the message time.
        budget: microbatches' activations each stage may hold (one number for all stages, or one per
            stage); below 1 on any stage is refused (no order fits).
        exact: try every order (small cases) instead of the paper's greedy over its two knobs.
        input_grad_frees: the share of a microbatch's activations its ``B`` frees, its ``W`` the rest
            (0: pipelab's runtime, which frees at ``W``; 0.5: the Zero Bubble paper's scheduler, whose
            ZB-1p and ZB-2p are ``budget`` = ``p`` and ``2p`` in this count).
    """
    m = _microbatches(microbatches)
    p = times.stages
    caps = _budget(budget, p, m)
    knobs: dict[str, bool] = {}
    if exact:
        cost, orders = exact_order(times, m, caps, input_grad_frees=input_grad_frees)
        how = "exact"
    else:
        best: tuple[float, Orders, dict[str, bool]] | None = None
        for eager, fill in itertools.product((False, True), repeat=2):
            cand = heuristic_order(times, m, caps, eager_warmup=eager, fill_short_waits=fill,
                                   input_grad_frees=input_grad_frees)
            got = evaluate(cand, times)
            if got is None:
                raise ScheduleError("internal: the greedy built a deadlocking order")
            if best is None or got[0] < best[0] - 1e-12:
                best = (got[0], cand, {"eager_warmup": eager, "fill_short_waits": fill})
        assert best is not None
        cost, orders, knobs = best
        how = "heuristic"
    work = max(times.work(j, m) for j in range(p))
    peaks = tuple(peak_activations(o, input_grad_frees=input_grad_frees) for o in orders)
    sch = to_schedule(orders, m, budget=caps, input_grad_frees=input_grad_frees)
    return SearchResult(schedule=sch, cost=cost, bubble_rate=(cost - work) / cost, peak_activations=peaks,
                        budget=caps, how=how, knobs=knobs)


def fused_stages(schedule: Schedule) -> frozenset[int]:
    """The stages of ``schedule`` that do not split their backward into ``B`` and ``W``."""
    split = {a.stage for acts in schedule.actions for a in acts if a.kind == "W"}
    return frozenset(range(schedule.num_stages)) - split


def orders_of(schedule: Schedule) -> Orders:
    """A one-worker-per-stage schedule's per-stage orders of ``F``, ``B``, ``W`` (``U`` left out; a
    stage that does not split its backward gets each ``W`` right after its ``B``: time them with
    ``evaluate(..., fused=fused_stages(schedule))``)."""
    if any(len(r) != 1 for r in schedule.stage_ranks) or schedule.num_workers != schedule.num_stages:
        raise ScheduleError("orders_of needs one worker per stage (a straight pipeline)")
    out: list[tuple[tuple[str, int], ...]] = []
    for j in range(schedule.num_stages):
        w = schedule.stage_ranks[j][0]
        acts = [a for a in schedule.actions[w] if a.kind != "U"]
        split = any(a.kind == "W" for a in acts)
        seq: list[tuple[str, int]] = []
        for a in acts:      # an unsplit B is B then W at once: the same times
            seq += [(a.kind, a.microbatch)] + ([("W", a.microbatch)] if a.kind == "B" and not split else [])
        out.append(tuple(seq))
    return tuple(out)
