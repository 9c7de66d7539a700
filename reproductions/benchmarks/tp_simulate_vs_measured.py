"""Measured tensor-parallel gloo runs against ``pl.simulate``'s prediction of the same plan.

The GPT of ``_tp_gpt.py`` (``pipelab.models.SplittableGPT``: 2 blocks, width 256, 8 heads, vocabulary
512, 64 tokens, 16 sequences per minibatch in 2 microbatches) trains with GPipe as 1x1 (one process,
the baseline), 2x1 (one stage, tensor degree 2: 2 processes) and 2x2 (two stages of degree 2: 4
processes). ``pl.simulate`` prices the same plans from one ``pl.profile`` of the model (its
``tensor_splits``: the runtime's split rule) on this machine calibrated with as many processes as the
run has (``pl.calibrate(workers=2)`` for 1x1 and 2x1, ``workers=4`` for 2x2). Per plan and stage it
prints the measured median ``F``/``B`` and time per step, the prediction, and measured/predicted as
the median and range over rounds, and that ratio divided by the same round's 1x1 ratio (what the
tensor split adds to the error, the machine's drift between profile, calibration and run left out).
``2x2 shared`` is the same prediction with each device's speed times cores / processes: what four
single-threaded processes on fewer cores leave each one, a mechanism the cost model does not have
(it gives every worker a device of its own).

It also splits the 2x1 gap in two: the degree-2 shard's forward and backward timed alone on one
process with the collectives made local (same shapes, no communication) against the prediction's
compute part, and the rest of a measured action against the prediction's collectives. Run:

    python reproductions/benchmarks/tp_simulate_vs_measured.py [--rounds 3] [--steps 6]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tp_gpt as G  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _pair import run_pair, spin  # noqa: E402  (this folder's helper: two processes, reaped)

import pipelab as pl  # noqa: E402
from pipelab.runtime.affinity import pin_worker  # noqa: E402
from pipelab.runtime.tensor_parallel import Group, plan_of, shard  # noqa: E402

M = 2          # microbatches
CUT = 24       # after block 0's residual add (46 layers)
PLANS = {"1x1": ([], 1), "2x1": ([], 2), "2x2": ([CUT], 2)}


def plan_of_shape(name: str, layers: int) -> pl.Plan:
    """The plan ``name`` (tensor x pipeline)."""
    bounds, t = PLANS[name]
    plan = pl.Plan.from_boundaries(layers, bounds)
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, tensor=t) for s in plan.stages))


def measured(plan: pl.Plan, steps: int) -> dict[str, float]:
    """Median F and B per stage (``"F0"``...) and seconds per step of one real run (minibatch 0 left out)."""
    res = pl.train(G.gpt, plan, method="gpipe", data=G.data, loss_fn=G.loss_fn, optimizer=G.sgd,
                   steps=steps, microbatches=M, progress=False, timeout=600)
    out: dict[str, float] = {}
    for s in range(plan.num_stages):
        for kind in ("F", "B"):
            ds = [e.duration_s for e in res.trace.events
                  if e.kind == kind and e.stage == s and e.microbatch >= M]
            out[f"{kind}{s}"] = statistics.median(ds)
    ends = sorted(e.end_s for e in res.trace.events if e.kind == "U" and e.worker == 0)
    out["step"] = statistics.median(b - a for a, b in zip(ends, ends[1:]))
    return out


def predicted(plan: pl.Plan, profile: pl.Profile, cluster: pl.Cluster
              ) -> tuple[dict[str, float], dict[str, float]]:
    """``pl.simulate``'s F and B per stage and time per step, and the collectives' share of each action."""
    sim = pl.simulate(plan, profile, cluster, "gpipe", microbatches=M)
    out, comm = {}, {}
    for s in range(plan.num_stages):
        for kind in ("F", "B"):
            out[f"{kind}{s}"] = max(e.duration_s for e in sim.trace.events if e.kind == kind and e.stage == s)
            ts = [e.duration_s for e in sim.trace.events if e.kind == "tensor" and e.stage == s
                  and abs(e.end_s - next(a.end_s for a in sim.trace.events if a.kind == kind and a.stage == s
                                         and a.microbatch == e.microbatch)) < 1e-15]
            comm[f"{kind}{s}"] = max(ts, default=0.0)
    out["step"] = sim.time_per_minibatch
    return out, comm


class _Alone(Group):
    """A member of a group of ``degree`` whose collectives are local: same shapes, no communication."""

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x] * self.degree, dim=-1)


def shard_compute(degree: int, reps: int = 15) -> tuple[float, float]:
    """Median seconds of one microbatch's forward and backward of one member's shard (degree 1: whole)."""
    model = G.gpt()
    if degree > 1:
        shard(model, plan_of(model), _Alone(0, degree, None))
    x, y = next(G.data())
    x, y = x[: G.BATCH // M], y[: G.BATCH // M]
    fs, bs = [], []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        loss = G.loss_fn(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        fs.append(t1 - t0)
        bs.append(t2 - t1)
    return statistics.median(fs[2:]), statistics.median(bs[2:])


def _collectives(rank: int, port: int, compute_s: float, steps: int, queue: object) -> None:
    """One ``F``'s collectives of the 2x1 group in the runtime's order, between two pinned gloo processes,
    ``compute_s`` of compute before each: the embedding's and every row-parallel layer's all-reduce of
    one microbatch's activation, then the head's all-gather of its logits; seconds per ``F``."""
    pin_worker(rank, 2)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    act = torch.zeros(G.BATCH // M, G.SEQ, G.EMBD)
    half = torch.zeros(G.BATCH // M, G.SEQ, G.VOCAB // 2)
    times = []
    for _ in range(steps + 3):
        total = 0.0
        for _ in range(2 * G.LAYERS + 1):
            spin(compute_s)
            t0 = time.perf_counter()
            dist.all_reduce(act)
            total += time.perf_counter() - t0
        spin(compute_s)
        t0 = time.perf_counter()
        dist.all_gather([torch.empty_like(half) for _ in range(2)], half)
        times.append(total + time.perf_counter() - t0)
    queue.put((rank, times[3:]))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def collectives_alone(compute_s: float, steps: int = 15) -> float:
    """Median over steps of the slower rank's seconds in one ``F``'s collectives (:func:`_collectives`)."""
    got = dict(run_pair(_collectives, compute_s, steps))
    return statistics.median(max(a, b) for a, b in zip(got[0], got[1]))


def spread(xs: list[float]) -> str:
    """``median (min-max)``."""
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    """Calibrate, profile, measure every plan per round, predict, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    before = os.getloadavg()
    two, four = pl.calibrate(workers=2, progress=False), pl.calibrate(workers=4, progress=False)
    cores = len(os.sched_getaffinity(0))
    share = min(1.0, cores / 4)
    shared = dataclasses.replace(four, devices=tuple(dataclasses.replace(d, speed=d.speed * share)
                                                     for d in four.devices))
    profile = pl.profile(G.gpt(), next(G.data())[0], progress=False)
    n = len(profile)
    plans = {name: plan_of_shape(name, n) for name in PLANS}
    clusters = {"1x1": two, "2x1": two, "2x2": four}
    pred = {name: predicted(p, profile, clusters[name]) for name, p in plans.items()}
    pred["2x2 shared"] = predicted(plans["2x2"], profile, shared)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in plans}
    alone: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    lockstep: dict[float, list[float]] = {0.0: [], 0.002: []}
    for r in range(a.rounds):
        for name, p in plans.items():
            runs[name].append(measured(p, a.steps))
        for t in (1, 2):
            alone[t].append(shard_compute(t))
        for c in (0.0, 0.002):
            lockstep[c].append(collectives_alone(c))
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    for c in (two, four):
        assert c.calibration is not None
        print(f"\n{c.name}: {c.calibration.describe()}")
    print(f"\nload average (1, 5, 15 min) before the runs {before}, after {os.getloadavg()}")
    print(f"\n{'plan':>10} {'what':>5} {'measured ms':>22} {'predicted ms':>13} {'of it tensor ms':>16} "
          f"{'measured/predicted':>24} {'÷ same round 1x1':>22}")
    for name in pred:
        p, comm = pred[name]
        measured_as = runs[name.split()[0]]
        for key in p:
            ms = [run[key] * 1e3 for run in measured_as]
            ratio = [run[key] / p[key] for run in measured_as]
            base = key if key == "step" else key[0] + "0"
            norm = [x / (b[base] / pred["1x1"][0][base]) for x, b in zip(ratio, runs["1x1"])]
            print(f"{name:>10} {key:>5} {spread(ms):>22} {p[key] * 1e3:>13.2f} "
                  f"{comm.get(key, 0.0) * 1e3:>16.2f} {spread(ratio):>24} {spread(norm):>22}")
    # the 2x1 gap in two: compute of one shard alone, and the rest (collectives, runtime's own work)
    p, comm = pred["2x1"]
    print("\n2x1, one member's work apart (ms; measured median (range) over rounds):")
    for i, kind in enumerate(("F", "B")):
        key = f"{kind}0"
        whole_alone = [x[i] * 1e3 for x in alone[1]]
        half_alone = [x[i] * 1e3 for x in alone[2]]
        speedup = [w / h for w, h in zip(whole_alone, half_alone)]
        rest = [run[key] * 1e3 - h for run, h in zip(runs["2x1"], half_alone)]
        pc, pt = (p[key] - comm[key]) * 1e3, comm[key] * 1e3
        print(f"  {kind}: shard alone {spread(half_alone)} (whole model alone {spread(whole_alone)}: "
              f"speed-up {spread(speedup)}, predicted 2 on the split layers); predicted compute {pc:.2f} "
              f"-> shard/predicted {spread([h / pc for h in half_alone])}")
        print(f"     rest of the measured action (collectives + runtime) {spread(rest)} against predicted "
              f"collectives {pt:.2f} -> {spread([x / pt for x in rest]) if pt > 0 else 'n/a'}")
    print("  one F's collectives alone between 2 pinned gloo processes: "
          + "; ".join(f"after {c * 1e3:.0f} ms of compute each {spread([x * 1e3 for x in xs])} ms"
                      for c, xs in lockstep.items())
          + f" (predicted {comm['F0'] * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
