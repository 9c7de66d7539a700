"""Lv et al.'s claims, as pipelab can test them: about 2x the throughput and 30-40% less memory.

Lv et al. (CCGrid'23) train with a bounded weight buffer, compressed activations and gradients
between stages and a prefix-sum partitioner, against "popular pipeline frameworks". The comparison
defined here, on the same cluster and the same minibatch (samples per optimizer step):

* ``lv``: ``buffered`` with K = 2 versions, ``compression="fp16"``, the prefix-sum partitioner,
  ``M = P`` microbatches;
* ``pipedream``: weight stashing, PipeDream's partitioner (straight, ``P`` stages), ``M = 1``;
* ``gpipe``: fill-drain with ``M = P`` microbatches, GPipe's partitioner.

Two parts:

1. **Real, on this CPU** (gloo, ``P = 2`` processes): peak memory per worker (``measure_memory=True``:
   the storage count of every tensor a worker holds) and throughput (samples/s), paired and interleaved
   over ``--rounds`` rounds (median and range), for a weight-heavy MLP and an activation-heavy CNN.
2. **Simulated at a stated GPU cluster** (``pipedream-a:1x4``, four V100s in one server, PipeDream's
   own profiles of VGG-16 and GNMT-8 as in the Table 1 reproduction): throughput and peak memory per
   worker from ``pl.simulate`` at ``P = 2`` and ``4``.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python reproductions/weight_buffer/lv_claims.py [--rounds 3]``;
writes ``lv_real.csv``, ``lv_simulated.csv`` and prints both tables with the ratios the claims are about.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import pipelab as pl  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))   # the checkout's root, for reproductions._common

from reproductions._common.report import write_rows  # noqa: E402

CONFIGS = ("lv", "pipedream", "gpipe")


def mlp() -> nn.Module:
    """Weight-heavy: 8 Linear(512, 512) + ReLU on 512 features, 10 classes."""
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def cnn() -> nn.Module:
    """Activation-heavy: five 3x3 convolutions of 32 channels on 32x32 images, no pooling until the head."""
    layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, padding=1), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


MODELS = {"mlp": (mlp, (512,)), "cnn": (cnn, (3, 32, 32))}
BATCH = 32


def data(shape: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random inputs and labels: 40 minibatches (throughput and memory do not depend on the values)."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, *shape, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(40)]


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)


def plan_for(config: str, prof: pl.Profile, cl: pl.Cluster,
             P: int) -> tuple[pl.Plan, str, dict[str, Any], int]:
    """``(plan, method, options, microbatches)`` of a configuration on ``P`` stages of ``cl``."""
    if config == "lv":
        return (pl.partition(prof, cl, method="prefix-sum", stages=P, compression="fp16"), "buffered",
                {"versions": 2, "compression": "fp16"}, P)
    if config == "pipedream":
        return pl.partition(prof, cl, method="pipedream", straight=True,
                             workers=list(range(P))), "pipedream", {}, 1
    return pl.partition(prof, cl, method="gpipe", stages=P, microbatches=P), "gpipe", {}, P


def real(rounds: int, steps: int = 24) -> list[dict[str, Any]]:
    """Peak memory and throughput per configuration and model, on gloo, rounds interleaved."""
    P = 2
    cl = pl.Cluster.flat(P)
    rows = []
    for name, (fn, shape) in MODELS.items():
        torch.manual_seed(0)
        batches = data(shape)
        prof = pl.profile(fn(), batches[0][0], progress=False)
        plans = {c: plan_for(c, prof, cl, P) for c in CONFIGS}
        got: dict[str, list[Any]] = {c: [] for c in CONFIGS}
        for _ in range(rounds):
            for c in CONFIGS:
                plan, method, opts, M = plans[c]
                r = pl.train(fn, plan, method=method, data=functools.partial(list, batches), loss_fn=_loss,
                             optimizer=functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9), steps=steps,
                             microbatches=M, backend="gloo", progress=False, measure_memory=True, timeout=300,
                             **opts)
                got[c].append(r)
        for c in CONFIGS:
            tps = [r.throughput for r in got[c]]
            peaks = [max(r.peak_memory.values()) for r in got[c]]
            rows.append({"model": name, "config": c, "stages": P, "plan": plans[c][0].config,
                         "throughput_median": round(statistics.median(tps), 1),
                         "throughput_min": round(min(tps), 1),
                         "throughput_max": round(max(tps), 1), "peak_memory_max_worker_mib": round(
                             statistics.median(peaks) / 2**20, 2),
                         "peak_memory_sum_mib": round(statistics.median(sum(r.peak_memory.values())
                                                                         for r in got[c]) / 2**20, 2),
                         "versions_held": " ".join(str(got[c][0].versions_held[s])
                                                   for s in sorted(got[c][0].versions_held)),
                         "rounds": rounds})
    return rows


def simulated() -> list[dict[str, Any]]:
    """Throughput and peak memory per configuration from ``pl.simulate`` on four V100s in one server."""
    from pipelab.models import pipedream_profile

    cl = pl.Cluster.parse("pipedream-a:1x4")
    rows = []
    for model in ("vgg16", "gnmt8"):
        prof = pipedream_profile(model)
        for P in (2, 4):
            for c in CONFIGS:
                plan, method, opts, M = plan_for(c, prof, cl, P)
                sim_opts = {"compression": opts["compression"]} if "compression" in opts else {}
                if "versions" in opts:
                    sim_opts["versions"] = opts["versions"]
                r = pl.simulate(plan, prof, cl, method, microbatches=M, **sim_opts)
                rows.append({"model": model, "config": c, "stages": P, "plan": plan.config,
                             "batch": prof.batch_size, "throughput": round(r.throughput, 1),
                             "peak_memory_max_worker_gib": round(max(r.peak_memory) / 2**30, 3),
                             "peak_memory_sum_gib": round(sum(r.peak_memory) / 2**30, 3)})
    return rows


def ratios(rows: list[dict[str, Any]], tp: str, mem: str) -> list[str]:
    """The claims' ratios: lv's throughput over each other's, and lv's peak memory over each other's."""
    out = []
    total = mem.replace("max_worker", "sum")
    for model, P in sorted({(r["model"], r["stages"]) for r in rows}):
        by = {r["config"]: r for r in rows if r["model"] == model and r["stages"] == P}
        for other in ("pipedream", "gpipe"):
            a, b = by["lv"], by[other]
            out.append(f"{model} P={P}: lv / {other}: throughput x{a[tp] / b[tp]:.2f}; peak memory "
                       f"x{a[mem] / b[mem]:.2f} (most loaded worker), x{a[total] / b[total]:.2f} "
                       "(all workers)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sim = simulated()
    write_rows(a.out / "lv_simulated.csv", sim)
    for line in ratios(sim, "throughput", "peak_memory_max_worker_gib"):
        print("simulated", line)
    rr = real(a.rounds)
    write_rows(a.out / "lv_real.csv", rr)
    for line in ratios(rr, "throughput_median", "peak_memory_max_worker_mib"):
        print("real CPU", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
