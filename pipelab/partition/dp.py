"""The data-parallel baseline: one stage, every worker a replica of the whole model.

Its time per minibatch is one replica's (:meth:`CostModel.replica_time_s`) over the replicas, the
same formula as the pipelined plans' replicated stages, so ``speedup_over_dp`` compares like with like.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.partition.predict import build_plan, check_memory


def partition_dp(cm: CostModel, *, workers: Sequence[int] | None = None,
                 memory_limit: float | None = None) -> Plan:
    """The data-parallel plan (config ``"W"``) with predictions; raises if the model does not fit."""
    ws = list(workers) if workers is not None else list(range(cm.cluster.num_workers))
    plan = build_plan(cm, [], [len(ws)], method="dp", ranks_of=ws if workers is not None else None)
    check_memory(plan, cm, memory_limit, ws)
    return plan
