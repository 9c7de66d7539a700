"""Calibrate this machine: run every measurement ``repeats`` rounds, fit the terms (medians kept,
spreads recorded), and return a one-switch cluster whose link is the measured path, saved atomically
with its provenance. The terms are listed in docs/cost_model.md."""

from __future__ import annotations

import datetime
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
from pipelab.calibrate.fit import fit_alpha_beta, fit_ring, fit_step, spread
from pipelab.calibrate.in_run import (
    _medians,
    _tiny_profile,
    allreduce_in_run,
    compute_slowdown,
    message_overhead,
    ring_latency_of,
    runtime_overhead,
)
from pipelab.calibrate.tiny import medium_model
from pipelab.cluster import Cluster, Device, Level
from pipelab.measured import Calibration, HostEffects

BACKENDS = ("gloo", "nccl")
DEFAULT_SIZES = (4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20)   # bytes: 4 KiB .. 4 MiB


def _check_backend(backend: str, workers: int) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: calibrate one of {', '.join(BACKENDS)}")
    if backend == "gloo" and not torch.distributed.is_gloo_available():
        raise ValueError("backend='gloo' is not available in this torch build; calibrate another backend")
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not torch.distributed.is_nccl_available() or n < workers:
            raise ValueError(f"backend='nccl' needs one CUDA GPU per worker ({workers}) and NCCL; this "
                             f"machine has {n} GPU(s): calibrate backend='gloo'")
        raise ValueError("backend='nccl' calibration is not implemented yet: the probes move CPU tensors; "
                         "calibrate backend='gloo'")


def calibrate(*, workers: int = 2, backend: str = "gloo", sizes: Sequence[int] = DEFAULT_SIZES,
              repeats: int = 5, path: str | os.PathLike[str] | None = None, progress: bool = True,
              name: str | None = None, memory_bytes: int | None = None) -> Cluster:
    """Measure this machine and return (and with ``path``, save) a calibrated :class:`Cluster`.

    Args:
        workers: processes in the all-reduce sweep (groups 2..workers) and in the returned cluster.
        sizes: message sizes in bytes.
        repeats: rounds of every measurement; their range is recorded as the spread.
    """
    if not isinstance(workers, int) or workers < 2:
        raise ValueError(f"workers={workers!r}: calibration needs at least 2 worker processes")
    if not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats={repeats!r} must be an int >= 2 (the spread needs two rounds)")
    sizes = sorted({int(n) for n in sizes})
    if len(sizes) < 2 or sizes[0] < 4:
        raise ValueError(f"sizes={sizes!r}: give at least two distinct message sizes of >= 4 bytes")
    _check_backend(backend, workers)
    got = _measure(workers, backend, sizes, repeats, progress)
    cal = _assemble(got, workers=workers, backend=backend, repeats=repeats)
    level = Level(f"{backend}-host", workers, cal.p2p_bandwidth, cal.p2p_latency_s)
    mem = memory_bytes if memory_bytes is not None else _host_memory()
    dev = Device(cal.device, 1.0 / max(cal.compute_slowdown, 1.0), int(mem))   # this CPU inside a run
    cluster = Cluster(name or f"{cal.host}:{workers}", (level,), (dev,) * workers, calibration=cal)
    if path is not None:
        cluster.save(path)
    return cluster


def _measure(workers: int, backend: str, sizes: Sequence[int], repeats: int, progress: bool
             ) -> dict[str, Any]:
    """Every raw measurement, by label."""
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
    ]
    got: dict[str, Any] = {}
    with tqdm(total=len(steps), desc="calibrating", disable=not progress, leave=False) as bar:
        for label, fn in steps:
            bar.set_postfix_str(label)
            got[label] = fn()
            bar.update(1)
    return got


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def _fit_p2p(p2p: list[tuple[int, int, float]], repeats: int) -> tuple[float, float, float, list[Any]]:
    """``(alpha, beta, residual, per-round fits)`` of the point-to-point sweep."""
    by_size: dict[int, list[float]] = {}
    for _, n, t in p2p:
        by_size.setdefault(n, []).append(t)
    sizes = sorted(by_size)
    return (*fit_alpha_beta(sizes, [statistics.median(by_size[n]) for n in sizes]),
            [fit_alpha_beta([n for r2, n, _ in p2p if r2 == r], [t for r2, _, t in p2p if r2 == r])
             for r in range(repeats)])


def _fit_allreduce(ar: list[tuple[int, int, int, float]],
                   repeats: int) -> tuple[float, float, float, list[Any]]:
    """``(alpha, beta, residual, per-round fits)`` of the ring model over the all-reduce sweep."""
    by_np: dict[tuple[int, int], list[float]] = {}
    for _, n, p, t in ar:
        by_np.setdefault((n, p), []).append(t)
    return (*fit_ring([(n, p, statistics.fmean(ts)) for (n, p), ts in sorted(by_np.items())]),
            [fit_ring([(n, p, t) for r2, n, p, t in ar if r2 == r]) for r in range(repeats)])


def _ring_latency_in_run(got: dict[str, Any], beta: float, sgd: tuple[float, ...]) -> dict[str, list[float]]:
    """Per ``dp`` run kind, each round's ring latency giving its U, less the SGD step and U overhead."""
    params = list(medium_model().parameters())
    step = sgd[0] + sgd[1] * sum(p.numel() * p.element_size() for p in params) + sgd[2] * len(params)
    u_over = statistics.median(got["runtime overhead"].get("U") or [0.0])
    return {k: [ring_latency_of(t - step - u_over, n, beta) for n, t, _ in got[k]]
            for k in ("all-reduce inside a run", "all-reduce after a longer compute") if got.get(k)}


