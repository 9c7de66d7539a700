"""Per-message cost: pipelab's runtime against torch.distributed.pipelining on one two-stage plan.

Setup (one invocation, CPU, gloo, 2 processes of one thread each, pinned as pipelab pins them):
three models, each cut into the same two stages for both engines, trained with ``gpipe`` and
``1f1b-flush`` (torch: ``ScheduleGPipe``, ``Schedule1F1B`` on the stage modules pipelab's bridge cuts,
:func:`pipelab.torch_bridge.stage_modules`):

* small MLP: 4 x (Linear(32, 32) + ReLU), batch 16, M = 4 (actions of ~0.1 ms: the per-message cost shows);
* CNN: ``notebooks/01_quickstart``'s ``demo.small_cnn`` on 8x8 images, batch 64, M = 4;
* large MLP: 8 x (Linear(512, 512) + ReLU), batch 64, M = 8 (actions of milliseconds).

Contenders: pipelab over gloo's point-to-point path (``shared_memory=False``), pipelab through
shared-memory rings (:mod:`pipelab.runtime.shm`, its default on one host), torch's engine. Each round
runs every contender once, in an order that alternates between rounds. Throughput = samples / second
between minibatch completions after a warm-up (pipelab: its trace's ``U`` ends on worker 0, first fifth
left out; torch: between two barriers after 3 warm-up steps). The physical limit is 2 x the
single-process rate at the same microbatch size (one process, M microbatches accumulated, one step) x M
/ (M + P - 1), measured in the same round. The *fixed cost* per action (and per message) is the gap
between a contender's time per minibatch and the limit's, divided by the actions (messages) of the
busier worker per minibatch.

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


def _join(rank: int, port: int) -> Any:
    """This benchmark process set up as pipelab sets up its workers (one thread, its malloc settings,
    pinned to a core of its own), then joined to a two-process gloo group; returns torch.distributed."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    tune_malloc()
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=600))
    return dist


def _timed(dist: Any, step: Callable[[], None], steps: int) -> float:
    """Seconds of ``steps`` calls of ``step`` after 3 warm-up calls, from a barrier to a barrier."""
    for _ in range(3):
        step()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return time.perf_counter() - t


def _torch_worker(rank: int, port: int, name: str, method: str, steps: int, out: Any) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    dist = _join(rank, port)
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

    seconds = _timed(dist, step, steps)
    if rank == 0:
        out.put(steps * batch / seconds)
    dist.destroy_process_group()


def _pair_worker(rank: int, port: int, name: str, steps: int, out: Any) -> None:
    """One stage's F + B on M microbatches and its optimizer step, with no messages, beside the other."""
    dist = _join(rank, port)
    model_fn, _, _, _, m, batch_fn, loss_fn = MODELS[name]
    torch.manual_seed(0)
    sched = pl.schedules.build("gpipe", _plan(name), microbatches=m, minibatches=1)
    full = model_fn()
    stages = [pl.torch_bridge.stage_modules(_plan(name), sched, full, rank=r)[r] for r in range(2)]
    x, y = batch_fn()
    xs, ys = x.chunk(m), y.chunk(m)
    if rank == 1:     # stage 1's inputs: stage 0's outputs, computed once
        with torch.no_grad():
            xs = tuple(h[0] if isinstance(h, tuple) else h for h in (stages[0](a) for a in xs))
    mod = stages[rank]
    opt = optimizer(list(mod.parameters()))

    def step() -> None:
        opt.zero_grad()
        for a, b in zip(xs, ys):
            h = mod(a.detach().requires_grad_() if rank == 1 else a)
            h = h[0] if isinstance(h, tuple) else h
            (loss_fn(h, b) / m if rank == 1 else h.sum()).backward()
        opt.step()

    out.put(_timed(dist, step, steps))
    dist.destroy_process_group()


def _pair(name: str, steps: int) -> float:
    """The two stages' compute run side by side with no messages: samples/s of the slower one."""
    batch = MODELS[name][3]
    return steps * batch / max(run_pair(_pair_worker, name, steps, reports=2, timeout=600))


