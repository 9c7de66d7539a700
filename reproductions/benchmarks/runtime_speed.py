"""Runtime speed: pipelab's multi-process 1F1B-flush against torch.distributed.pipelining, and PipeDream.

Setup (one invocation, CPU, gloo, one thread per process): 8 x (Linear(1024, 1024) + ReLU), split
into two stages of 4 blocks, minibatch 64, 8 microbatches, SGD with momentum, MSE loss.

1F1B-flush (target: pipelab >= 1.2 x torch):

* pipelab ``1f1b-flush`` with ``coalesce_wgrad=True`` (each Linear's weight gradient as one 64-row
  GEMM at the flush, :mod:`pipelab.runtime.coalesce`) and without it (the like-for-like run: the
  same per-microbatch GEMMs as torch), against ``torch.distributed.pipelining.Schedule1F1B`` on the
  same model, split and data. Both ratios are printed, so the like-for-like one stays visible.

PipeDream (target: >= 0.9 x twice the single-process *microbatched* throughput; a perfect 2-stage
pipeline doubles the throughput of one process doing the same work):

* primary, like for like: pipelab ``pipedream`` on minibatches of the microbatch size (8 rows, one
  update each; PipeDream pipelines minibatches, SOSP'19 §3.1) against 2 x one process training
  8-row minibatches with one update each: the same GEMM sizes and the same number of optimizer
  steps per sample, so the ratio measures the pipeline alone. Printed next to it: the same against
  2 x the issue's literal baseline, one process training the 64-row minibatch as 8 microbatches of
  8 rows (same GEMMs, but one update per 64 rows, so the optimizer costs it 8x less per sample).
* kept for context: pipedream on 64-row minibatches (one microbatch each) against one process on the
  unsplit 64-row minibatch; with 8-row microbatches a Linear(1024, 1024) GEMM is bound by reading
  its weights, 2.5-3x slower per sample than with 64 rows on this CPU, so only same-size baselines
  compare like for like. Also its steady state (update-to-update, fill and drain excluded; with 12
  timed minibatches the fill/drain of a 2-stage pipeline is ~1.5 of them).
* the machine's ceiling, for each minibatch size: two independent single-process loops run at the
  same time; their summed throughput over 2 x one alone is the most any 2-process method can reach
  here (cores shared with other work, memory bandwidth and caches shared between the two); and
  pipedream over that ceiling, round by round: the share of the attainable that the pipeline gets
  (it pays one weight copy per update on stage 0 for the stashed version, SOSP'19 §3.3, the
  runtime's per-action work, and the coupling of its two processes: a stalled stage stalls both).

Allocator: pipelab's worker processes call :func:`pipelab.runtime.options.tune_malloc` (freed
buffers stay in the process instead of being page-faulted in again every step); every other
contender here (torch's stage processes, the single-process loops) calls it too, so the ratios
compare like for like. The effect alone is printed last: one single-process 8-row loop with
glibc's defaults over the tuned one.

Throughput = samples / seconds over ``--steps`` minibatches of 64 (or as many samples in 8-row
minibatches) after one warm-up minibatch, on every side (process start-up and the first step's
allocations excluded alike). Each round runs every contender once, in an order that alternates
between rounds (forwards, then backwards), so load drifting on a shared machine does not favour one
side; medians over ``--rounds`` (>= 5) and the median of the per-round paired ratios are printed.

    python reproductions/benchmarks/runtime_speed.py [--steps 12] [--rounds 7]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.models.demo import linear_blocks  # noqa: E402
from pipelab.runtime.options import tune_malloc  # noqa: E402

WIDTH, BLOCKS, BATCH, MICRO = 1024, 8, 64, 8
ROWS = BATCH // MICRO     # rows of a microbatch (and of pipedream's like-for-like minibatch)
optimizer = functools.partial(torch.optim.SGD, lr=1e-3, momentum=0.9)


def model_fn() -> nn.Sequential:
    """8 x (Linear(1024, 1024) + ReLU)."""
    return linear_blocks(WIDTH, BLOCKS)


def _batch(seed: int = 0, rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    return x[:rows].clone(), y[:rows].clone()


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The same fixed minibatch of 64, over and over (deterministic, as pipelab requires)."""
    x, y = _batch()
    while True:
        yield x, y


