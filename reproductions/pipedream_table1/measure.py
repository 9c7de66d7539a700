"""Table 1's measure mode: reduced paper models, random data, this machine's gloo bandwidth, real runs.

Everything a worker process must import (model and data builders, the loss) lives here, at module
level, because ``pl.train`` pickles them by reference.
"""

from __future__ import annotations

import functools
import os
import socket
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


from pipelab.cluster import Cluster
from pipelab.costs import OPTIMIZER_STATE
from pipelab.models import gnmt, vgg16
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.measure import profile as profile_model
from pipelab.profile.records import Profile
from pipelab.runtime.launch import train
from reproductions.pipedream_table1.rows import simulate_plan


def paper_model(name: str, *, batch: int, image_size: int = 64, seq_len: int = 16,
                width: float = 1.0, vocab: int = 1000) -> tuple[nn.Module, Any]:
    """A paper model (``vgg16``, ``resnet50``, ``gnmt8``, ``gnmt16``) and a sample input batch.

    ``width < 1`` narrows it (channels / hidden sizes) keeping the layer structure, so that the same
    question runs on a laptop CPU; see :func:`reduced_model`.
    """
    net = reduced_model(name, width=width, image_size=image_size, vocab=vocab)
    return net, sample_input(name, batch=batch, image_size=image_size, seq_len=seq_len, vocab=vocab)


def reduced_model(name: str, *, width: float = 1.0, image_size: int = 224, vocab: int = 1000,
                  num_classes: int = 1000) -> nn.Module:
    """``name`` with every channel / hidden size multiplied by ``width``; the layer structure is the paper's.

    VGG-16 keeps torchvision's 13 conv + 3 fully connected layers (feature widths 64..512 times
    ``width``, classifier hidden 4096 times ``width``); ResNet-50 keeps its 16 bottleneck blocks
    ([3, 4, 6, 3]); GNMT keeps its 8 or 16 LSTM layers with ``hidden = 1024 * width``.
    At ``width=1`` these are the paper's models.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    if not 0 < width <= 1:
        raise ValueError(f"width={width} must be in (0, 1]")
    if name == "vgg16":
        if width == 1.0:

            return vgg16(num_classes=num_classes)
        # torchvision's VGG-16 configuration "D": conv widths, 0 = max-pool
        cfg = [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0]
        layers: list[nn.Module] = []
        c_in = 3
        for v in cfg:
            if v == 0:
                layers.append(nn.MaxPool2d(2, 2))
            else:
                c = max(4, int(v * width))
                layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(inplace=False)]
                c_in = c
        side = max(1, image_size // 32)
        hidden = max(16, int(4096 * width))
        return nn.Sequential(
            *layers,
            nn.AdaptiveAvgPool2d((side, side)),
            nn.Flatten(),
            nn.Linear(c_in * side * side, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )
    if name == "resnet50":
        from torchvision.models.resnet import Bottleneck, ResNet

        net = ResNet(
            Bottleneck, [3, 4, 6, 3], num_classes=num_classes, width_per_group=max(4, int(64 * width))
        )
        return net
    if name in ("gnmt8", "gnmt16"):

        hidden = max(16, int(1024 * width)) // 2 * 2
        return gnmt(num_layers=8 if name == "gnmt8" else 16, vocab=vocab, hidden=hidden)
    raise ValueError(f"unknown paper model {name!r}; choose vgg16, resnet50, gnmt8 or gnmt16")


def sample_input(name: str, *, batch: int, image_size: int = 224, seq_len: int = 16, vocab: int = 1000,
                 seed: int = 0) -> Any:
    """A deterministic input batch for ``name``: images ``[B,3,S,S]`` or GNMT's ``(src, tgt)`` tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if name in ("gnmt8", "gnmt16"):
        src = torch.randint(2, vocab, (batch, seq_len), generator=g)
        tgt = torch.randint(2, vocab, (batch, seq_len), generator=g)
        return (src, tgt)
    return torch.randn(batch, 3, image_size, image_size, generator=g)


