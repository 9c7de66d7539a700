"""DualPipe (DeepSeek-V3 report, §3.2.1) and DualPipeV (Sea AI Lab's "cut in half"), built by rule.

- ``dualpipe``: ``P`` stages (``P`` even) fed from both ends. Stage ``s`` lives on workers ``s`` and
  ``P - 1 - s`` (two copies of its weights, whose gradients are summed at ``U`` like replicas');
  even microbatches run stage ``s`` on worker ``s`` (forward direction), odd ones on worker
  ``P - 1 - s`` (reverse direction), so every worker hosts one stage of each direction.
- ``dualpipev``: the same pairing on ``2P`` stages in a V (worker ``w`` hosts stages ``w`` and
  ``2P - 1 - w``, like ZB-V): one copy of the weights.

Both split the backward into ``B`` and ``W`` and follow one rule per worker on a unit-time clock
(:func:`pipelab.schedules.unit_time.rule_orders`, per-pair message order by construction): after a
forward of one direction (or chunk), the ready backward of the other one comes next (DualPipe's
"F&B" pair, whose two halves hide each other's communication); otherwise ZB-V's rule: a ready
backward, then a forward (stage 0's, which admits a new microbatch, only while the worker holds under
a bound: ``P + 1`` stage-microbatches for ``dualpipe``, ``2P + 2`` for ``dualpipev``), then a pending
``W``. With equal ``F``, ``B``, ``W``, ``dualpipev`` takes as long as torch's ``ScheduleDualPipeV``
where both build (tests/test_schedule_golden.py) but holds more activations. The pair stays two
actions: docs/schedules.md says how it is priced.
"""

from __future__ import annotations

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.unit_time import Rule, WorkerState, rule_orders
from pipelab.schedules.zero_bubble import flushed, v_rule, v_worker


def _pair_rule(bound: int, other: dict[int, int]) -> Rule:
    """The F&B rule: ``other[stage]`` names the stage whose backward pairs with a forward of ``stage``;
    otherwise ZB-V's rule (:func:`pipelab.schedules.zero_bubble.v_rule`)."""
    rest = v_rule(bound)

    def rule(st: WorkerState, ready: list[Action]) -> Action | None:
        last = st.last
        if last is not None and last.kind == "F":
            pair = [a for a in ready if a.kind == "B" and a.stage == other[last.stage]]
            if pair:
                return pair[0]
        return rest(st, ready)
    return rule


def _check(name: str, plan: Plan, M: int, P: int, what: str) -> None:
    if any(r != 1 for r in plan.replicas):
        raise ScheduleError(f"{name} places the stages itself; pass a plan without replicated stages (config "
                            f"'straight'), got {plan.config!r}")
    if M < 2 * P or M % 2:
        raise ScheduleError(f"{name} needs an even number of microbatches >= 2P = {2 * P} ({what}); got "
                            f"{M}: use microbatches={max(2 * P, M + M % 2)}")


def dualpipe(plan: Plan, M: int, K: int) -> Schedule:
    """DualPipe: both directions at once, worker ``w`` holding stages ``w`` and ``P - 1 - w``."""
    P = plan.num_stages
    if P % 2:
        raise ScheduleError(f"dualpipe pairs worker s with worker P-1-s (stage s of one direction with stage "
                            f"s of the other), so it needs an even number of stages; the plan has {P}: use "
                            f"{P + 1}" + (f" or {P - 1}" if P > 2 else "") + " stages (workers)")
    _check("dualpipe", plan, M, P, "half of them enter at each end")
    ranks = tuple((s, P - 1 - s) for s in range(P))

    def worker_of(s: int, m: int) -> int:
        return ranks[s][m % 2]
    # a forward of stage s on worker w pairs with the backward of the other stage w hosts
    other = {s: P - 1 - s for s in range(P)}
    bound = P + 1
    one = rule_orders(P, P, M, worker_of, _pair_rule(bound, other), split=True)
    return flushed("dualpipe", P, ranks, M, K, one, {"bound": bound, "overlap": "F&B"})


def dualpipev(plan: Plan, M: int, K: int) -> Schedule:
    """DualPipeV: DualPipe cut in half, ``2P`` stages in a V, F&B pairs across the V's two arms."""
    S = plan.num_stages
    if S % 2:
        raise ScheduleError(f"dualpipev places two stages on every worker in a V, so it needs an even number "
                            f"of stages (2P); the plan has {S}: build it from P workers (an int P)")
    P = S // 2
    _check("dualpipev", plan, M, P, "the published schedule's warm-up fills both arms")
    other = {s: S - 1 - s for s in range(S)}
    bound = 2 * P + 2
    one = rule_orders(S, P, M, lambda s, m: v_worker(s, P), _pair_rule(bound, other), split=True)
    return flushed("dualpipev", S, tuple((v_worker(s, P),) for s in range(S)), M, K, one,
                   {"bound": bound, "placement": "v", "overlap": "F&B"})
