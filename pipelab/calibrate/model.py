"""Calibrate the model at hand: how much longer its layers take inside a real run than profiled.

The profiler times each layer alone, in one process (:mod:`pipelab.profile.measure`); inside a
two-worker run the same layers share the machine's cores with the other worker, the backend's
I/O threads and the parent, and the stage's backward is one autograd call where the profiler
made one per layer. Neither is a property of the machine alone: it depends on the model's
kernels. :func:`calibrate_model` measures it on the model itself, in a run of its own (not the
run being predicted): a two-worker ``1f1b-flush`` run of the model cut in two by GPipe's time
balance, ``repeats`` times. For every ``F`` and ``B`` after the first minibatch,

    factor = (measured duration - the runtime's own work of that action) / the profiled layers' time

(the runtime's work, ``CostModel.runtime_work_s``, is the calibration's per-action and per-message
seconds; the layers' time is ``CostModel.layers_s`` on the cluster without a factor). The median
over a round's actions of each kind is that round's figure; the calibration keeps the median of
the rounds and their spread (``Calibration.compute_factor``, ``spread["compute_factor.F"]``), and
the cost model multiplies the profile's forward and backward times by it (``W`` by ``B``'s).

:func:`factors` is the pure part (a trace and the prices in, the per-kind figures out), tested on
synthetic traces.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence
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


def _unscaled(cluster: Cluster) -> Cluster:
    """``cluster`` with its calibration's compute factors removed (the profile's own times)."""
    cal = cluster.calibration
    if cal is None:
        raise ValueError("calibrate_model needs a calibrated cluster (pl.calibrate() first): the runtime's "
                         "own work per action is taken off the measured durations")
    return dataclasses.replace(cluster, calibration=dataclasses.replace(cal, compute_factor={}))


def factors(trace: Trace, ranges: Sequence[tuple[int, int]], model: CostModel, microbatches: int,
            skip_minibatches: int = 1) -> dict[str, float]:
    """Per kind (``F``, ``B``), the median over ``trace``'s actions of that kind of (duration - the
    runtime's own work) / (the layers' time), both from ``model`` (whose cluster has no factor).

    ``ranges[s]`` is stage ``s``'s layers; actions of the first ``skip_minibatches`` minibatches
    (warm-up) and stages whose layers take no time are left out.
    """
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


def calibrate_model(
    cluster: Cluster,
    model_fn: Callable[[], torch.nn.Module],
    data: Callable[[], Iterable[Any]],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    profile: Profile,
    *,
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
    microbatches: int = 4,
    steps: int = 12,
    repeats: int = 3,
    backend: str = "gloo",
    name: str | None = None,
    timeout: float = 120.0,
) -> Cluster:
    """``cluster`` (calibrated by :func:`pipelab.calibrate.calibrate`) with the compute factors of
    ``model_fn``'s model measured inside ``repeats`` two-worker runs (see the module docstring).

    ``data``, ``loss_fn`` and ``optimizer`` are what :func:`pipelab.runtime.train` takes (module-level
    functions: the workers are spawned); ``profile`` is the model's profile measured on this machine
    at the batch ``data`` yields; ``name`` names the model in the calibration (default: the
    profile's). A few seconds per round for a model of a few milliseconds per minibatch.
    """
    base = _unscaled(cluster)
    if not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats={repeats!r} must be an int >= 2 (the spread needs two rounds)")
    if not isinstance(steps, int) or steps < 3:
        raise ValueError(f"steps={steps!r} must be an int >= 3 (the first minibatch warms up)")
    if len(profile) < 2:
        raise ValueError(f"profile of {len(profile)} layer(s): calibrate_model cuts the model in two stages")
    cl = base.with_workers(2)
    plan: Plan = partition(profile, cl, method="gpipe", stages=2, microbatches=microbatches)
    ranges = [(st.start, st.end) for st in plan.stages]
    cm = CostModel(profile, cl)
    rounds: dict[str, list[float]] = {k: [] for k in FACTOR_KINDS}
    for _ in range(repeats):
        run = train(model_fn, plan, method="1f1b-flush", data=data, loss_fn=loss_fn, optimizer=optimizer,
                    steps=steps, microbatches=microbatches, backend=backend, progress=False, timeout=timeout)
        for k, v in factors(run.trace, ranges, cm, microbatches).items():
            rounds[k].append(v)
    got = {k: statistics.median(v) for k, v in rounds.items() if v}
    cal = base.calibration
    assert cal is not None
    sp = {**cal.spread, **{f"compute_factor.{k}": spread(v) for k, v in rounds.items() if v}}
    samples = {**cal.samples, "compute_factor": {k: list(v) for k, v in rounds.items()}}
    new = dataclasses.replace(cal, compute_factor=got, compute_model=name or profile.model, spread=sp,
                              samples=samples)
    return dataclasses.replace(cluster, calibration=new)


__all__ = ["calibrate_model", "factors"]
