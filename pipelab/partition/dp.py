"""The data-parallel baseline: one stage, every worker a replica of the whole model.

Its predicted time per minibatch is one replica's minibatch time (forward, then backward with the
gradient all-reduce overlapped DDP-style, or after backward with ``allreduce_overlap="none"``,
:meth:`CostModel.replica_time_s`) divided by the number of
replicas, since the ``W`` replicas process ``W`` minibatches at once. The pipelined plans use the
same replica formula for their replicated stages, so ``speedup_over_dp`` compares like with like.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.partition.predict import build_plan, check_memory, dp_time_s


def partition_dp(
    cm: CostModel, *, workers: Sequence[int] | None = None, memory_limit: float | None = None
) -> Plan:
    """The data-parallel plan (config ``"W"``) with predictions; raises if the model does not fit."""
    ws = list(workers) if workers is not None else list(range(cm.cluster.num_workers))
    t = dp_time_s(cm, ws)
    plan = build_plan(cm, [], [len(ws)], method="dp", schedule="async", versions="one", in_flight=[1],
                      ranks_of=ws if workers is not None else None, dp_time=t)
    check_memory(plan, cm, memory_limit, ws)
    return plan
