"""Per-message cost: pipelab's runtime against torch.distributed.pipelining on one two-stage plan.

Setup (one invocation, CPU, gloo, 2 processes of one thread each, pinned as pipelab pins them):
three models, each cut into the same two stages for both engines, trained with ``gpipe`` and
``1f1b-flush`` (torch: ``ScheduleGPipe``, ``Schedule1F1B`` on the stage modules pipelab's bridge cuts,
:func:`pipelab.torch_bridge.stage_modules`):

* small MLP: 4 x (Linear(32, 32) + ReLU), batch 16, M = 4 (actions of ~0.1 ms: the per-message cost shows);
* CNN: ``notebooks/01_quickstart``'s ``demo.small_cnn`` on 8x8 images, batch 64, M = 4;
* large MLP: 8 x (Linear(512, 512) + ReLU), batch 64, M = 8 (actions of milliseconds).

Contenders: pipelab over gloo's point-to-point path (``shared_memory=False``), pipelab with
``shared_memory=True`` (:mod:`pipelab.runtime.shm`), torch's engine. Each round runs every contender
once, in an order that alternates between rounds. Throughput = samples / second between minibatch
completions after a warm-up (pipelab: its trace's ``U`` ends on worker 0, first fifth left out; torch:
between two barriers after 3 warm-up steps). The physical limit is 2 x the single-process rate at the
same microbatch size (one process, M microbatches accumulated, one step) x M / (M + P - 1), measured in
the same round. The *fixed cost* per action (and per message) is the gap between a contender's time
per minibatch and the limit's, divided by the actions (messages) of the busier worker per minibatch.

    python reproductions/benchmarks/stall_vs_torch.py [--rounds 3] [--steps 40] [--models small,cnn,large]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from _pair import run_pair  # noqa: E402  (this folder's helper: two processes, reaped)
from torch import nn  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.models.demo import linear_blocks, small_cnn  # noqa: E402
from pipelab.runtime.options import tune_malloc  # noqa: E402

METHODS = ("gpipe", "1f1b-flush")
optimizer = functools.partial(torch.optim.SGD, lr=1e-3, momentum=0.9)


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


def _xent(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)


def _mlp_batch(width: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def _cnn_batch(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g)


# name -> (model_fn, layers, cut, batch, microbatches, batch_fn, loss_fn)
Entry = tuple[Callable[[], nn.Module], int, int, int, int, Callable[[], Any], Callable[..., Any]]
MODELS: dict[str, Entry] = {
    "small": (functools.partial(linear_blocks, 32, 4), 8, 4, 16, 4,
              functools.partial(_mlp_batch, 32, 16), _mse),
    "cnn": (small_cnn, 9, 3, 64, 4, functools.partial(_cnn_batch, 64), _xent),
    "large": (functools.partial(linear_blocks, 512, 8), 16, 8, 64, 8,
              functools.partial(_mlp_batch, 512, 64), _mse),
}


def _data(name: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    x, y = MODELS[name][5]()
    while True:
        yield x, y


def _plan(name: str) -> pl.Plan:
    return pl.Plan.from_boundaries(MODELS[name][1], [MODELS[name][2]])


def _pipelab(name: str, method: str, steps: int, shm: bool) -> float:
    model_fn, _, _, batch, m, _, loss_fn = MODELS[name]
    res = pl.train(model_fn, _plan(name), method=method, data=functools.partial(_data, name), loss_fn=loss_fn,
                   optimizer=optimizer, steps=steps, microbatches=m, progress=False, timeout=600,
                   shared_memory=shm)
    ends = sorted(e.end_s for e in res.trace.events if e.kind == "U" and e.worker == 0)
    k0 = len(ends) // 5
    return (len(ends) - 1 - k0) * batch / (ends[-1] - ends[k0])


def _torch_worker(rank: int, port: int, name: str, method: str, steps: int, out: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.set_num_threads(1)
    tune_malloc()
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})   # as pipelab pins its workers
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=600))
    model_fn, _, _, batch, m, batch_fn, loss_fn = MODELS[name]
    torch.manual_seed(0)
    sched = pl.schedules.build("1f1b-flush", _plan(name), microbatches=m, minibatches=1)
    mod = pl.torch_bridge.stage_modules(_plan(name), sched, model_fn(), rank=rank)[rank]
    cls = Schedule1F1B if method == "1f1b-flush" else ScheduleGPipe
    pipe = cls(PipelineStage(mod, rank, 2, torch.device("cpu")), m, loss_fn=loss_fn)
    opt = optimizer(list(mod.parameters()))
    x, y = batch_fn()

    def step() -> None:
        opt.zero_grad()
        pipe.step(x, target=y)
        opt.step()

    for _ in range(3):
        step()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    if rank == 0:
        out.put(steps * batch / (time.perf_counter() - t))
    dist.destroy_process_group()


def _torch(name: str, method: str, steps: int) -> float:
    return float(run_pair(_torch_worker, name, method, steps, reports=1, timeout=600)[0])


def _single(name: str, steps: int) -> float:
    """One process: M microbatches accumulated, one optimizer step per minibatch."""
    model_fn, _, _, batch, m, batch_fn, loss_fn = MODELS[name]
    torch.manual_seed(0)
    model = model_fn()
    opt = optimizer(list(model.parameters()))
    x, y = batch_fn()
    xs, ys = x.chunk(m), y.chunk(m)

    def step() -> None:
        opt.zero_grad()
        for a, b in zip(xs, ys):
            (loss_fn(model(a), b) / m).backward()
        opt.step()

    for _ in range(3):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch / (time.perf_counter() - t)


def _fmt(v: list[float]) -> str:
    return f"{statistics.median(v):7.0f} [{min(v):.0f}-{max(v):.0f}]"


def main() -> None:
    """Run the rounds and print the figures."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (at least 3)")
    ap.add_argument("--steps", type=int, default=40, help="minibatches per run")
    ap.add_argument("--models", default="small,cnn,large", help=f"comma-separated, of {', '.join(MODELS)}")
    a = ap.parse_args()
    names = [n for n in a.models.split(",") if n]
    bad = [n for n in names if n not in MODELS]
    if bad:
        ap.error(f"--models {','.join(bad)}: unknown; choose from {', '.join(MODELS)}")
    if a.rounds < 3:
        ap.error(f"--rounds {a.rounds}: use at least 3 rounds (fewer are noise on a shared machine)")
    if a.steps < 10:
        ap.error(f"--steps {a.steps}: time at least 10 minibatches")
    torch.set_num_threads(1)
    tune_malloc()
    print(f"start: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for name in names:
        _report(name, _rounds(name, a.rounds, a.steps))
    print(f"end: load average {os.getloadavg()[0]:.1f}")


def _rounds(name: str, rounds: int, steps: int) -> dict[str, list[float]]:
    """Every contender once per round, in an order alternating between rounds."""
    r: dict[str, list[float]] = {"single": []}
    runs: list[tuple[str, Callable[[], float]]] = [("single", functools.partial(_single, name, steps))]
    for m in METHODS:
        runs += [(f"gloo {m}", functools.partial(_pipelab, name, m, steps, False)),
                 (f"shm {m}", functools.partial(_pipelab, name, m, steps, True)),
                 (f"torch {m}", functools.partial(_torch, name, m, steps))]
    for key, _ in runs:
        r[key] = []
    for k in range(rounds):
        for key, run in (runs if k % 2 == 0 else runs[::-1]):
            r[key].append(run())
        print(f"{name} round {k}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in r.items())
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    return r


def _report(name: str, r: dict[str, list[float]]) -> None:
    _, _, _, batch, m, _, _ = MODELS[name]
    p = 2
    limit = [2 * s * m / (m + p - 1) for s in r["single"]]
    print(f"\n== {name}: batch {batch}, M = {m}; samples/s median [range] over {len(limit)} rounds")
    print(f"  single process {_fmt(r['single'])};  two-process physical limit (1F1B/GPipe) {_fmt(limit)}")
    # per worker per minibatch: M F + M B + 1 U actions; M messages sent and M received
    actions, messages = 2 * m + 1, 2 * m
    for meth in METHODS:
        for who in ("gloo", "shm", "torch"):
            v = r[f"{who} {meth}"]
            gap = [batch / x - batch / lim for x, lim in zip(v, limit)]
            per_a = statistics.median(gap) / actions * 1e6
            per_m = statistics.median(gap) / messages * 1e6
            share = statistics.median(x / lim for x, lim in zip(v, limit))
            print(f"  {meth:10s} {who:5s} {_fmt(v)}  {share:5.0%} of the limit;  fixed cost "
                  f"{per_a:6.0f} us per action, {per_m:6.0f} us per message")
        for who in ("gloo", "shm"):
            ratio = [x / t for x, t in zip(r[f"{who} {meth}"], r[f"torch {meth}"])]
            verdict = "ahead of" if statistics.median(ratio) >= 1 else "BEHIND"
            print(f"  {meth:10s} pipelab {who} / torch, paired: median {statistics.median(ratio):.2f} "
                  f"[{min(ratio):.2f}-{max(ratio):.2f}] ({verdict} torch; target >= 1.2)")
    for who in ("gloo", "shm", "torch"):
        ratio = [x / g for x, g in zip(r[f"{who} 1f1b-flush"], r[f"{who} gpipe"])]
        print(f"  {who}: 1F1B / GPipe, paired: median {statistics.median(ratio):.2f} "
              f"[{min(ratio):.2f}-{max(ratio):.2f}]")


if __name__ == "__main__":
    main()
