"""Calibrate the model at hand: how much longer its layers take inside a real run than profiled.

In a two-worker ``1f1b-flush`` run of the model cut in two, per kind, the median over actions and then
over rounds of ``(duration - the runtime's own work) / the profiled layers' time`` is
``Calibration.compute_factor``; the cost model multiplies the profile's times by it (``W`` by ``B``'s).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipelab.calibrate.fit import spread
from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.measured import FACTOR_KINDS
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.runtime import train
from pipelab.trace import Trace


@dataclass(frozen=True)
class ModelRuns:
    """How :func:`calibrate_model` runs the model: rounds, minibatches and microbatches per round, backend."""

    repeats: int = 3
    steps: int = 12
    microbatches: int = 4
    backend: str = "gloo"
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.repeats, int) or self.repeats < 2:
            raise ValueError(f"repeats={self.repeats!r} must be an int >= 2 (the spread needs two rounds)")
        if not isinstance(self.steps, int) or self.steps < 3:
            raise ValueError(f"steps={self.steps!r} must be an int >= 3 (the first minibatch warms up)")


def _unscaled(cluster: Cluster) -> Cluster:
    """``cluster`` with its calibration's compute factors removed (the profile's own times)."""
    cal = cluster.calibration
    if cal is None:
        raise ValueError("calibrate_model needs a calibrated cluster (pl.calibrate() first): the runtime's "
                         "own work per action is taken off the measured durations")
    return dataclasses.replace(cluster, calibration=dataclasses.replace(cal, compute_factor={}))


def factors(trace: Trace, ranges: Sequence[tuple[int, int]], model: CostModel, microbatches: int,
            skip_minibatches: int = 1) -> dict[str, float]:
    """Per kind (``F``, ``B``), the median factor over ``trace``'s actions past ``skip_minibatches``."""
    per: dict[str, list[float]] = {k: [] for k in FACTOR_KINDS}
    for e in trace.compute_events():
        if e.kind not in per or e.microbatch // microbatches < skip_minibatches:
            continue
        a, b = ranges[e.stage]
        lay = model.layers_s(a, b, e.worker, microbatches)[FACTOR_KINDS.index(e.kind)]
        work = model.runtime_work_s(a, b)[FACTOR_KINDS.index(e.kind)]
        if lay > 0:
            per[e.kind].append(max(e.end_s - e.start_s - work, 0.0) / lay)
    return {k: statistics.median(v) for k, v in per.items() if v}


def calibrate_model(cluster: Cluster, model_fn: Callable[[], torch.nn.Module],
                    data: Callable[[], Iterable[Any]], loss_fn: Callable[[Any, Any], torch.Tensor],
                    profile: Profile, *,
                    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
                    repeats: int = 3, runs: ModelRuns | None = None) -> Cluster:
    """``cluster`` (from :func:`pipelab.calibrate.calibrate`) with ``model_fn``'s compute factors.

    Args:
        data, loss_fn, optimizer: as :func:`pipelab.train` takes them (module-level: workers spawn).
        profile: the model's profile on this machine at ``data``'s batch; its ``model`` names it.
        repeats: rounds (``runs.repeats`` where ``runs`` is given).
        runs: steps, microbatches, backend and timeout of each round.
    """
    base = _unscaled(cluster)
    runs = runs if runs is not None else ModelRuns(repeats=repeats)
    M = runs.microbatches
    if len(profile) < 2:
        raise ValueError(f"profile of {len(profile)} layer(s): calibrate_model cuts the model in two stages")
    cl = base.with_workers(2)
    plan: Plan = partition(profile, cl, method="gpipe", stages=2, microbatches=M)
    ranges = [(st.start, st.end) for st in plan.stages]
    cm = CostModel(profile, cl)
    rounds: dict[str, list[float]] = {k: [] for k in FACTOR_KINDS}
    for _ in range(runs.repeats):
        run = train(model_fn, plan, method="1f1b-flush", data=data, loss_fn=loss_fn, optimizer=optimizer,
                    steps=runs.steps, microbatches=M, backend=runs.backend, progress=False,
                    timeout=runs.timeout)
        for k, v in factors(run.trace, ranges, cm, M).items():
            rounds[k].append(v)
    got = {k: statistics.median(v) for k, v in rounds.items() if v}
    cal = base.calibration
    assert cal is not None
    sp = {**cal.spread, **{f"compute_factor.{k}": spread(v) for k, v in rounds.items() if v}}
    samples = {**cal.samples, "compute_factor": {k: list(v) for k, v in rounds.items()}}
    new = dataclasses.replace(cal, compute_factor=got, compute_model=profile.model, spread=sp,
                              samples=samples)
    return dataclasses.replace(cluster, calibration=new)
