"""Calibration's measurements through the real runtime: short runs of small models, priced action by
action (wall time less the profiled compute), one figure per round of ``repeats``."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from typing import Any

from pipelab.calibrate.tiny import (
    BATCH,
    medium_data,
    medium_model,
    tiny_data,
    tiny_loss,
    tiny_model,
    tiny_sgd,
)
from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.graph import layer_nodes, trace
from pipelab.partition.plan import Plan
from pipelab.profile.measure import profile as measure_profile
from pipelab.runtime import train


def _run(model_fn: Any, data_fn: Any, plan: Plan, method: str, steps: int, M: int, backend: str) -> Any:
    """One short training run of a calibration model through the real runtime."""
    return train(model_fn, plan, method=method, data=data_fn, loss_fn=tiny_loss, optimizer=tiny_sgd,
                 steps=steps, microbatches=M, backend=backend, progress=False, timeout=120)


def _tiny_profile() -> Any:
    """The tiny model's profile: the compute the cost model charges."""
    return measure_profile(tiny_model(), next(iter(tiny_data()))[0], progress=False, repeats=5)


def _medians(samples: dict[str, list[float]], keys: Sequence[str] | None = None) -> dict[str, float]:
    """The median of each non-empty list of ``samples`` (of ``keys`` only, when given)."""
    return {k: statistics.median(v) for k, v in samples.items() if v and (keys is None or k in keys)}


def runtime_overhead(repeats: int, backend: str = "gloo", steps: int = 12,
                     prof: Any = None) -> dict[str, list[float]]:
    """Per action kind, the runtime's seconds beyond the layers' compute, one figure per round: in a
    one-worker ``zb-h1`` run of the tiny model, start to next start less the profiled compute."""
    prof = prof if prof is not None else _tiny_profile()
    M = 4
    cm = CostModel(prof, Cluster.flat(1))
    bi, w = cm.backward_split_s(0, len(prof), 0, microbatches=M)
    compute = {"F": cm.compute_s(0, len(prof), 0, microbatches=M)[0], "B": bi, "W": w,
               "U": cm.update_s(0, len(prof), 0)}
    plan = Plan.from_boundaries(len(prof), [], batch_size=BATCH)
    out: dict[str, list[float]] = {k: [] for k in compute}
    for _ in range(repeats):
        run = _run(tiny_model, tiny_data, plan, "zb-h1", steps, M, backend)
        evs = sorted(run.trace.compute_events(), key=lambda e: e.start_s)
        per: dict[str, list[float]] = {k: [] for k in compute}
        skip = len(evs) // steps  # the first minibatch warms up
        for e, nxt in zip(evs[skip:], evs[skip + 1 :]):
            per[e.kind].append(nxt.start_s - e.start_s)
        for k, ts in per.items():
            if ts:
                out[k].append(max(statistics.median(ts) - compute[k], 0.0))
    return out


