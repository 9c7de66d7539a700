"""Every synchronous pipeline schedule pipelab builds, on the same profiles (schedule_comparison).

For a transformer-like profile (uniform blocks) and the CNN VGG-16 (PipeDream's shipped profile), at
P = 4 and 8 stages and M = P, 2P, 4P microbatches, each schedule is simulated on one flat cluster:
bubble share, most microbatches' activations one stage holds, peak memory per worker and time per
minibatch. Then, where the runtime runs it, each schedule trains a tiny model on 4 gloo processes here
and its measured time per minibatch is set beside the simulator's (same plan, same schedule). Finally the
memory-budgeted search (:mod:`pipelab.schedules.search`) on the transformer's stage times, budget by budget.

Run: ``python -m reproductions.schedule_comparison.compare [--no-measure]``; writes ``results.csv``
and ``results.md`` here.
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import pipelab.methods as methods
from pipelab.cluster import Cluster
from pipelab.models import demo
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.measure import profile as measure_profile
from pipelab.profile.pipedream_format import load_pipedream
from pipelab.profile.records import Profile
from pipelab.runtime.launch import train
from pipelab.schedules import Schedule
from pipelab.schedules import search as S
from pipelab.sim.simulate import simulate

HERE = Path(__file__).resolve().parent
#: the schedules compared (method, options); those missing from the registry are listed as such
SCHEDULES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("gpipe", {}), ("1f1b-flush", {}), ("interleaved-1f1b", {"chunks": 2}), ("zb-h1", {}), ("zb-h2", {}),
    ("zb-v", {}), ("dualpipe", {}), ("dualpipev", {}))


def transformer_profile(blocks: int = 32) -> Profile:
    """Uniform transformer-like blocks (GPT-2-small-sized: hidden 768, sequence 1024, fp32): backward
    twice the forward (Narayanan et al., SC'21 §2.2), one block's output alive across every cut."""
    hidden, seq = 768, 1024
    act = hidden * seq * 4                       # one block's output, fp32, one sample
    params = 12 * hidden * hidden * 4            # attention 4h^2 + MLP 8h^2, fp32
    return Profile.synthetic([1e-3] * blocks, [2e-3] * blocks, out_bytes=[act] * blocks,
                             param_bytes=[params] * blocks, model="transformer-like (uniform blocks)")


def held(schedule: Schedule, worker: int) -> int:
    """Most (stage, microbatch) activations ``worker`` holds at once: an ``F`` adds one, the stage's last
    gradient action for that microbatch (``W`` when it splits, else ``B``) frees it."""
    acts = schedule.actions[worker]
    split = {a.stage for a in acts if a.kind == "W"}
    live = best = 0
    for a in acts:
        live += 1 if a.kind == "F" else -1 if a.kind == ("W" if a.stage in split else "B") else 0
        best = max(best, live)
    return best


def _label(method: str, options: dict[str, Any]) -> str:
    return method + "".join(f" {k}={v}" for k, v in options.items())


def simulated_rows(profiles: dict[str, Profile], stages: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per profile x P x M x schedule (or the reason it could not be built)."""
    rows = []
    for pname, prof in profiles.items():
        for P in stages:
            cluster = Cluster.flat(P)
            plan = partition(prof, cluster, straight=True)
            for M in (P, 2 * P, 4 * P):
                for method, opts in SCHEDULES:
                    row: dict[str, Any] = {"profile": pname, "P": P, "M": M, "schedule": _label(method, opts)}
                    if method not in methods.METHODS:
                        rows.append({**row, "note": "not built by pipelab on this branch"})
                        continue
                    try:
                        sim = simulate(plan, prof, cluster, method=method, microbatches=M, minibatches=1,
                                       **opts)
                    except Exception as exc:   # a schedule's refusal is a result of the comparison
                        rows.append({**row, "note": f"refused: {str(exc).splitlines()[0][:110]}"})
                        continue
                    sch = sim.schedule
                    rows.append({**row, "bubble": statistics.fmean(sim.bubble_fraction),
                                 "activations_held": max(held(sch, w) for w in range(sch.num_workers)),
                                 "peak_memory_MiB": max(sim.peak_memory) / 2**20,
                                 "time_per_minibatch_ms": sim.time_per_minibatch * 1e3, "note": ""})
    return rows


def _tiny_data(n: int, width: int, batch: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g)
    return demo.batches((x, x.roll(1, dims=1)), batch)


def measured_rows(workers: int = 4, M: int = 8, steps: int = 12, width: int = 256) -> list[dict[str, Any]]:
    """Each schedule trains linear blocks on ``workers`` gloo processes; time per minibatch measured
    (steady window) beside the simulator's on the profile measured here."""
    blocks, batch = 16, 64
    model_fn = functools.partial(demo.linear_blocks, width, blocks)
    data = functools.partial(_tiny_data, batch * steps, width, batch)
    x, y = data()[0]
    prof = measure_profile(model_fn(), x, loss_fn=torch.nn.functional.mse_loss, target=y, progress=False,
                           small_batch=batch // M)
    cluster = Cluster.flat(workers)
    rows = []
    for method, opts in SCHEDULES:
        row: dict[str, Any] = {"schedule": _label(method, opts), "P": workers, "M": M}
        if method not in methods.METHODS:
            rows.append({**row, "note": "not built by pipelab on this branch"})
            continue
        try:
            plan = Plan.even(len(prof.layers), workers)
            sim = simulate(plan, prof, cluster, method=method, microbatches=M, minibatches=steps, **opts)
            t0 = time.perf_counter()
            run = train(model_fn, plan, method=method, data=data, loss_fn=torch.nn.functional.mse_loss,
                        optimizer=functools.partial(torch.optim.SGD, lr=0.01), steps=steps, microbatches=M,
                        backend="gloo", progress=False, timeout=240, **opts)
            wall = time.perf_counter() - t0
            measured = batch / run.trace.steady_throughput(batch)
            rows.append({**row, "simulated_ms": sim.time_per_minibatch * 1e3, "measured_ms": measured * 1e3,
                         "wall_s": wall, "note": ""})
        except Exception as exc:     # what the runtime cannot run is reported, not hidden
            rows.append({**row, "note": f"not run: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"})
        print(rows[-1], flush=True)
    return rows


def search_rows(P: int = 8, M: int = 24) -> list[dict[str, Any]]:
    """The search on equal F, B, W (the transformer's blocks with B split in halves) budget by budget,
    counting activations as pipelab's runtime frees them (at ``W``) and as the Zero Bubble paper's
    scheduler does (half at ``B``)."""
    times = S.StageTimes.uniform(P, forward=1.0, backward_input=1.0, backward_weight=1.0, send_s=0.0)
    return _search_rows(times, M, range(1, 2 * P + 1))


def _search_rows(times: S.StageTimes, M: int, budgets: range) -> list[dict[str, Any]]:
    """One row per budget: the search's cost, bubble and peak under both activation counts."""
    rows = []
    for budget in budgets:
        r = S.search_order(times, M, budget)
        half = S.search_order(times, M, budget, input_grad_frees=0.5)
        rows.append({"P": times.stages, "M": M, "budget": budget, "cost": r.cost,
                     "bubble_rate": r.bubble_rate, "held": max(r.peak_activations),
                     "cost_half_at_B": half.cost, "bubble_rate_half_at_B": half.bubble_rate})
    return rows


SEARCH_COLUMNS = ["P", "M", "budget", "cost", "bubble_rate", "held", "cost_half_at_B",
                  "bubble_rate_half_at_B"]

#: Zero Bubble (Qi et al., ICLR 2024) Table 6, the 1.5B model at m = 24: T_F, T_B, T_W, T_comm in ms
ZB_1_5B = {"forward": 18.5, "backward_input": 18.1, "backward_weight": 9.3, "send_s": 0.6}


def zero_bubble_search_rows(P: int = 8, M: int = 24) -> list[dict[str, Any]]:
    """The search on Zero Bubble Table 6's 1.5B times from ZB-1p's budget (P) to ZB-2p's (2P), both counts."""
    return _search_rows(S.StageTimes.uniform(P, **ZB_1_5B), M, range(P, 2 * P + 1))


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _md(rows: list[dict[str, Any]], cols: list[str]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-measure", action="store_true", help="simulate only (no gloo runs)")
    args = ap.parse_args(argv)
    profiles = {"transformer": transformer_profile(), "vgg16": load_pipedream("vgg16")}
    sim = simulated_rows(profiles, (4, 8))
    cols = ["profile", "P", "M", "schedule", "bubble", "activations_held", "peak_memory_MiB",
            "time_per_minibatch_ms", "note"]
    with open(HERE / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(sim)
    parts = ["## Simulated (flat cluster, one minibatch)\n", _md(sim, cols)]
    if not args.no_measure:
        meas = measured_rows()
        mcols = ["schedule", "P", "M", "simulated_ms", "measured_ms", "wall_s", "note"]
        parts += ["\n\n## Measured on this machine (4 gloo processes, 16 linear blocks of width 256)\n",
                  _md(meas, mcols)]
    parts += ["\n\n## Search under a budget (P=8, M=24, F=B=W=1)\n",
              _md(search_rows(), SEARCH_COLUMNS),
              "\n\n## Search on Zero Bubble Table 6's 1.5B times (P=8, M=24, ms)\n",
              _md(zero_bubble_search_rows(), SEARCH_COLUMNS)]
    (HERE / "results.md").write_text("".join(parts) + "\n")
    print("".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