def _host_effects(msg: dict[str, list[float]]) -> tuple[HostEffects, dict[str, float]]:
    """The host-effects record of the message measurements (popped from ``msg``), and its spreads."""
    busy, pooled = msg.pop("busy", []), msg.pop("busy_all", [])
    if not busy:
        return HostEffects(), {}
    # a round has few late messages: the pooled median
    return HostEffects(busy_sender_s=statistics.median(pooled or busy)), {
        "host_effects.busy_sender_s": spread(busy)}


def _assemble(got: dict[str, Any], *, workers: int, backend: str, repeats: int) -> Calibration:
    """The :class:`Calibration` of the raw measurements (fits of the medians, spreads over rounds)."""
    net = got["point to point and all-reduce"]
    alpha, beta, res_p2p, rounds = _fit_p2p(net["p2p"], repeats)
    ar_alpha, ar_beta, res_ar, ar_rounds = _fit_allreduce(net["allreduce"], repeats)
    opt = got["optimizer step"]
    opt_fit = {k: fit_step(rows) for k, rows in opt.items()}
    latencies = _ring_latency_in_run(got, ar_beta, opt_fit["sgd"]) if ar_beta != float("inf") else {}
    ar_in_run = latencies.get("all-reduce inside a run", [])
    if ar_in_run:     # the sweep keeps the bandwidth; the runs set the latency
        ar_alpha = statistics.median(ar_in_run)
    after = [(statistics.median(c for _, _, c in got[k]), statistics.median(ls))
             for k, ls in latencies.items()]
    over = got["runtime overhead"]
    msg = dict(got["message overhead"])
    in_run = msg.pop("latency", [])      # a message's latency inside a run; the sweep keeps the bandwidth
    if in_run:
        alpha = statistics.median(in_run)
    host, sp = _host_effects(msg)
    mem = got["memory bandwidth"]
    slow = got.get("compute inside a run") or [1.0]
    sp.update({
        "p2p_latency_s": spread(in_run or [a for a, _, _ in rounds]),
        "p2p_bandwidth": spread([b for _, b, _ in rounds if b != float("inf")]),
        "allreduce_latency_s": spread(ar_in_run or [a for a, _, _ in ar_rounds]),
        "allreduce_bandwidth": spread([b for _, b, _ in ar_rounds if b != float("inf")]),
        "memory_bandwidth": spread(mem),
        "compute_slowdown": spread(slow),
        **{f"overhead_s.{k}": spread(v) for k, v in over.items()},
        **{f"message_s.{k}": spread(v) for k, v in msg.items()},
    })
    if len(after) > 1:
        sp["allreduce_after.long"] = spread(latencies["all-reduce after a longer compute"])
    cpu = platform.processor() or platform.machine() or "cpu"
    return Calibration(
        host=socket.gethostname(), backend=backend, transport=str(net.get("transport", backend)),
        device=torch.cuda.get_device_name() if backend == "nccl" else f"cpu:{cpu}",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__, cores=os.cpu_count() or 1, workers=workers,
        p2p_latency_s=alpha, p2p_bandwidth=beta if beta != float("inf") else 1e12,
        allreduce_latency_s=ar_alpha, allreduce_bandwidth=ar_beta if ar_beta != float("inf") else 1e12,
        overhead_s=_medians(over), message_s=_medians(msg), host_effects=host,
        optimizer_s={k: (a, b, c) for k, (a, b, c, _) in opt_fit.items()},
        memory_bandwidth=statistics.median(mem), compute_slowdown=statistics.median(slow),
        allreduce_after=tuple(after), spread=sp,
        residual={"p2p": res_p2p, "allreduce": res_ar,
                  **{f"optimizer.{k}": f[3] for k, f in opt_fit.items()}},
        samples={"p2p": [list(x) for x in net["p2p"]], "allreduce": [list(x) for x in net["allreduce"]],
                 "p2p_latency_in_run": in_run, "allreduce_latency_in_run": ar_in_run,
                 "optimizer": {k: [list(x) for x in v] for k, v in opt.items()}},
    )


def check(cluster: Cluster, *, backend: str | None = None) -> None:
    """Warn when ``cluster``'s calibration was made on another host or for another backend."""
    cal = cluster.calibration
    if cal is None:
        return
    where = f"calibrated on {cal.host!r} for {cal.backend} at {cal.date} (torch {cal.torch})"
    if cal.host != socket.gethostname():
        warnings.warn(f"cluster {cluster.name!r} was {where}, not on this host ({socket.gethostname()!r}); "
                      "its figures may not hold here: run `pipelab calibrate` on this machine", stacklevel=2)
    if backend is not None and backend != cal.backend:
        warnings.warn(f"cluster {cluster.name!r} was {where}, but it is used for backend {backend!r}; "
                      f"calibrate with backend={backend!r}", stacklevel=2)


def load(path: str | os.PathLike[str], *, backend: str | None = None) -> Cluster:
    """Read a calibrated cluster (``Cluster.load``) and :func:`check` its provenance."""
    cluster = Cluster.load(Path(path))
    check(cluster, backend=backend)
    return cluster