def allreduce_in_run(repeats: int, backend: str = "gloo", steps: int = 96,
                     rows: int = 64) -> list[tuple[int, float, float]]:
    """``(gradient bytes, mean seconds of a U, mean compute seconds before it)`` per round of a
    two-replica ``dp`` run of the medium model (the mean: a run pays every all-reduce, fast or slow)."""
    model = medium_model()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    layers = len(layer_nodes(trace(model)))     # the plan needs the count only: no profile
    out = []
    for _ in range(repeats):
        run = _run(medium_model, functools.partial(medium_data, rows),
                   Plan.from_boundaries(layers, [], [2], batch_size=rows), "dp", steps, 2, backend)
        per: dict[tuple[int, int], float] = {}
        work: dict[tuple[int, int], float] = {}
        for e in run.trace.events:
            into = per if e.kind in ("allreduce", "U") else work if e.kind in ("F", "B") else None
            if into is not None:
                into[(e.worker, e.microbatch)] = into.get((e.worker, e.microbatch), 0.0) + e.end_s - e.start_s
        us = [per[k] for k in sorted(per, key=lambda k: (k[1], k[0]))]
        cs = [work[k] for k in sorted(work, key=lambda k: (k[1], k[0]))]
        out.append((nbytes, statistics.fmean(us[len(us) // 4:]), statistics.fmean(cs[len(cs) // 4:])))
    return out


def ring_latency_of(seconds: float, nbytes: int, bandwidth: float, group: int = 2) -> float:
    """The ring model's per-step latency that gives ``seconds`` for ``nbytes`` over ``group`` workers."""
    steps = 2 * (group - 1)
    return max((seconds - steps / group * nbytes / bandwidth) / steps, 0.0)


def _latencies(trace: Any) -> tuple[list[float], list[float]]:
    """``(latencies, late)``: sender's end to receiver's wait's end, for receivers already waiting and
    for messages sent before the receiver asked."""
    ends = {(e.kind, e.stage, e.microbatch): e.end_s for e in trace.compute_events()}
    lat, late = [], []
    for e in trace.events:
        if e.kind != "recv":
            continue
        src = ("F", e.stage - 1, e.microbatch) if e.stage == 1 else ("B", e.stage + 1, e.microbatch)
        sent = ends.get(src)
        if sent is not None and e.start_s < sent < e.end_s:
            lat.append(e.end_s - sent)
        elif sent is not None and sent <= e.start_s:
            late.append(e.end_s - sent)
    return lat, late


def message_overhead(repeats: int, base: dict[str, float], backend: str = "gloo", steps: int = 72,
                     prof: Any = None) -> dict[str, list[float]]:
    """The runtime's seconds per message, and a message's latency inside a run, one figure per round.

    A two-worker ``1f1b-flush`` run of the tiny model cut after its first layer. Keys: ``"send"``,
    ``"recv"`` (on actions that did not wait), ``"latency"``, ``"busy"`` (``"busy_all"`` pooled).
    ``base``: the runtime's seconds per action kind.
    """
    prof = prof if prof is not None else _tiny_profile()
    M = 4
    cm = CostModel(prof, Cluster.flat(2))
    comp = {(s, k): v for s, (a, b) in enumerate(((0, 1), (1, len(prof))))
            for k, v in zip("FB", cm.compute_s(a, b, s, microbatches=M))}
    role = {(0, "F"): "send", (0, "B"): "recv", (1, "F"): "recv", (1, "B"): "send"}
    plan = Plan.from_boundaries(len(prof), [1], batch_size=BATCH)
    out: dict[str, list[float]] = {"send": [], "recv": [], "latency": [], "busy": [], "busy_all": []}
    for _ in range(repeats):
        run = _run(tiny_model, tiny_data, plan, "1f1b-flush", steps, M, backend)
        waited = {(e.worker, e.stage, e.microbatch) for e in run.trace.events if e.kind == "recv"}
        lat, busy = _latencies(run.trace)
        if lat:
            out["latency"].append(statistics.median(lat))
        if busy:
            out["busy"].append(statistics.median(busy))
            out["busy_all"].extend(busy)
        per: dict[str, list[float]] = {"send": [], "recv": []}
        for w in (0, 1):
            evs = sorted((e for e in run.trace.compute_events() if e.worker == w), key=lambda e: e.start_s)
            skip = len(evs) // steps
            for prev, e in zip(evs[skip:], evs[skip + 1 :]):
                r = role.get((e.stage, e.kind))
                if r is None or (e.worker, e.stage, e.microbatch) in waited:
                    continue
                per[r].append(e.end_s - prev.end_s - comp[(e.stage, e.kind)] - base.get(e.kind, 0.0))
        for k, ts in per.items():
            if ts:
                out[k].append(max(statistics.median(ts), 0.0))
    return out


def compute_slowdown(repeats: int, base: dict[str, float], backend: str = "gloo",
                     steps: int = 48) -> list[float]:
    """In-run over profiled compute time of the medium model's ``F``/``B`` in a two-worker run, one
    median per round, the runtime's own seconds (``base``) taken off first. Each round profiles the
    model right before its run, so a drift of the machine's speed between rounds cancels in the ratio."""
    x = next(iter(medium_data()))[0]
    M = 2
    out = []
    for _ in range(repeats):
        prof = measure_profile(medium_model(), x, progress=False, repeats=5)
        cm = CostModel(prof, Cluster.flat(2))
        cut = len(prof) // 2
        own = {(s, k): v for s, (a, b) in enumerate(((0, cut), (cut, len(prof))))
               for k, v in zip("FB", cm.layers_s(a, b, s, microbatches=M))}
        plan = Plan.from_boundaries(len(prof), [cut], batch_size=64)
        run = _run(medium_model, medium_data, plan, "1f1b-flush", steps, M, backend)
        evs = [e for e in run.trace.compute_events() if e.kind in "FB"]
        skip = len(evs) // steps
        work = {k: base.get(k, 0.0) + base.get("send", 0.0) + base.get("recv", 0.0) for k in "FB"}
        ratios = [(e.end_s - e.start_s - work[e.kind]) / own[(e.stage, e.kind)] for e in evs[skip:]
                  if own[(e.stage, e.kind)] > 0]
        if ratios:
            out.append(statistics.median(ratios))
    return out
