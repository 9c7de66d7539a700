"""HetPipe (Park et al., USENIX ATC'20): virtual workers (VWs), each a PipeDream pipeline.

Simplest form compatible with ``pipelab.partition.hetero``: every stage has ``V`` replicas and
replica ``v`` of each stage belongs to virtual worker ``v``; microbatch (= minibatch) ``m`` goes
to VW ``m % V`` (``Schedule.worker_of``). Inside a VW the order and versions are PipeDream's
(1F1B, ``U`` after each ``B``, weight stashing over the VW's *local* updates). Replicas do **not**
all-reduce: VWs synchronize through a parameter server at wave boundaries under HetPipe's
Wave Synchronous Parallel model, every ``wave`` minibatches of a VW (``wave`` = NOAM of the VW)
with staleness bound ``D`` (``schedule.options["wave"]``, ``["D"]``; the runtime applies them).
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
