"""DualPipe (DeepSeek-V3 report, §3.2.1) and DualPipeV (Sea AI Lab's "cut in half"), built by rule.

- ``dualpipe``: ``P`` stages (``P`` even) fed from both ends. Stage ``s`` lives on workers ``s`` and
  ``P - 1 - s`` (two copies of its weights, whose gradients are summed at ``U`` like replicas');
  even microbatches run stage ``s`` on worker ``s`` (forward direction), odd ones on worker
  ``P - 1 - s`` (reverse direction). Worker ``w`` hosts two stages: chunk 0, the lower one (stage
  ``min(w, P - 1 - w)`` of the direction entering at ``w``'s end), and chunk 1, the other.
- ``dualpipev``: the same on ``2P`` stages in a V (worker ``w`` hosts stage ``w``, chunk 0, and
  ``2P - 1 - w``, chunk 1, like ZB-V), every microbatch through both arms: one copy of the weights.

With ``H`` half-ranks (``P / 2`` for ``dualpipe``, ``P`` for ``dualpipev``) and ``N`` microbatches per
chunk (``M / 2``, ``M``), every worker follows one rule on a unit-time clock
(:func:`pipelab.schedules.unit_time.rule_orders`):

- **the pair pattern**: the forwards of one chunk and the backwards of the other, taken in the order
  they run, follow ``F^H (F B)^(N-H) B^H`` on every worker. The messages one worker sends its
  neighbour (forwards of one chunk, backwards of the other) are exactly those the neighbour takes
  with that pattern, so every pair of workers handles its messages in one sequence (NCCL's per-pair
  order) by construction. DeepSeek's published order instead lets workers nearer the ends run up to
  ``2H - 1`` warm-up forwards and receives their inputs ahead of use; a runtime that receives in
  action order, as pipelab's does, would deadlock or mismatch on it for ``H >= 3``.
- **F&B**: after a forward of one chunk, the ready backward of the other (DeepSeek's overlapped pair;
  the two stay two actions, priced ``F + B``: docs/schedules.md);
- otherwise a forward, then a backward, the later stage first, then the oldest pending ``W`` (zero
  bubble: ``W`` fills the gaps); no forward while the worker holds ``2H + 1`` stage-microbatches
  (forward done, ``W`` not yet).

A worker thus holds at most ``2H + 1`` stage-microbatches: the report's ``PP + 1`` (``P + 1`` for
``dualpipe``, ``2P + 1`` for ``dualpipev``'s ``2P`` stages). tests/test_published_tables.py checks it
and the bubble against the report's ``(PP/2 - 1)(F&B + B - 3W)``.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.unit_time import Rule, WorkerState, pick, rule_orders
from pipelab.schedules.zero_bubble import flushed, v_worker


def pair_rule(H: int, N: int) -> Rule:
    """The rule above for ``H`` half-ranks and ``N`` microbatches per chunk."""
    def rule(st: WorkerState, ready: list[Action]) -> Action | None:
        lo, hi = min(st.stages), max(st.stages)
        other = {lo: hi, hi: lo}

        def allow(a: Action) -> bool:
            if a.kind == "W":
                return True
            if a.kind == "F":      # the pattern's next element is F while f - b <= H and forwards remain
                f, b = st.f_done[a.stage], st.b_done[other[a.stage]]
                return f - b <= H and st.held(True) < 2 * H + 1
            f, b = st.f_done[other[a.stage]], st.b_done[a.stage]
            return f == N or f - b > H
        last = st.last
        if last is not None and last.kind == "F":
            pair = [a for a in ready if a.kind == "B" and a.stage == other[last.stage] and allow(a)]
            if pair:
                return pair[0]
        return pick("FBW", ready, stage_first=lambda a: -a.stage, allow=allow)
    return rule


def _check(name: str, plan: Plan, M: int, P: int, what: str) -> None:
    if any(r != 1 for r in plan.replicas):
        raise ScheduleError(f"{name} places the stages itself; pass a plan without replicated stages (config "
                            f"'straight'), got {plan.config!r}")
    if M < 2 * P or M % 2:
        raise ScheduleError(f"{name} needs an even number of microbatches >= 2P = {2 * P} ({what}); got "
                            f"{M}: use microbatches={max(2 * P, M + M % 2)}")


def _orders(S: int, P: int, M: int, H: int, N: int,
            worker_of: Callable[[int, int], int]) -> list[list[Action]]:
    return rule_orders(S, P, M, worker_of, pair_rule(H, N), split=True)


def dualpipe(plan: Plan, M: int, K: int) -> Schedule:
    """DualPipe: both directions at once, worker ``w`` holding stages ``w`` and ``P - 1 - w``."""
    P = plan.num_stages
    if P % 2:
        raise ScheduleError(f"dualpipe pairs worker s with worker P-1-s (stage s of one direction with stage "
                            f"s of the other), so it needs an even number of stages; the plan has {P}: use "
                            f"{P + 1}" + (f" or {P - 1}" if P > 2 else "") + " stages (workers)")
    _check("dualpipe", plan, M, P, "half of them enter at each end")
    ranks = tuple((s, P - 1 - s) for s in range(P))
    one = _orders(P, P, M, P // 2, M // 2, lambda s, m: ranks[s][m % 2])
    return flushed("dualpipe", P, ranks, M, K, one, {"bound": P + 1, "overlap": "F&B"})


def dualpipev(plan: Plan, M: int, K: int) -> Schedule:
    """DualPipeV: DualPipe cut in half, ``2P`` stages in a V, F&B pairs across the V's two arms."""
    S = plan.num_stages
    if S % 2:
        raise ScheduleError(f"dualpipev places two stages on every worker in a V, so it needs an even number "
                            f"of stages (2P); the plan has {S}: build it from P workers (an int P)")
    P = S // 2
    _check("dualpipev", plan, M, P, "the published schedule's warm-up fills both arms")
    one = _orders(S, P, M, P, M, lambda s, m: v_worker(s, P))
    return flushed("dualpipev", S, tuple((v_worker(s, P),) for s in range(S)), M, K, one,
                   {"bound": 2 * P + 1, "placement": "v", "overlap": "F&B"})