def data_small() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first 8 rows of that minibatch, over and over (pipedream's like-for-like minibatch)."""
    x, y = _batch(rows=ROWS)
    while True:
        yield x, y


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error."""
    return nn.functional.mse_loss(out, y)


def steady_throughput(trace: pl.Trace, microbatches: int, minibatches: int, rows: int = BATCH) -> float:
    """Samples/s over minibatches 1.. (the first is warm-up on every side of the comparison)."""
    def minibatch(e: pl.Event) -> int:
        return e.microbatch if e.kind == "U" else e.microbatch // microbatches

    evs = [e for e in trace.compute_events() if minibatch(e) >= 1]
    span = max(e.end_s for e in evs) - min(e.start_s for e in evs)
    return (minibatches - 1) * rows / span


def update_rate(trace: pl.Trace, rows: int = BATCH) -> float:
    """Samples/s between the ends of the updates of minibatch 1 and of the last one (the time a minibatch
    adds once the pipeline is full: PipeDream's steady state, SOSP'19 §3.1; fill and drain excluded)."""
    done: dict[int, float] = {}
    for e in trace.compute_events():
        if e.kind == "U":   # a minibatch is done when its last stage-update ends
            done[e.microbatch] = max(done.get(e.microbatch, 0.0), e.end_s)
    last = max(done)
    return (last - 1) * rows / (done[last] - done[1])


def _pipelab(method: str, steps: int, steady: list[float] | None = None, *, coalesce: bool = False,
             rows: int = BATCH) -> float:
    """Samples/s of a pipelab run: ``steps`` minibatches of 64 rows' worth after one warm-up minibatch."""
    plan = pl.Plan.from_boundaries(2 * BLOCKS, [BLOCKS])
    M = MICRO if method != "pipedream" else 1
    n = steps * BATCH // rows + 1
    opts: dict[str, Any] = {"coalesce_wgrad": True} if coalesce else {}
    res = pl.train(model_fn, plan, method=method, data=data if rows == BATCH else data_small, loss_fn=loss_fn,
                   optimizer=optimizer, steps=n, microbatches=M, progress=False, timeout=600, **opts)
    if steady is not None:
        steady.append(update_rate(res.trace, rows))
    return steady_throughput(res.trace, M, n, rows)


def _torch_worker(rank: int, port: int, steps: int, out: object) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    tune_malloc()    # the same allocator setting as pipelab's workers: like for like
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=600))
    torch.manual_seed(0)
    full = model_fn()
    part = full[: 2 * BLOCKS // 2] if rank == 0 else full[2 * BLOCKS // 2:]
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))   # shapes inferred at the first step
    sched = Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=loss_fn)
    opt = optimizer(part.parameters())
    x, y = _batch()

    def step() -> None:
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=[])
        opt.step()

    step()   # warm-up (shape checks, buffers), as pipelab's processes are warm when their clock starts
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    if rank == 0:
        out.put(steps * BATCH / (time.perf_counter() - t))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def _torch(steps: int) -> float:
    import torch.multiprocessing as mp

    from pipelab.runtime.job import free_port

    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=_torch_worker, args=(r, port, steps, q)) for r in range(2)]
    for p in ps:
        p.start()
    thr = q.get(timeout=600)
    for p in ps:
        p.join(60)
    return float(thr)


def _single(steps: int, micro: int = MICRO, rows: int = BATCH) -> float:
    """One process, whole model: minibatches of ``rows`` rows, each as ``micro`` microbatches, one
    update each."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = model_fn()
    opt = optimizer(model.parameters())
    x, y = _batch(rows=rows)
    xs, ys = x.split(rows // micro), y.split(rows // micro)

    def step() -> None:
        opt.zero_grad()
        for a, b in zip(xs, ys):
            (loss_fn(model(a), b) / micro).backward()
        opt.step()

    n = steps * BATCH // rows
    step()
    t = time.perf_counter()
    for _ in range(n):
        step()
    return n * rows / (time.perf_counter() - t)


def _single_to_queue(steps: int, rows: int, out: object, tuned: bool = True) -> None:
    torch.set_num_threads(1)
    if tuned:
        tune_malloc()
    out.put(_single(steps, 1, rows))  # type: ignore[attr-defined]


def _pair(steps: int, rows: int = BATCH, n: int = 2, tuned: bool = True) -> float:
    """Summed throughput of ``n`` independent single-process loops running at once (2: the ceiling)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    ps = [ctx.Process(target=_single_to_queue, args=(steps, rows, q, tuned)) for _ in range(n)]
    for p in ps:
        p.start()
    total = sum(q.get(timeout=600) for _ in range(n))
    for p in ps:
        p.join(60)
    return float(total)


def _ratio(name: str, num: list[float], den: list[float], factor: float = 1.0, target: str = "") -> None:
    med = statistics.median(num) / (factor * statistics.median(den))
    paired = statistics.median(a / (factor * b) for a, b in zip(num, den))
    print(f"{name:<58s} {med:.2f} (ratio of medians), {paired:.2f} (median of paired rounds){target}")


