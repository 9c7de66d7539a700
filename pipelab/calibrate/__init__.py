"""Calibration: measure the machine at hand and write a :class:`~pipelab.cluster.Cluster` whose
:class:`~pipelab.cluster.Calibration` the cost model uses (``pl.calibrate``, ``pipelab calibrate``).

What is measured (``repeats`` rounds of each; medians kept, spreads recorded):

1. point-to-point latency and bandwidth of the backend between two worker processes, over a
   sweep of message sizes (Hockney's ``alpha + n / beta``, with the fit's residual);
2. all-reduce time against size and group size (the ring model ``2(p-1) alpha + 2(p-1)/p n/beta``),
   its latency then set so the model gives what a two-replica ``dp`` run's ``U`` takes through the
   real runtime (:func:`allreduce_in_run`);
3. the runtime's own seconds per action for ``F``, ``B``, ``W`` and ``U``: a one-worker
   ``zb-h1`` run of a tiny model through the real runtime (so every kind occurs), each action's
   wall time up to the next one, less the layers' profiled compute; and per message, on the worker
   that sends it and on the one that receives it (a two-worker run of the same model), how late a
   message is when its sender computes on at once, and how much longer an action takes when its
   message crosses the peer's in the opposite direction (:mod:`pipelab.schedules.crossing`);
4. the optimizer step's cost for SGD, SGD with momentum and Adam (fixed seconds plus seconds per
   parameter byte plus seconds per parameter tensor);
5. host memory bandwidth (a large copy);

Items 1-5 and the runtime's own per-action and per-message seconds are the core model's terms; a
busy sender's late message and the crossing stall (3) describe this host and go into one record,
``Calibration.host_effects`` (:class:`~pipelab.calibration.HostEffects`), which the simulator applies
only where asked (:mod:`pipelab.sim.host_effects`).

The result is a one-switch cluster of ``workers`` devices of speed 1.0 (the profile must be
measured on this machine too: ``pl.profile``), whose link is the measured point-to-point path.
Written atomically, with provenance (host, backend, device, date, torch version, cores); loading
one made on another host, or using it for another backend, warns naming where it came from.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import socket
import statistics
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from pipelab.calibrate import probes
from pipelab.calibrate.crossings import _crossings, _extra, interleaved_crossing
from pipelab.calibrate.fit import fit_alpha_beta, fit_ring, fit_step, spread
from pipelab.calibrate.tiny import (
    BATCH,
    medium_data,
    medium_model,
    tiny_data,
    tiny_loss,
    tiny_model,
    tiny_sgd,
)
from pipelab.calibration import Calibration, HostEffects
from pipelab.cluster import Cluster, Device, Level
from pipelab.costs import CostModel
from pipelab.graph import layer_nodes, trace
from pipelab.partition.plan import Plan
from pipelab.profile.measure import profile as measure_profile
from pipelab.runtime import train
from pipelab.schedules.actions import Action

BACKENDS = ("gloo", "nccl")
#: message sizes of the point-to-point and all-reduce sweeps (bytes): 4 KiB .. 4 MiB
DEFAULT_SIZES = (4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20)


def _check_backend(backend: str, workers: int) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: calibrate one of {', '.join(BACKENDS)}")
    if backend == "gloo" and not torch.distributed.is_gloo_available():
        raise ValueError("backend='gloo' is not available in this torch build; calibrate another backend")
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not torch.distributed.is_nccl_available() or n < workers:
            raise ValueError(
                f"backend='nccl' needs one CUDA GPU per worker ({workers}) and NCCL; this "
                f"machine has {n} GPU(s): calibrate backend='gloo'"
            )
        raise ValueError(
            "backend='nccl' calibration is not implemented yet: the probes move CPU tensors; "
            "calibrate backend='gloo'"
        )


def _run(model_fn: Any, data_fn: Any, plan: Plan, method: str, steps: int, M: int, backend: str) -> Any:
    """One short training run of a calibration model through the real runtime."""
    return train(model_fn, plan, method=method, data=data_fn, loss_fn=tiny_loss, optimizer=tiny_sgd,
                 steps=steps, microbatches=M, backend=backend, progress=False, timeout=120)


def _tiny_profile() -> Any:
    """The tiny model's profile (the compute the cost model charges, without the runtime's work)."""
    return measure_profile(tiny_model(), next(iter(tiny_data()))[0], progress=False, repeats=5)


def _medians(samples: dict[str, list[float]], keys: Sequence[str] | None = None) -> dict[str, float]:
    """The median of each non-empty list of ``samples`` (of ``keys`` only, when given)."""
    return {k: statistics.median(v) for k, v in samples.items() if v and (keys is None or k in keys)}


def runtime_overhead(repeats: int, backend: str = "gloo", steps: int = 12,
                     prof: Any = None) -> dict[str, list[float]]:
    """Per action kind, the runtime's seconds per action beyond the layers' compute, one per round.

    A one-worker ``zb-h1`` run (F, B, W and U all occur) of :func:`tiny.tiny_model` through the
    real runtime; an action's wall time is from its start to the next action's start on the worker
    (so the runtime's work between actions counts), less the profiled compute of the same action.
    ``prof``: the tiny model's profile, measured here when not given.
    """
    prof = prof if prof is not None else _tiny_profile()
    M = 4
    cm = CostModel(prof, Cluster.flat(1))
    f, b = cm.compute_s(0, len(prof), 0, microbatches=M)
    bi, w = cm.backward_split_s(0, len(prof), 0, microbatches=M)
    u = cm.update_s(0, len(prof), 0)
    compute = {"F": f, "B": bi, "W": w, "U": u}
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
    """``(gradient bytes, mean seconds of a U, mean seconds a replica computed before it)`` per round
    of a two-replica ``dp`` run of :func:`tiny.medium_model` (about 1 MB of gradients) on minibatches
    of ``rows`` through the real runtime: the all-reduce as a run has it, with the step's optimizer
    and the runtime's own ``U`` work (taken off in :func:`_assemble`); a U's time is its
    ``allreduce`` event and its step's event together, the compute its replica's ``F`` and ``B``
    since the last one. The mean, not the median: a run pays every all-reduce, and after compute one
    takes either about a millisecond or several (measured here at 1 MB: means of 2.1-3.5 ms where
    the probe's sweep fits 1.2 ms). 96 steps a round (the first quarter left out): three
    calibrations' medians per U were 2.7, 3.5 and 2.7 ms with 16 steps, 2.6, 2.2 and 2.4 ms with 48,
    2.22, 2.14 and 2.14 ms with 96, for 2.6 s against 1.9 s a calibration (process start-up
    dominates). :func:`calibrate` runs it at 64 rows (about 1.4 ms of compute a step) and at 512
    (about 5.4 ms), since the all-reduce after a long compute takes longer on this project's VM
    (``Calibration.allreduce_after``)."""
    model = medium_model()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    layers = len(layer_nodes(trace(model)))     # the plan needs the count only: no profile
    out = []
    for _ in range(repeats):
        run = _run(medium_model, functools.partial(medium_data, rows),
                   Plan.from_boundaries(layers, [], [2], batch_size=rows), "dp", steps, 2, backend)
        # a U of a replicated stage is two events, the all-reduce and then the step: one U's time
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
    """The per-step latency ``alpha`` for which the ring model ``2 (p - 1) alpha + 2 (p - 1) / p *
    n / beta`` gives ``seconds`` for ``nbytes`` over a group of ``group`` at ``bandwidth`` (at
    least 0)."""
    steps = 2 * (group - 1)
    return max((seconds - steps / group * nbytes / bandwidth) / steps, 0.0)


def message_overhead(
    repeats: int, base: dict[str, float], backend: str = "gloo", steps: int = 72, prof: Any = None
) -> dict[str, list[float]]:
    """The runtime's own seconds per message on a worker, one per round: ``"send"`` (packing,
    posting the send) and ``"recv"`` (posting the receive, unpacking); and a message's latency as
    the run has it, ``"latency"`` (to a receiver already waiting) and ``"busy"`` (from a sender
    that computed on at once; a round has only a few such messages, so ``"busy_all"`` also pools
    them over the rounds: its median is the figure, the rounds' medians give the spread); and
    ``"cross"``, the mean extra of an action whose message crossed the peer's
    (:func:`pipelab.schedules.crossing.crossed_actions`), pooled over the rounds (``"cross_rounds"``:
    each round's, for the spread); ``"arrive"``, the same of an action during which a message to its
    worker arrived and that did not cross (:func:`~pipelab.schedules.crossing.arrived_actions`;
    ``"arrive_rounds"``). Both are extras over quiet actions of the same worker and kind.

    A two-worker ``1f1b-flush`` run of :func:`tiny.tiny_model` cut after its first layer (72 steps a
    round: with 24, five rounds saw 7-17 late messages and the busy sender's delay came out at
    389-582 us in three calibrations; with 72, 49-53 and 438-512 us, for about a second more): stage 0's
    forward sends and its backward receives, stage 1's forward receives and its backward sends. An
    action's wall time is from the previous action's end on its worker to its own end (the receive
    is taken before the action starts), less the profiled compute and the per-action ``base``
    overhead; actions that waited for their message are left out (a wait is not work). ``prof``: the
    tiny model's profile, measured here when not given. The per-message work is taken on quiet
    actions only: a crossed one also holds the crossing stall, which ``"cross"`` measures, one with
    an arrival the arrival's, which ``"arrive"`` measures.
    """
    prof = prof if prof is not None else _tiny_profile()
    M = 4
    cm = CostModel(prof, Cluster.flat(2))
    comp = {
        (s, k): v
        for s, (a, b) in enumerate(((0, 1), (1, len(prof))))
        for k, v in zip("FB", cm.compute_s(a, b, s, microbatches=M))
    }
    role = {(0, "F"): "send", (0, "B"): "recv", (1, "F"): "recv", (1, "B"): "send"}
    plan = Plan.from_boundaries(len(prof), [1], batch_size=BATCH)
    out: dict[str, list[float]] = {"send": [], "recv": [], "latency": [], "busy": [], "busy_all": [],
                                   "cross_rounds": [], "arrive_rounds": []}
    pooled: dict[tuple[int, str, str], list[float]] = {}
    for _ in range(repeats):
        run = _run(tiny_model, tiny_data, plan, "1f1b-flush", steps, M, backend)
        crossed, arrived = _crossings(run, pooled, out["cross_rounds"], out["arrive_rounds"])
        waited = {(e.worker, e.stage, e.microbatch) for e in run.trace.events if e.kind == "recv"}
        # a message's latency in the runtime: from the end of the action that sent it to the end of
        # the receiver's wait, for receivers already waiting when it was sent
        ends = {(e.kind, e.stage, e.microbatch): e.end_s for e in run.trace.compute_events()}
        lat, busy = [], []
        for e in run.trace.events:
            if e.kind != "recv":
                continue
            src = ("F", e.stage - 1, e.microbatch) if e.stage == 1 else ("B", e.stage + 1, e.microbatch)
            sent = ends.get(src)
            if sent is not None and e.start_s < sent < e.end_s:
                lat.append(e.end_s - sent)
            elif sent is not None and sent <= e.start_s:
                # sent before the receiver asked for it, and still not there: a late message. Only
                # such messages are seen here (the runtime records a wait past 0.1 ms), so this is
                # how late a message is *given* that it is late, not the delay of every message of
                # a busy sender: over messages to receivers already waiting when they were sent,
                # a busy sender's are 1-8 us later than an idle one's (pinned workers, measured).
                # The simulator applies it to every message whose sender computes on, a proxy that
                # fits the runs better than the unbiased 1-8 us (paired on the same 16 runs: median
                # |error| 14.5% against 16.6%, worst 32% against 42%); the mechanism behind the
                # lateness (likely a posted receive's notice waiting for the busy sender's core) is
                # not modelled yet
                busy.append(e.end_s - sent)
        if lat:
            out["latency"].append(statistics.median(lat))
        if busy:
            out["busy"].append(statistics.median(busy))
            out["busy_all"].extend(busy)
        per: dict[str, list[float]] = {"send": [], "recv": []}
        # a crossed action's stall is the "cross" term, an arrival's the "arrive" term: the
        # per-message work is that of quiet actions (neither)
        for w in (0, 1):
            evs = sorted((e for e in run.trace.compute_events() if e.worker == w), key=lambda e: e.start_s)
            skip = len(evs) // steps
            for prev, e in zip(evs[skip:], evs[skip + 1 :]):
                r = role.get((e.stage, e.kind))
                a = (w, Action(e.stage, e.kind, e.microbatch))
                if r is None or (e.worker, e.stage, e.microbatch) in waited or a in crossed or a in arrived:
                    continue
                per[r].append(e.end_s - prev.end_s - comp[(e.stage, e.kind)] - base.get(e.kind, 0.0))
        for k, ts in per.items():
            if ts:
                out[k].append(max(statistics.median(ts), 0.0))
    out["cross"] = [_extra(pooled, "crossed")]
    out["arrive"] = [_extra(pooled, "arrived")]
    return out


def compute_slowdown(
    repeats: int, base: dict[str, float], backend: str = "gloo", steps: int = 48
) -> list[float]:
    """How much slower the layers compute inside a two-worker run than the profiler measured them
    alone (the other worker, the backend's threads and the parent share the cores), one figure per
    round: the median over the run's forwards and backwards of (measured duration) / (profiled
    time), on :func:`tiny.medium_model` cut in the middle; ``base`` holds the runtime's own seconds
    per action (``F``, ``B``) and per message (``send``, ``recv``), taken off each duration first.
    48 steps a round (the first eighth left out): with 8, five rounds gave 1.34-1.76 and 1.18-1.44 in
    two calibrations a minute apart, with 48 (0.6 s more) 1.12-1.22 and 0.88-1.18 (2026-11-26).
    """
    x = next(iter(medium_data()))[0]
    prof = measure_profile(medium_model(), x, progress=False, repeats=5)
    M = 2
    cm = CostModel(prof, Cluster.flat(2))
    cut = len(prof) // 2
    own = {
        (s, k): v
        for s, (a, b) in enumerate(((0, cut), (cut, len(prof))))
        for k, v in zip("FB", cm.layers_s(a, b, s, microbatches=M))
    }
    plan = Plan.from_boundaries(len(prof), [cut], batch_size=64)
    out = []
    for _ in range(repeats):
        run = _run(medium_model, medium_data, plan, "1f1b-flush", steps, M, backend)
        evs = [e for e in run.trace.compute_events() if e.kind in "FB"]
        skip = len(evs) // steps
        # less the runtime's own work in the action (stage 0 sends in F, stage 1 in B; each receives once)
        work = {k: base.get(k, 0.0) + base.get("send", 0.0) + base.get("recv", 0.0) for k in "FB"}
        ratios = [
            (e.end_s - e.start_s - work[e.kind]) / own[(e.stage, e.kind)]
            for e in evs[skip:]
            if own[(e.stage, e.kind)] > 0
        ]
        if ratios:
            out.append(statistics.median(ratios))
    return out


def calibrate(
    *,
    workers: int = 2,
    backend: str = "gloo",
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 5,
    path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    name: str | None = None,
    memory_bytes: int | None = None,
) -> Cluster:
    """Measure this machine and return (and with ``path``, save) a calibrated :class:`Cluster`.

    ``workers``: processes in the all-reduce sweep (group sizes 2..workers) and in the returned
    cluster; ``sizes``: message sizes in bytes; ``repeats``: rounds of every measurement (the
    spread between rounds is recorded). About half a minute at the defaults on two CPU cores.

    Five rounds by default: the spread is the range of the rounds, and with three a rerun's median
    fell outside the first calibration's range for 4 of 16 figures (medians moving up to 40%); with
    five, for 1, 1 and 3 of 16 in three pairs (``reproductions/benchmarks/calibration_repeatability.py``).
    """
    if not isinstance(workers, int) or workers < 2:
        raise ValueError(f"workers={workers!r}: calibration needs at least 2 worker processes")
    if not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats={repeats!r} must be an int >= 2 (the spread needs two rounds)")
    sizes = sorted({int(n) for n in sizes})
    if len(sizes) < 2 or sizes[0] < 4:
        raise ValueError(f"sizes={sizes!r}: give at least two distinct message sizes of >= 4 bytes")
    _check_backend(backend, workers)
    from tqdm.auto import tqdm

    tiny = _tiny_profile()      # one profile of the tiny model, for the two runs that use it
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("point to point and all-reduce", lambda: probes.p2p_and_allreduce(workers, backend, sizes, repeats)),
        ("all-reduce inside a run", lambda: allreduce_in_run(repeats, backend)),
        ("all-reduce after a longer compute", lambda: allreduce_in_run(repeats, backend, 48, rows=512)),
        ("runtime overhead", lambda: runtime_overhead(repeats, backend, prof=tiny)),
        ("message overhead", lambda: message_overhead(repeats, _medians(got["runtime overhead"]), backend,
                                                      prof=tiny)),
        ("compute inside a run", lambda: compute_slowdown(
            repeats,
            {**_medians(got["runtime overhead"]), **_medians(got["message overhead"], ("send", "recv"))},
            backend)),
        ("optimizer step", lambda: probes.optimizer_steps([1 << 16, 1 << 20, 1 << 23], max(repeats, 5))),
        ("memory bandwidth", lambda: probes.memory_copy(64 << 20, max(repeats, 5))),
        ("crossings, interleaved", lambda: interleaved_crossing(max(repeats // 2, 2), backend)),
    ]
    bar = tqdm(total=len(steps) + 1, desc="calibrating", disable=not progress, leave=False)
    got: dict[str, Any] = {}
    try:
        for label, fn in steps:
            bar.set_postfix_str(label)
            got[label] = fn()
            bar.update(1)
        cal = _assemble(got, workers=workers, backend=backend, repeats=repeats)
        bar.update(1)
    finally:
        bar.close()
    level = Level(f"{backend}-host", workers, cal.p2p_bandwidth, cal.p2p_latency_s)
    mem = memory_bytes if memory_bytes is not None else _host_memory()
    # the device of this cluster is "this CPU inside a run": the layers compute slower than profiled
    # alone by the measured factor (speed = 1 / slowdown; 1.0 when it is not slower)
    dev = Device(cal.device, 1.0 / max(cal.compute_slowdown, 1.0), int(mem))
    cluster = Cluster(name or f"{cal.host}:{workers}", (level,), (dev,) * workers, calibration=cal)
    if path is not None:
        cluster.save(path)
    return cluster


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def _assemble(got: dict[str, Any], *, workers: int, backend: str, repeats: int) -> Calibration:
    """The :class:`Calibration` of the raw measurements (fits of the medians, spreads over rounds)."""
    net = got["point to point and all-reduce"]
    p2p = net["p2p"]
    by_size: dict[int, list[float]] = {}
    for _, n, t in p2p:
        by_size.setdefault(n, []).append(t)
    sizes = sorted(by_size)
    alpha, beta, res_p2p = fit_alpha_beta(sizes, [statistics.median(by_size[n]) for n in sizes])
    rounds = [
        fit_alpha_beta([n for r2, n, _ in p2p if r2 == r], [t for r2, _, t in p2p if r2 == r])
        for r in range(repeats)
    ]
    ar = net["allreduce"]
    by_np: dict[tuple[int, int], list[float]] = {}
    for _, n, p, t in ar:
        by_np.setdefault((n, p), []).append(t)
    # each round's figure is a mean over its all-reduces (probes.p2p_and_allreduce); so is the fit's
    ar_alpha, ar_beta, res_ar = fit_ring(
        [(n, p, statistics.fmean(ts)) for (n, p), ts in sorted(by_np.items())]
    )
    ar_rounds = [fit_ring([(n, p, t) for r2, n, p, t in ar if r2 == r]) for r in range(repeats)]
    opt = got["optimizer step"]
    opt_fit = {k: fit_step(rows) for k, rows in opt.items()}
    ar_in_run: list[float] = []
    after: list[tuple[float, float]] = []
    latencies: dict[str, list[float]] = {}
    if got.get("all-reduce inside a run") and ar_beta != float("inf"):
        # the latency that makes the ring model give what a dp run's U took, less that U's optimizer
        # step (SGD, as the run's) and the runtime's own U work; the sweep's fit keeps the bandwidth
        sgd = opt_fit["sgd"]
        params = list(medium_model().parameters())
        step = sgd[0] + sgd[1] * sum(p.numel() * p.element_size() for p in params) + sgd[2] * len(params)
        u_over = statistics.median(got["runtime overhead"].get("U") or [0.0])
        # per round, at each length of compute: the latency against the compute before it (allreduce_after)
        latencies = {k: [ring_latency_of(t - step - u_over, n, ar_beta) for n, t, _ in got[k]]
                     for k in ("all-reduce inside a run", "all-reduce after a longer compute") if got.get(k)}
        ar_in_run = latencies["all-reduce inside a run"]
        ar_alpha = statistics.median(ar_in_run)
        after = [(statistics.median(c for _, _, c in got[k]), statistics.median(ls))
                 for k, ls in latencies.items()]
    over = got["runtime overhead"]
    msg = dict(got["message overhead"])
    # the latency a message has inside a pipeline run (the receiver blocked in its wait, woken by
    # the message), measured in the two-worker run; the sweep's own fit keeps the bandwidth
    in_run = msg.pop("latency", [])
    if in_run:
        alpha = statistics.median(in_run)
    cross_spread = spread(msg.pop("cross_rounds", []))
    msg.pop("arrive_rounds", None)
    busy = msg.pop("busy", [])
    pooled = msg.pop("busy_all", [])
    busy_spread = spread(busy)
    if busy:
        # two to seven such messages a round: the median of the pooled messages, not of the rounds'
        # medians (three calibrations in a row gave 280, 690 and 242 us that way; pooled, 223-271 us)
        msg["busy_sender"] = [statistics.median(pooled)] if pooled else busy
    mem = got["memory bandwidth"]
    slow = got.get("compute inside a run") or [1.0]
    finite = [b for _, b, _ in rounds if b != float("inf")]
    sp = {
        "p2p_latency_s": spread(in_run or [a for a, _, _ in rounds]),
        "p2p_bandwidth": spread(finite),
        "allreduce_latency_s": spread(ar_in_run or [a for a, _, _ in ar_rounds]),
        "allreduce_bandwidth": spread([b for _, b, _ in ar_rounds if b != float("inf")]),
        "memory_bandwidth": spread(mem),
    }
    sp.update({f"overhead_s.{k}": spread(v) for k, v in over.items()})
    # the host effects (HostEffects): what this machine adds beyond the core terms
    host_msg = {k: msg.pop(k) for k in ("busy_sender", "cross") if k in msg}
    msg.pop("arrive", None)    # the message probe's arrival extra: not a term (held-out models)
    sp.update({f"message_s.{k}": spread(v) for k, v in msg.items()})
    if busy:
        sp["host_effects.busy_sender_s"] = busy_spread
    if "cross" in host_msg:
        sp["host_effects.cross_s"] = cross_spread
    sp["compute_slowdown"] = spread(slow)
    if len(after) > 1:     # the longer compute's latency, round by round
        sp["allreduce_after.long"] = spread(latencies["all-reduce after a longer compute"])
    inter = got.get("crossings, interleaved") or []
    if inter:
        sp["host_effects.cross_interleaved_s"] = spread(inter)
    host_med = _medians(host_msg)
    host = HostEffects(cross_s=host_med.get("cross", 0.0),
                       busy_sender_s=host_med.get("busy_sender", 0.0),
                       cross_interleaved_s=statistics.median(inter) if inter else None,
)
    res = {"p2p": res_p2p, "allreduce": res_ar, **{f"optimizer.{k}": f[3] for k, f in opt_fit.items()}}
    cpu = platform.processor() or platform.machine() or "cpu"
    device = torch.cuda.get_device_name() if backend == "nccl" else cpu
    return Calibration(
        host=socket.gethostname(),
        backend=backend,
        device=f"cpu:{device}" if backend != "nccl" else device,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        cores=os.cpu_count() or 1,
        workers=workers,
        p2p_latency_s=alpha,
        p2p_bandwidth=beta if beta != float("inf") else 1e12,
        allreduce_latency_s=ar_alpha,
        allreduce_bandwidth=ar_beta if ar_beta != float("inf") else 1e12,
        overhead_s=_medians(over),
        message_s=_medians(msg),
        host_effects=host,
        optimizer_s={k: (a, b, c) for k, (a, b, c, _) in opt_fit.items()},
        memory_bandwidth=statistics.median(mem),
        compute_slowdown=statistics.median(slow),
        allreduce_after=tuple(after),
        spread=sp,
        residual=res,
        samples={
            "p2p": [list(x) for x in p2p],
            "allreduce": [list(x) for x in ar],
            "p2p_latency_in_run": in_run,
            "allreduce_latency_in_run": ar_in_run,
            "optimizer": {k: [list(x) for x in v] for k, v in opt.items()},
            "cross_interleaved": list(got.get("crossings, interleaved") or []),
        },
    )


def check(cluster: Cluster, *, backend: str | None = None) -> None:
    """Warn when ``cluster``'s calibration was made on another host or for another backend
    (naming where and when it was made); silent for an uncalibrated cluster."""
    cal = cluster.calibration
    if cal is None:
        return
    where = f"calibrated on {cal.host!r} for {cal.backend} at {cal.date} (torch {cal.torch})"
    if cal.host != socket.gethostname():
        warnings.warn(
            f"cluster {cluster.name!r} was {where}, not on this host ({socket.gethostname()!r}); "
            "its figures may not hold here: run `pipelab calibrate` on this machine",
            stacklevel=2,
        )
    if backend is not None and backend != cal.backend:
        warnings.warn(
            f"cluster {cluster.name!r} was {where}, but it is used for backend {backend!r}; "
            f"calibrate with backend={backend!r}",
            stacklevel=2,
        )


def load(path: str | os.PathLike[str], *, backend: str | None = None) -> Cluster:
    """Read a calibrated cluster (``Cluster.load``) and :func:`check` its provenance."""
    cluster = Cluster.load(Path(path))
    check(cluster, backend=backend)
    return cluster


# the model at hand (imported last: it uses this package's fit helpers)
from pipelab.calibrate.model import calibrate_model  # noqa: E402

__all__ = ["BACKENDS", "DEFAULT_SIZES", "allreduce_in_run", "calibrate", "calibrate_model", "check",
           "load", "ring_latency_of", "runtime_overhead"]