def random_batches(name: str, *, steps: int, batch: int, image_size: int = 224, seq_len: int = 16,
                   vocab: int = 1000, num_classes: int = 1000, seed: int = 0) -> list[tuple[Any, Any]]:
    """``steps`` minibatches of random inputs and labels for ``name`` (a ``data`` callable for
    ``pl.train``)."""
    import torch

    out = []
    g = torch.Generator().manual_seed(seed + 1)
    for k in range(steps):
        x = sample_input(
            name, batch=batch, image_size=image_size, seq_len=seq_len, vocab=vocab, seed=seed + k
        )
        if name in ("gnmt8", "gnmt16"):
            y = torch.randint(2, vocab, (batch, seq_len), generator=g)
        else:
            y = torch.randint(0, num_classes, (batch,), generator=g)
        out.append((x, y))
    return out


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy for classifier logits ``[B,C]`` and sequence logits ``[B,T,V]`` alike."""
    import torch.nn.functional as F

    if output.dim() == 3:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loopback(
    rank: int, world: int, port: int, nbytes: int, allreduce_bytes: int, repeats: int, out: Any
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    buf = torch.zeros(nbytes // 4)
    times = []
    for _ in range(repeats + 1):    # ping-pong between ranks 0 and 1, the others wait
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append(time.perf_counter() - t0)
    ar_times = []
    if allreduce_bytes > 0:
        flat = torch.zeros(max(1, allreduce_bytes // 4))
        # a few MB take milliseconds, noisy on a loaded machine: many repeats, the median
        for _ in range(5 * repeats + 1):    # every rank, started together (barrier): no skew in the time
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            ar_times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put((statistics.median(times[1:]), statistics.median(ar_times[1:]) if ar_times else 0.0))
    dist.destroy_process_group()


def gloo_loopback(workers: int = 2, *, nbytes: int = 16 << 20, allreduce_bytes: int = 0,
                  repeats: int = 5) -> tuple[float, float | None]:
    """This machine's gloo links between ``workers`` processes: ``(point-to-point, all-reduce)`` bytes/s.

    Point-to-point: median of ``repeats`` ping-pongs of ``nbytes`` each way between two processes
    (``2 * nbytes / time``), the bandwidth of the flat cluster model measure mode simulates against.
    All-reduce (``None`` unless ``allreduce_bytes > 0``): the median time ``t`` of ``5 * repeats``
    all-reduces of ``allreduce_bytes`` over all ``workers`` (started together) turned into the per-link
    bandwidth of
    the cost model's ring formula, ``2 (p - 1) / p * allreduce_bytes / t``
    (``CostModel(allreduce_bandwidth=...)``). On one CPU it comes out well below the ping-pong's
    (2-5x slower here): every process sends, receives and sums at once on the cores that also copy.
    """
    import torch.multiprocessing as mp

    if workers < 2:
        raise ValueError(f"workers={workers} must be >= 2 to measure a link")
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_loopback, args=(workers, _free_port(), nbytes, allreduce_bytes, repeats, q),
                       nprocs=workers, start_method="spawn")
    t_pp, t_ar = q.get()
    p2p = 2 * nbytes / float(t_pp)
    ar = (
        2 * (workers - 1) / workers * allreduce_bytes / float(t_ar)
        if allreduce_bytes > 0 and t_ar > 0
        else None
    )
    return p2p, ar


def gloo_loopback_bandwidth(nbytes: int = 16 << 20, repeats: int = 5) -> float:
    """Bytes per second of a gloo point-to-point transfer between two processes on this machine.

    Median of ``repeats`` ping-pongs of ``nbytes`` each way (``2 * nbytes / time``). This is the
    bandwidth of the flat cluster model that measure mode simulates against (see :func:`gloo_loopback`).
    """
    return gloo_loopback(2, nbytes=nbytes, repeats=repeats)[0]


def optimizer_bandwidth(model: nn.Module, optimizer: Any, state_factor: int, repeats: int = 5) -> float:
    """The memory bandwidth (bytes/s) the simulator's optimizer step should use on this machine.

    Times ``optimizer(params).step()`` on ``model``'s parameters with gradients set (median of
    ``repeats``, one thread like the workers) and returns ``param_bytes * (3 + state_factor) / time``,
    the rate :meth:`pipelab.costs.CostModel.update_s` assumes (weights, gradients and optimizer
    state streamed once). The default (a V100's HBM) would make a CPU's step free.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters to time an optimizer step on")
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = optimizer(params)
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    return nbytes * (3 + state_factor) / statistics.median(times[1:])


def _steady_throughput(run: Any, batch: int, warmup: int, *, typical: bool = False) -> float:
    """Samples/s of a run after its first ``warmup`` minibatches, from its trace (updates on stage 0).

    ``typical=False``: minibatches completed over the span they took (the mean rate). ``typical=True``:
    one minibatch per *median* interval between consecutive completions, the steady-state period
    without the stalls that other work on a shared machine adds now and then (a stall of one process
    holds up the whole pipeline or the all-reduce, and lands in a few intervals only).
    """
    evs = [e for e in run.trace.compute_events() if e.kind == "U"]
    if not evs:
        return float(run.throughput)
    by_mb: dict[int, float] = {}
    for e in evs:
        by_mb[e.microbatch] = max(by_mb.get(e.microbatch, 0.0), e.end_s)
    ends = sorted(by_mb.values())
    if len(ends) <= warmup + 1:
        return float(run.throughput)
    if typical:
        period = statistics.median(b - a for a, b in zip(ends[warmup:], ends[warmup + 1:]))
        if period > 0:
            return batch / period
    span = ends[-1] - ends[warmup]
    return (len(ends) - 1 - warmup) * batch / span


def layout(plan: Plan) -> str:
    """A plan's stage layout, ``"[0,12)x1 [12,20)x1"``: what tells two plans of one config apart."""
    return " ".join(f"[{s.start},{s.end})x{s.replicas}" for s in plan.stages)


def tail_plan(prof: Profile, workers: int) -> Plan:
    """PipeDream's VGG-16 split on ``workers``: every layer before the first fully connected one
    replicated on ``workers - 1`` workers, the classifier on the last (``15-1`` on 16 GPUs; ``1-1`` on
    two). Models without a ``Linear`` layer split where half the weights lie behind the cut."""
    kinds = [layer.kind for layer in prof.layers]
    if "Linear" in kinds and kinds.index("Linear") > 0:
        cut = kinds.index("Linear")
    else:
        total, run, cut = prof.param_bytes, 0, len(prof) - 1
        for i, layer in enumerate(prof.layers):
            run += layer.param_bytes
            if run >= total / 2:
                cut = max(1, min(i + 1, len(prof) - 1))
                break
    return Plan.from_boundaries(len(prof), [cut], [workers - 1, 1], method="manual",
                                batch_size=prof.batch_size, model=prof.model,
                                profile_fingerprint=prof.fingerprint())


def measure_row(model: str, *, workers: int = 2, steps: int = 12, warmup: int = 3, batch: int = 32,
                width: float = 0.125, image_size: int = 32, seq_len: int = 8, backend: str = "gloo",
                rounds: int = 2, bandwidth: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Table 1's question for real on this machine, at reduced scale.

    Profiles the reduced model on this CPU with one thread (as each worker runs), models the machine
    as ``Cluster.flat(workers, bandwidth=<measured gloo ping-pong>)``, partitions (PipeDream's DP;
    the best straight pipeline; :func:`tail_plan`, PipeDream's VGG-16 split), then runs every
    distinct plan (by stage layout) and data parallelism with ``pl.train`` (``rounds`` times,
    alternating) and compares measured with simulated speed-ups. ``out["runs"]`` lists every run
    (round, layout, samples/s) so that all of them can be kept; ``*_measured_min``/``_max`` are the
    spread of a plan's paired per-round speed-ups.

    The simulation models pipelab's runtime, not PyTorch DDP: a replicated stage all-reduces its
    gradients in one call after the minibatch's backward (``allreduce_overlap="none"``), at the
    all-reduce bandwidth measured here (:func:`gloo_loopback`), and the optimizer step (plain SGD)
    streams memory at the rate measured here (:func:`optimizer_bandwidth`). A run's throughput is one
    minibatch per median interval between completed minibatches after warm-up (the steady state the
    simulator predicts, without the stalls that other work on a shared machine adds; the mean rate
    is reported too, ``*_measured_speedup_mean_rate``). A measured speed-up is the median over
    rounds of the plan's throughput over data parallelism's in the same round (paired, so that load
    drifting between rounds cancels). ``bandwidth`` (bytes/s) skips the loopback measurements
    (tests; the all-reduce then runs at that bandwidth too).
    """
    import torch


    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    vocab = 256
    model_fn = functools.partial(
        reduced_model, model, width=width, image_size=image_size, vocab=vocab, num_classes=10
    )
    sample = sample_input(model, batch=batch, image_size=image_size, seq_len=seq_len, vocab=vocab)
    opt = functools.partial(torch.optim.SGD, lr=0.01)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the workers run one thread each (pipelab.runtime.worker.run_distributed)
    try:
        prof = profile_model(
            model_fn(), sample, device="cpu", progress=False, model_name=f"{model}-w{width:g}"
        )
        mem_bw = optimizer_bandwidth(model_fn(), opt, OPTIMIZER_STATE["sgd"])
    finally:
        torch.set_num_threads(threads)
    if bandwidth is None:
        bw, ar_bw = gloo_loopback(workers, allreduce_bytes=prof.param_bytes)
    else:
        bw, ar_bw = float(bandwidth), None
    cl = Cluster.flat(workers, bandwidth=bw)
    model_opts: dict[str, Any] = {
        "allreduce_overlap": "none",
        "allreduce_bandwidth": ar_bw,
        "optimizer": "sgd",
    }
    plans = {"chosen": partition(prof, cl, method="pipedream", **model_opts),
             "straight": partition(prof, cl, method="pipedream", straight=True, **model_opts),
             "tail": tail_plan(prof, workers),
             "dp": partition(prof, cl, method="dp", **model_opts)}
    # one run per distinct plan (stage layout) and round, rounds alternating so that load on a shared
    # machine affects every plan alike; speed-ups are paired per round, then the median is kept
    distinct: dict[str, Plan] = {}
    for plan in plans.values():
        distinct.setdefault(layout(plan), plan)
    samples: dict[str, list[float]] = {c: [] for c in distinct}
    mean_rates: dict[str, list[float]] = {c: [] for c in distinct}
    runs: list[dict[str, Any]] = []
    for rnd in range(rounds):
        for config, plan in distinct.items():
            # As in PipeDream's baseline (and the simulator's dp) every data-parallel replica processes
            # a whole profile minibatch per step: the runtime's dp minibatch is `workers` of them, split.
            method, reps = ("dp", plan.num_workers) if plan.num_stages == 1 else ("pipedream", 1)
            data = functools.partial(
                random_batches,
                model,
                steps=steps + warmup,
                batch=batch * reps,
                image_size=image_size,
                seq_len=seq_len,
                vocab=vocab,
                num_classes=10,
                seed=seed,
            )
            run = train(
                model_fn,
                plan,
                method=method,
                data=data,
                loss_fn=cross_entropy,
                optimizer=opt,
                steps=steps + warmup,
                microbatches=reps,
                backend=backend,
                seed=seed,
                progress=False,
            )
            samples[config].append(_steady_throughput(run, batch * reps, warmup, typical=True))
            mean_rates[config].append(_steady_throughput(run, batch * reps, warmup))
            runs.append({"round": rnd, "layout": config, "config": plan.config,
                         "samples_per_s": round(samples[config][-1], 1),
                         "samples_per_s_mean_rate": round(mean_rates[config][-1], 1),
                         "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")})
    measured = {name: statistics.median(samples[layout(plan)]) for name, plan in plans.items()}
    sims = {name: simulate_plan(plan, prof, cl, minibatches=max(24, 4 * workers), memory_bandwidth=mem_bw,
                                **model_opts) for name, plan in plans.items()}
    simulated = {name: r.throughput for name, r in sims.items()}
    out: dict[str, Any] = {
        "model": f"{model} (width {width:g}, {image_size if model[:4] != 'gnmt' else seq_len})",
        "workers": workers,
        "gloo_GBps": round(bw / 1e9, 3),
        "allreduce_GBps": round(ar_bw / 1e9, 3) if ar_bw else round(bw / 1e9, 3),
        "optimizer_GBps": round(mem_bw / 1e9, 2),
        "rounds": rounds,
        "allreduce_overlap": "none",
        # the 1-minute load average before and after: a shared machine's other work
        # shows in every measured number
        "load_before": round(load0, 2),
        "load_after": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan"),
    }
    # the model before it matched the runtime (DDP-style overlap at the ping-pong bandwidth, a free
    # optimizer step), for contrast: how far the runtime's terms move the straight pipeline's speed-up
    ddp = {name: simulate_plan(plans[name], prof, cl, minibatches=max(24, 4 * workers)).throughput
           for name in ("straight", "dp")}
    out["straight_simulated_speedup_ddp"] = round(ddp["straight"] / ddp["dp"], 3)
    dp_cfg = layout(plans["dp"])
    for name in ("chosen", "straight", "tail"):
        cfg = layout(plans[name])
        ratios = [a / b for a, b in zip(samples[cfg], samples[dp_cfg])]
        m = statistics.median(ratios)
        m_mean = statistics.median(a / b for a, b in zip(mean_rates[cfg], mean_rates[dp_cfg]))
        sim = simulated[name] / simulated["dp"]
        q = sorted(ratios)
        out.update({f"{name}_config": plans[name].config, f"{name}_layout": cfg,
                    f"{name}_measured_speedup": round(m, 3),
                    f"{name}_measured_min": round(q[0], 3), f"{name}_measured_max": round(q[-1], 3),
                    f"{name}_simulated_speedup": round(sim, 3), f"{name}_error": round(sim / m - 1, 3),
                    f"{name}_within_15pct": abs(sim / m - 1) <= 0.15,
                    f"{name}_measured_rounds": " ".join(f"{r:.3f}" for r in ratios),
                    f"{name}_measured_speedup_mean_rate": round(m_mean, 3)})
    out["distinct_plans"] = len(distinct)
    out["runs"] = runs
    out.update({f"{k}_samples_per_s": round(v, 1) for k, v in measured.items()})
    out.update({f"{k}_simulated_samples_per_s": round(v, 1) for k, v in simulated.items()})
    return out