def main() -> None:
    """Run the comparison and print the figures."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--steps", type=int, default=12, help="timed minibatches of 64 per run (after one warm-up)"
    )
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (at least 5)")
    a = ap.parse_args()
    if a.rounds < 5:
        ap.error(
            f"--rounds {a.rounds}: use at least 5 rounds (medians of fewer are noise on a shared machine)"
        )
    if a.steps < 2:
        ap.error(f"--steps {a.steps}: time at least 2 minibatches")
    torch.set_num_threads(1)
    tuned = tune_malloc()    # this process runs the single-process baselines: as pipelab's workers
    _pipelab("1f1b-flush", 2)   # start the fork server once, outside the timings
    r: dict[str, list[float]] = {k: [] for k in (
        "flush", "coalesced", "torch", "pd64", "pd64_steady", "pd8", "single64", "single8micro", "single8",
        "pair64", "pair8", "single8_untuned")}
    runs = [
        lambda: r["coalesced"].append(_pipelab("1f1b-flush", a.steps, coalesce=True)),
        lambda: r["torch"].append(_torch(a.steps)),
        lambda: r["flush"].append(_pipelab("1f1b-flush", a.steps)),
        lambda: r["pd8"].append(_pipelab("pipedream", a.steps, rows=ROWS)),
        lambda: r["single8"].append(_single(a.steps, 1, ROWS)),
        lambda: r["single8micro"].append(_single(a.steps)),
        lambda: r["pair8"].append(_pair(a.steps, ROWS)),
        lambda: r["single8_untuned"].append(_pair(a.steps, ROWS, 1, tuned=False)),
        lambda: r["pd64"].append(_pipelab("pipedream", a.steps, r["pd64_steady"])),
        lambda: r["single64"].append(_single(a.steps, 1)),
        lambda: r["pair64"].append(_pair(a.steps)),
    ]
    for k in range(a.rounds):
        for run in (runs if k % 2 == 0 else runs[::-1]):
            run()
        last = {n: v[-1] for n, v in r.items()}
        print(
            f"round {k} (samples/s): 1f1b-flush pipelab coalesced {last['coalesced']:.1f}, pipelab "
            f"{last['flush']:.1f}, torch {last['torch']:.1f} | 8-row: pipedream {last['pd8']:.1f}, single "
            f"{last['single8']:.1f}, single 8 microbatches {last['single8micro']:.1f}, two singles "
            f"{last['pair8']:.1f} | 64-row: pipedream {last['pd64']:.1f} (steady {last['pd64_steady']:.1f}), "
            f"single {last['single64']:.1f}, two singles {last['pair64']:.1f}",
            flush=True,
        )
    med = {n: statistics.median(v) for n, v in r.items()}
    print("median samples/s: " + ", ".join(f"{n} {v:.1f}" for n, v in med.items()))
    print("-- 1F1B-flush, 2 stages, 8 microbatches of 8 rows (target >= 1.2):")
    _ratio("pipelab coalesce_wgrad / torch Schedule1F1B:", r["coalesced"], r["torch"], target="  <- target")
    _ratio("pipelab (per-microbatch weight grads, as torch) / torch:", r["flush"], r["torch"])
    _ratio("pipelab coalesce_wgrad / pipelab plain:", r["coalesced"], r["flush"])
    print("-- pipedream, 2 stages (target >= 0.9):")
    _ratio("pipedream 8-row / (2 x single 8-row, update each):", r["pd8"], r["single8"], 2,
           "  <- target (like for like)")
    _ratio("pipedream 8-row / (2 x single, 8 microbatches of 8):", r["pd8"], r["single8micro"], 2,
           "  (one update per 64 rows)")
    _ratio("ceiling 8-row: two singles at once / (2 x one alone):", r["pair8"], r["single8"], 2)
    _ratio("pipedream 8-row / ceiling (two 8-row singles at once):", r["pd8"], r["pair8"],
           target="  (the share of what 2 processes get here)")
    _ratio("pipedream 64-row / (2 x single 64-row):", r["pd64"], r["single64"], 2)
    _ratio("pipedream 64-row steady state / (2 x single 64-row):", r["pd64_steady"], r["single64"], 2)
    _ratio("ceiling 64-row: two singles at once / (2 x one alone):", r["pair64"], r["single64"], 2)
    _ratio("single 8-row, glibc malloc defaults / malloc tuned:", r["single8_untuned"], r["single8"],
           target=f"  (every contender above runs tuned: {tuned})")
    print(f"(machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; one thread per process)")


if __name__ == "__main__":
    main()