def _pingpong_worker(rank: int, port: int, nbytes: int, trips: int, out: Any) -> None:
    dist = _join(rank, port)
    buf = torch.zeros(max(1, nbytes // 4))
    peer = 1 - rank
    for k in range(trips + 20):        # 20 warm-up trips
        if k == 20:
            t = time.perf_counter()
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
    if rank == 0:
        out.put((time.perf_counter() - t) / trips / 2)
    dist.destroy_process_group()


def _pingpong(name: str) -> float:
    """One-way latency (s) of gloo between two idle pinned processes, for one activation's bytes."""
    model_fn, _, _, _, m, batch_fn, _ = MODELS[name]
    sched = pl.schedules.build("gpipe", _plan(name), microbatches=m, minibatches=1)
    stage0 = pl.torch_bridge.stage_modules(_plan(name), sched, model_fn(), rank=0)[0]
    with torch.no_grad():
        h = stage0(batch_fn()[0].chunk(m)[0])
    nbytes = sum(t.numel() * t.element_size() for t in (h if isinstance(h, tuple) else (h,)))
    return float(run_pair(_pingpong_worker, nbytes, 400, reports=1, timeout=600)[0])


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
    r: dict[str, list[float]] = {"single": [], "pair": [], "ping-pong us": []}
    runs: list[tuple[str, Callable[[], float]]] = [("single", functools.partial(_single, name, steps)),
                                                   ("pair", functools.partial(_pair, name, steps)),
                                                   ("ping-pong us", lambda: 1e6 * _pingpong(name))]
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
    pair = [x * m / (m + p - 1) for x in r["pair"]]
    print(f"  single process {_fmt(r['single'])};  two-process physical limit (1F1B/GPipe) {_fmt(limit)}")
    print(f"  the two stages side by side without messages {_fmt(r['pair'])}; x M/(M+P-1) {_fmt(pair)} "
          f"({statistics.median(p_ / lim for p_, lim in zip(pair, limit)):.0%} of the limit)")
    # per worker per minibatch: M F + M B + 1 U actions; M messages sent and M received
    actions, messages = 2 * m + 1, 2 * m
    for meth in METHODS:
        for who in ("gloo", "shm", "torch"):
            v = r[f"{who} {meth}"]
            gap = [batch / x - batch / lim for x, lim in zip(v, limit)]
            per_a = statistics.median(gap) / actions * 1e6
            per_m = statistics.median(gap) / messages * 1e6
            share = statistics.median(x / lim for x, lim in zip(v, limit))
            share2 = statistics.median(x / c for x, c in zip(v, pair))
            print(f"  {meth:10s} {who:5s} {_fmt(v)}  {share:5.0%} of the limit, {share2:5.0%} of the "
                  f"side-by-side one;  fixed cost {per_a:6.0f} us per action, {per_m:6.0f} us per message")
        for who in ("gloo", "shm"):
            ratio = [x / t for x, t in zip(r[f"{who} {meth}"], r[f"torch {meth}"])]
            verdict = "ahead of" if statistics.median(ratio) >= 1 else "BEHIND"
            print(f"  {meth:10s} pipelab {who} / torch, paired: median {statistics.median(ratio):.2f} "
                  f"[{min(ratio):.2f}-{max(ratio):.2f}] ({verdict} torch; target >= 1.2)")
    for who in ("gloo", "shm", "torch"):
        ratio = [x / g for x, g in zip(r[f"{who} 1f1b-flush"], r[f"{who} gpipe"])]
        print(f"  {who}: 1F1B / GPipe, paired: median {statistics.median(ratio):.2f} "
              f"[{min(ratio):.2f}-{max(ratio):.2f}]")
    _latency_split(r, batch, m, limit)


def _latency_split(r: dict[str, list[float]], batch: int, m: int, limit: list[float]) -> None:
    """Split each engine's gap to the limit with the two-stage closed forms (tests/test_sim.py):
    GPipe (M+1)(F+B) + 2L, 1F1B-flush (M+1)(F+B) + 2*ceil(M/2)*L. Their difference gives the
    latency L the schedules' gap implies; the rest, (M+1)(F+B) against the limit's, is the cost each
    of the 2M compute actions carries beyond the single process's."""
    pp = r["ping-pong us"]
    print(f"  gloo one-way latency, idle pinned ping-pong of one activation: {_fmt(pp)} us")
    extra = 2 * -(-m // 2) - 2
    if extra <= 0:
        print("  (M <= 2: the closed forms coincide; no latency can be read from the gap)")
        return
    for who in ("gloo", "shm", "torch"):
        tg = [batch / x for x in r[f"{who} gpipe"]]
        tf = [batch / x for x in r[f"{who} 1f1b-flush"]]
        lat = [(f - g) / extra for f, g in zip(tf, tg)]
        over = [(g - 2 * la - batch / lim) / (2 * m) for g, la, lim in zip(tg, lat, limit)]
        allowed = [g / (g + extra * p * 1e-6) for g, p in zip(tg, pp)]
        print(f"  {who:5s}: latency implied by 1F1B - GPipe {_us(lat)}; cost per compute action beyond "
              f"the single process's {_us(over)}; 1F1B / GPipe at the ping-pong latency "
              f"{statistics.median(allowed):.2f}")


def _us(v: list[float]) -> str:
    return f"{statistics.median(v) * 1e6:.0f} us [{min(v) * 1e6:.0f}-{max(v) * 1e6:.0f}]"


if __name__ == "__main__":
    main()
