"""What the accuracy matrix measures on a trace, the same way for a simulated and a real one, and the
replay that tells which term an error comes from (:mod:`reproductions.sim_accuracy.accuracy` runs the matrix).

* :func:`steady_window`, :func:`steady_throughput`, :func:`busy_by_worker`: the steady-state window
  of minibatch completions (warm-up and drain excluded), samples per second, busy time per worker;
* :class:`MeasuredActions`, :func:`replay_throughput`: the schedule simulated with the real run's
  action durations, which separates the error of the durations from that of messages and waits.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pipelab.metrics as metrics
from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules.actions import Action
from pipelab.sim.simulate import ProfileCosts, simulate_schedule, virtual_plan
from pipelab.trace import Trace

#: the optimizer the matrix trains with, as the cost model names it (the replay prices its ``U``)
OPTIMIZER = "sgd-momentum"


# ---------------------------------------------------------------------- one measure for both traces
def steady_window(trace: Trace, schedule: Any) -> tuple[float, float, int]:
    """:meth:`Trace.steady_window` skipping the schedule's warm-up and drain
    (:meth:`~pipelab.schedules.actions.Schedule.warmup_minibatches`, as the simulator does): the same
    window for a simulated and a measured trace of ``schedule``."""
    return trace.steady_window(schedule.warmup_minibatches())


def steady_throughput(trace: Trace, schedule: Any, batch: int) -> float:
    """Samples per second over :func:`steady_window` (:meth:`Trace.steady_throughput`)."""
    return trace.steady_throughput(batch, schedule.warmup_minibatches())


def busy_by_worker(trace: Trace, schedule: Any) -> dict[int, float]:
    """Per worker, busy seconds (compute actions) per minibatch over :func:`steady_window`."""
    start, end, n = steady_window(trace, schedule)
    busy = metrics.busy_time(trace.compute_events(), range(schedule.num_workers), start, end)
    return {w: b / n for w, b in busy.items()}


# ------------------------------------------------------------ which term: a replay with measured actions
class MeasuredActions(ProfileCosts):
    """The simulator's transfers, but every compute action takes what it took in the real run (the
    mean per worker, stage and kind over ``window``; an all-reduce what the run's ``allreduce``
    events say, :meth:`allreduce`):
    replaying the schedule with it separates the error of the action durations from that of
    everything else (messages, waiting).

    The mean, not the median: a runtime action's time includes its sends' ``isend`` calls, and over
    gloo on a shared 2-core CPU a few of those block for 1-5 ms (two workers sending to each other
    at once; see ``reproductions/sim_accuracy/README.md``). Those rare long actions are real busy
    time of the worker; a median drops them and makes the replay look like a messaging error.
    ``window``: ``(start, end)`` seconds; actions starting inside it count (default: all)."""

    def __init__(self, run_trace: Trace, model: CostModel, ranges: list[tuple[int, int]],
                 microbatches: int, window: tuple[float, float] | None = None) -> None:
        super().__init__(model, ranges, microbatches)
        lo, hi = window if window is not None else (-math.inf, math.inf)
        per: dict[tuple[int, int, str], list[float]] = {}
        every: dict[tuple[int, int, str], list[float]] = {}
        for e in run_trace.compute_events():
            key = (e.worker, e.stage, e.kind)
            every.setdefault(key, []).append(e.end_s - e.start_s)
            if lo <= e.start_s < hi:
                per.setdefault(key, []).append(e.end_s - e.start_s)
        # a kind with no action inside the window (e.g. one U per run) falls back to all of its actions
        self.durations = {k: statistics.fmean(per.get(k) or v) for k, v in every.items()}
        # an all-reduce as the last replica to arrive has it (the others' events also hold their wait)
        groups: dict[tuple[int, int], list[float]] = {}
        for e in run_trace.events:
            if e.kind == "allreduce" and lo <= e.start_s < hi:
                groups.setdefault((e.stage, e.microbatch), []).append(e.end_s - e.start_s)
        by_stage: dict[int, list[float]] = {}
        for (stage, _), ds in groups.items():
            by_stage.setdefault(stage, []).append(min(ds))
        self.allreduce_s = {s: statistics.fmean(v) for s, v in by_stage.items()}

    def compute(self, worker: int, action: Action, split: bool) -> float:
        """The measured mean duration of this worker's actions of this stage and kind."""
        return self.durations[(worker, action.stage, action.kind)]

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """The measured all-reduce of the stage (the mean over the window of each step's shortest
        ``allreduce`` event: the last replica to arrive waits for no one), after the last gradient."""
        comm = self.allreduce_s.get(stage, 0.0)
        return grad_s + comm, comm, 0


def replay_throughput(run: Any, sim: Any, plan: Plan, prof: Profile, cluster: Cluster, batch: int) -> float:
    """Samples/s of the schedule simulated with the real run's action durations (:class:`MeasuredActions`)."""
    sch = sim.schedule
    if sch.num_stages == 1:
        ranges = [(0, len(prof))]
    else:
        vplan = virtual_plan(plan, prof, sch.num_stages // plan.num_stages) \
            if sch.num_stages != plan.num_stages else plan
        ranges = [(st.start, st.end) for st in vplan.stages]
    cm = CostModel(prof, cluster, optimizer=OPTIMIZER, allreduce_overlap="none")
    micro = 1 if sch.num_stages == 1 else sch.microbatches
    window = steady_window(run.trace, run.schedule)[:2]
    res = simulate_schedule(sch, MeasuredActions(run.trace, cm, ranges, micro, window), batch_size=batch)
    res.trace.meta.update(microbatches=sch.microbatches, minibatches=sch.minibatches)
    return steady_throughput(res.trace, sch, batch)


__all__ = ["OPTIMIZER", "MeasuredActions", "busy_by_worker", "replay_throughput",
           "steady_throughput", "steady_window"]
