"""HetPipe (Park et al., USENIX ATC'20): virtual workers (VWs), each a PipeDream pipeline.

Replica ``v`` of every stage belongs to VW ``v``; minibatch ``m`` goes to VW ``m % V``. Inside a VW:
PipeDream's order and weight stashing over its local updates; no all-reduce across VWs, which
synchronise through a parameter server every ``wave`` minibatches with staleness bound ``D``
(``schedule.options``; the runtime applies them).
"""

from __future__ import annotations

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Schedule
from pipelab.schedules.async_ import per_minibatch_async
from pipelab.schedules.steps import ScheduleError


def hetpipe(plan: Plan, K: int, D: int = 0) -> Schedule:
    """Build the HetPipe schedule: PipeDream inside each virtual worker, no all-reduce across them."""
    reps = set(plan.replicas)
    if len(reps) != 1:
        raise ScheduleError(f"hetpipe needs every stage to have the same replica count V (one replica per "
                            f"virtual worker); this plan has {plan.config!r} - use pl.partition(..., "
                            f"method='hetpipe')")
    if D < 0:
        raise ScheduleError(f"hetpipe staleness bound D={D} must be >= 0")
    V = reps.pop()
    wave = plan.num_stages   # minibatches in flight inside one VW (its NOAM)
    return per_minibatch_async(plan, "hetpipe", K, allreduce=False,
                               extra={"virtual_workers": V, "wave": wave, "D": D})
