"""One plan and schedule on two engines: pipelab's runtime and torch.distributed.pipelining via the bridge.

Setup (one invocation, CPU, gloo, 2 processes of one thread each): 8 x (Linear(512, 512) + ReLU) cut into
two stages of 4 blocks (one pipelab ``Plan``), minibatch 64 as 8 microbatches, SGD with momentum, MSE
loss. For each schedule (``1f1b-flush``, ``gpipe``, ``zb-h1``, built once by ``pl.schedules.build``):

* pipelab: ``pl.train(..., schedule=...)`` on its own runtime (its processes, p2p and trace);
* torch via the bridge: every process calls ``pl.torch_bridge.to_torch(plan, schedule, model)`` and
  steps torch's engine (``_PipelineScheduleRuntime`` running pipelab's order) in a plain loop;
* for 1F1B also torch's own ``Schedule1F1B`` on the same two stage modules, to show what the bridge's
  order costs against torch's native single-stage schedule.

Throughput = samples / seconds over ``--steps`` minibatches after one warm-up minibatch on every side
(process start-up excluded alike; pipelab's from its trace, torch's between two barriers). Every
process tunes malloc as pipelab's workers do. Rounds alternate the order of the contenders (forwards,
then backwards), so load drifting on a shared machine favours no side; medians over ``--rounds`` and
the median of the per-round paired ratios are printed.

    python reproductions/benchmarks/torch_bridge_speed.py [--steps 10] [--rounds 5]
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

WIDTH, BLOCKS, BATCH, MICRO = 512, 8, 64, 8
METHODS = ("1f1b-flush", "gpipe", "zb-h1")
optimizer = functools.partial(torch.optim.SGD, lr=1e-3, momentum=0.9)


def model_fn() -> nn.Sequential:
    """8 x (Linear(512, 512) + ReLU)."""
    return linear_blocks(WIDTH, BLOCKS)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The same fixed minibatch, over and over (deterministic, as pipelab requires)."""
    x, y = _batch()
    while True:
        yield x, y


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error."""
    return nn.functional.mse_loss(out, y)


def plan() -> pl.Plan:
    """Two stages of four blocks."""
    return pl.Plan.from_boundaries(2 * BLOCKS, [BLOCKS])


def _pipelab(method: str, steps: int) -> float:
    sched = pl.schedules.build(method, plan(), microbatches=MICRO, minibatches=steps + 1)
    res = pl.train(model_fn, plan(), schedule=sched, data=data, loss_fn=loss_fn, optimizer=optimizer,
                   steps=steps + 1, microbatches=MICRO, progress=False, timeout=600)

    def minibatch(e: pl.Event) -> int:
        return e.microbatch if e.kind == "U" else e.microbatch // MICRO

    evs = [e for e in res.trace.compute_events() if minibatch(e) >= 1]
    return steps * BATCH / (max(e.end_s for e in evs) - min(e.start_s for e in evs))


def _torch_worker(rank: int, port: int, method: str, native: bool, steps: int, out: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    tune_malloc()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=600))
    torch.manual_seed(0)
    model = model_fn()
    sched = pl.schedules.build(method, plan(), microbatches=MICRO, minibatches=1)
    if native:      # torch's own 1F1B on the very stage modules the bridge cuts
        mod = pl.torch_bridge.stage_modules(plan(), sched, model, rank=rank)[rank]
        pipe: Any = Schedule1F1B(PipelineStage(mod, rank, 2, torch.device("cpu")), MICRO, loss_fn=loss_fn)
        params = list(mod.parameters())
    else:
        pipe = pl.torch_bridge.to_torch(plan(), sched, model, loss_fn=loss_fn)
        params = list(pipe.parameters())
    opt = optimizer(params)
    x, y = _batch()

    def step() -> None:
        opt.zero_grad()
        pipe.step(x, target=y)
        opt.step()

    step()          # warm-up: shape inference and buffers, as pipelab's first minibatch is excluded
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    if rank == 0:
        out.put(steps * BATCH / (time.perf_counter() - t))
    dist.destroy_process_group()


def _torch(method: str, steps: int, native: bool = False) -> float:
    import torch.multiprocessing as mp

    from pipelab.runtime.job import free_port

    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=_torch_worker, args=(r, port, method, native, steps, q)) for r in range(2)]
    for p in ps:
        p.start()
    try:
        thr = q.get(timeout=600)
    finally:
        for p in ps:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
    return float(thr)


def _ratio(name: str, num: list[float], den: list[float]) -> None:
    med = statistics.median(num) / statistics.median(den)
    paired = statistics.median(a / b for a, b in zip(num, den))
    print(f"{name:<52s} {med:.2f} (ratio of medians), {paired:.2f} (median of paired rounds)")


def main() -> None:
    """Run the comparison and print the figures."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=10,
                    help="timed minibatches of 64 per run (after one warm-up)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (at least 3)")
    a = ap.parse_args()
    if a.rounds < 3:
        ap.error(f"--rounds {a.rounds}: use at least 3 rounds (fewer are noise on a shared machine)")
    if a.steps < 2:
        ap.error(f"--steps {a.steps}: time at least 2 minibatches")
    torch.set_num_threads(1)
    tune_malloc()
    _pipelab("1f1b-flush", 2)       # start the fork server once, outside the timings
    r: dict[str, list[float]] = {}
    runs = []
    for m in METHODS:
        r[f"pipelab {m}"], r[f"bridge {m}"] = [], []
        runs += [lambda m=m: r[f"pipelab {m}"].append(_pipelab(m, a.steps)),
                 lambda m=m: r[f"bridge {m}"].append(_torch(m, a.steps))]
    r["torch Schedule1F1B"] = []
    runs.append(lambda: r["torch Schedule1F1B"].append(_torch("1f1b-flush", a.steps, native=True)))
    for k in range(a.rounds):
        for run in (runs if k % 2 == 0 else runs[::-1]):
            run()
        print(f"round {k} (samples/s): " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in r.items()), flush=True)
    print("median samples/s: " + ", ".join(f"{n} {statistics.median(v):.1f}" for n, v in r.items()))
    for m in METHODS:
        _ratio(f"{m}: pipelab runtime / torch engine via the bridge:", r[f"pipelab {m}"], r[f"bridge {m}"])
    _ratio("1f1b: bridge / torch's own Schedule1F1B:", r["bridge 1f1b-flush"], r["torch Schedule1F1B"])
    print(f"(machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; one thread per process)")


if __name__ == "__main__":
    main()
