"""Zero-bubble schedules beyond ZB-H1 (Qi et al., ICLR'24): ``zb-h2`` and ``zb-v``, built by rule.

Both split the backward into ``B`` (input gradient, on the critical path) and ``W`` (weight gradient,
free to move) and flush every minibatch (one ``U`` per stage). Each worker follows one rule on a unit-
time clock (:func:`pipelab.schedules.unit_time.rule_orders`): a ready ``B`` first, then a forward
while the microbatches it holds (forward done, ``W`` not yet) stay under a bound, then a pending
``W``. The orders hold NCCL's per-pair message order by construction.

- ``zb-h2`` (§3.1): one stage per worker, bound ``2P - 1`` on every stage, the paper's ``2P`` peak
  activation memory. With equal ``F``, ``B``, ``W`` and ``M >= 2P`` every worker is busy without a
  gap from its first action to its last (the parallelogram of the paper's Figure 3)::

      P=2, M=4   w0: F0 F1 F2 B0 W0 B1 F3 B2 W1 W2 B3 W3
                 w1: F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3

- ``zb-v`` (§4): ``2P`` stages in a V, worker ``w`` hosting stages ``w`` and ``2P - 1 - w`` (so the
  first and last stage share worker 0); the later stage's action first; only stage 0's forward (a new
  microbatch) waits for the worker to hold under ``P + 1`` stage-microbatches, so the bound never
  blocks a message at the head of its queue. With equal ``F``, ``B``, ``W`` and ``P`` dividing ``M``
  it takes exactly as long as torch's ``ScheduleZBVZeroBubble`` (no bubble but the fill), holding at
  most two stage-microbatches more (tests/test_schedule_golden.py).
"""

from __future__ import annotations

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.unit_time import Rule, WorkerState, pick, rule_orders


def flushed(method: str, S: int, ranks: tuple[tuple[int, ...], ...], M: int, K: int,
             one: list[list[Action]], options: dict[str, object]) -> Schedule:
    """``one`` minibatch's orders repeated ``K`` times, each worker's ``U`` per hosted stage after it
    (a stage on two workers, as in DualPipe, all-reduces its gradients there)."""
    lists: list[list[Action]] = [[] for _ in one]
    for w, acts in enumerate(one):
        hosted = sorted({a.stage for a in acts})
        for k in range(K):
            lists[w] += [Action(a.stage, a.kind, k * M + a.microbatch) for a in acts]
            lists[w] += [Action(s, "U", k) for s in hosted]
    return Schedule(method=method, num_stages=S, stage_ranks=ranks, microbatches=M, minibatches=K,
                    actions=tuple(tuple(a) for a in lists),
                    options={"allreduce": any(len(r) > 1 for r in ranks), "weights": "single",
                             "split_backward": True, **options})


def _straight(plan: Plan, name: str) -> None:
    if any(r != 1 for r in plan.replicas):
        raise ScheduleError(f"{name} needs a plan without replicated stages (config 'straight'); got "
                            f"{plan.config!r}")


def _enough(name: str, M: int, P: int) -> None:
    if M < P:
        raise ScheduleError(f"{name} needs microbatches >= the {P} workers (every worker must have a "
                            f"microbatch in flight to fill its bubbles); got {M}: use microbatches={P} or "
                            "more")


def zb_h2(plan: Plan, M: int, K: int) -> Schedule:
    """ZB-H2: ZB-H1's split backward with ``2P - 1`` microbatches in flight on every stage."""
    _straight(plan, "zb-h2")
    P = plan.num_stages
    _enough("zb-h2", M, P)
    bound = 2 * P - 1

    def rule(st: WorkerState, ready: list[Action]) -> Action | None:
        return pick("BFW", ready, allow=lambda a: a.kind != "F" or st.held(True) < bound)

    one = rule_orders(P, P, M, lambda s, m: s, rule, split=True)
    return flushed("zb-h2", P, tuple((s,) for s in range(P)), M, K, one, {"bound": bound})


def v_worker(stage: int, workers: int) -> int:
    """The worker of ``stage`` in a V over ``workers``: ``w`` hosts stages ``w`` and ``2P - 1 - w``."""
    return stage if stage < workers else 2 * workers - 1 - stage


def zb_v(plan: Plan, M: int, K: int) -> Schedule:
    """ZB-V: two stages per worker in a V, split backward, new microbatches admitted while the worker
    holds fewer than ``P + 1`` stage-microbatches."""
    _straight(plan, "zb-v")
    S = plan.num_stages
    if S % 2:
        raise ScheduleError(f"zb-v places two stages on every worker in a V, so it needs an even number of "
                            f"stages (2P); the plan has {S}: build it from P workers (an int P, or "
                            "simulate with a plan of P stages: it is re-split into 2P)")
    P = S // 2
    _enough("zb-v", M, P)
    bound = P + 1
    one = rule_orders(S, P, M, lambda s, m: v_worker(s, P), v_rule(bound), split=True)
    return flushed("zb-v", S, tuple((v_worker(s, P),) for s in range(S)), M, K, one,
                   {"bound": bound, "placement": "v"})


def later_first(a: Action) -> int:
    """Tie-break of the V rules: the later stage's action first (its microbatch is nearer the end)."""
    return -a.stage


def v_rule(bound: int) -> Rule:
    """ZB-V's rule: a ready ``B``, else a forward (only stage 0's, which admits a new microbatch, waits
    for the worker to hold under ``bound`` stage-microbatches), else a pending ``W``."""
    def rule(st: WorkerState, ready: list[Action]) -> Action | None:
        return pick("BFW", ready, stage_first=later_first,
                    allow=lambda a: a.kind != "F" or a.stage > 0 or st.held(True) < bound)
    return rule
