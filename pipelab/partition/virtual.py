"""Virtual stages: a plan re-split into ``v`` stages per worker (interleaved 1F1B, ZB-V, DualPipeV).

A schedule that places ``v`` stages on each of ``P`` workers runs on ``v * P`` stages of the model;
:func:`virtual_plan` cuts them from the profile so that every stage's forward-plus-backward time is
balanced (:func:`pipelab.partition.balance.balance_by_time`). Which worker hosts which of them is the
schedule builder's choice (a loop for interleaving, a V for ZB-V and DualPipeV), not the plan's.
"""

from __future__ import annotations

from pipelab.partition.balance import balance_by_time
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile


def virtual_plan(plan: Plan, profile: Profile, stages_per_worker: int) -> Plan:
    """``stages_per_worker * P`` stages of balanced compute for ``plan``'s ``P`` workers.

    Raises:
        ValueError: the model has fewer layers than the virtual stages it needs.
    """
    v = stages_per_worker
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"stages_per_worker={v!r} must be an int >= 1")
    n_st = v * plan.num_stages
    if n_st > len(profile):
        raise ValueError(f"{v} stages per worker on {plan.num_stages} workers needs {n_st} virtual stages "
                         f"but the model has {len(profile)} layers; use fewer stages per worker (chunks) or "
                         "fewer workers")
    sizes = balance_by_time(n_st, [layer.fwd_s + layer.bwd_s for layer in profile.layers])
    bounds = [sum(sizes[:i]) for i in range(1, n_st)]
    return Plan.from_boundaries(len(profile), bounds, batch_size=plan.batch_size, method="virtual")
