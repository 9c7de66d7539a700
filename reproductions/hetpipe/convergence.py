"""HetPipe's convergence claim as time to accuracy = simulated throughput x measured statistical efficiency.

HetPipe (Park et al., "HetPipe: Enabling Large DNN Training on (Whimpy) Heterogeneous GPU Clusters
through Integration of Pipelined Model Parallelism and Data Parallelism", USENIX ATC'20,
arXiv:2005.14038) reports models converging up to 49% faster (VGG-19) and 39% faster (ResNet-152)
than Horovod's data parallelism on its 4-node cluster of TITAN V, TITAN RTX, RTX 2060 and Quadro
P4000 GPUs. Here that is the product of two measured factors:

* **hardware** (:func:`hardware`): samples/s of HetPipe (each VW policy, staleness bound ``D``) over
  data parallelism on ``pl.Cluster.preset("hetpipe")``, simulated with torchvision's VGG-19 and
  ResNet-152 at HetPipe's minibatch of 32 (:mod:`.profiles`: profiled on this CPU, priced on the GPU's
  clock). Data parallelism uses the GPUs a replica fits on (:func:`.virtual_workers.dp_cluster`).
* **statistical** (:func:`run`): epochs to a target test accuracy, data parallelism over
  ``n`` replicas (one minibatch of ``n x b`` per step, gradients averaged, as Horovod) against WSP
  with ``V`` virtual workers of ``P`` stages (each VW takes minibatches of ``b``; the parameter server
  adds the VWs' wave updates; ``D`` the staleness bound), real training with pipelab's runtime on the
  convergence grid's ``shapes`` task (``../convergence/tasks.py``), several seeds. The ratio is
  ``epochs DP needs / epochs WSP needs``, per seed, each at its own best step size.

Time to accuracy over DP = hardware x statistical, labelled as that product.

Usage::

    nice -n 19 .venv/bin/python reproductions/hetpipe/convergence.py            # runs + report
    .venv/bin/python reproductions/hetpipe/convergence.py --report              # report from the CSVs

Writes ``convergence_runs.csv`` (one row per run: accuracy after every epoch), ``convergence.csv``
(the products) and prints the table. Rows already in ``convergence_runs.csv`` are skipped.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parent / "convergence"))

import grid  # noqa: E402
import tasks  # noqa: E402
import torch  # noqa: E402

from pipelab.graph import layer_nodes, trace  # noqa: E402
from pipelab.partition.plan import Plan  # noqa: E402
from pipelab.runtime import train  # noqa: E402
from reproductions._common.report import write_rows  # noqa: E402

TASK = "shapes"
B = 8                 # samples per device minibatch (HetPipe: 32 per GPU; scaled to the task)
V, P = 4, 4           # HetPipe ED on its cluster: 4 virtual workers of 4 GPUs
EPOCHS = 12
MOMENTUM = 0.0       # plain SGD, as the emulated HetPipe runs (with momentum 0.9 WSP oscillates here)
SAMPLES_PER_EPOCH = tasks.STEPS_PER_EPOCH[TASK] * tasks.BATCH
#: step sizes swept (every seed); WSP at D > 0 runs at D = 0's best only (it costs a run per evaluation)
LRS = {"dp": [0.05, 0.1, 0.2], "wsp": [0.01, 0.02, 0.04]}
SEEDS = [0, 1, 2]
#: data-parallel replicas: all 16 GPUs where a replica fits (VGG-19), 8 where it does not (ResNet-152)
DP_REPLICAS = {"vgg19": 16, "resnet152": 8}
STALENESS = [0, 1]
STRIDE = 4            # WSP at D > 0 is evaluated every STRIDE epochs (one fresh run each)
TARGET = 0.5          # test accuracy to reach (chance 0.25); the report also gives TARGETS' others
TARGETS = (0.5, 0.6)
FIELDS = ["config", "lr", "seed", "epochs", "accuracy_per_epoch", "seconds", "commit"]
RUNS = HERE / "convergence_runs.csv"
HARDWARE = HERE / "convergence_hardware.csv"
OUT = HERE / "convergence.csv"
#: HetPipe's claims (ATC'20; abstract: "up to 49% faster"; per model as issue 35 states them)
PAPER = {"vgg19": 1.49, "resnet152": 1.39}


def _batches(epochs: int, seed: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x = torch.cat([b[0] for e in range(epochs) for b in tasks.shapes_epoch(e, seed)])
    y = torch.cat([b[1] for e in range(epochs) for b in tasks.shapes_epoch(e, seed)])
    return [(x[i:i + size], y[i:i + size]) for i in range(0, len(y), size)]


@functools.lru_cache(maxsize=8)
def _data(epochs: int, seed: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return _batches(epochs, seed, size)


def run(config: str, lr: float, seed: int, epochs: int = EPOCHS) -> dict[str, Any]:
    """One run (``config``: ``dp<n>`` or ``wsp-D<d>``): test accuracy after every epoch."""
    model_fn = functools.partial(grid._model, TASK)
    L = len(layer_nodes(trace(model_fn())))
    if config.startswith("dp"):
        n = int(config[2:])
        plan, size, opts = Plan.from_boundaries(L, [], replicas=[n], method="dp"), n * B, {"microbatches": n}
        method = "dp"
    else:
        d = int(config.split("-D")[1])
        cuts = [round(i * L / P) for i in range(1, P)]
        plan = Plan.from_boundaries(L, cuts, replicas=[V] * P, method="hetpipe")
        size, opts, method = B, {"D": d}, "hetpipe"
    per_epoch = SAMPLES_PER_EPOCH // size
    data = functools.partial(_data, epochs, seed, size)
    accs: list[float] = []
    t0 = time.perf_counter()
    opt = functools.partial(torch.optim.SGD, lr=lr, momentum=MOMENTUM)

    def accuracy(r: Any) -> float:
        net = model_fn()
        net.load_state_dict(r.state_dict())
        ok = all(torch.isfinite(p).all() for p in net.parameters())
        return round(tasks.accuracy(TASK, net), 4) if ok else 0.0

    if opts.get("D", 0) > 0:
        # the runtime checkpoints WSP only at D = 0 (no consistent server state otherwise): one fresh
        # run per evaluated length, every STRIDE epochs (the epochs between are NaN)
        for e in range(1, epochs + 1):
            if e % STRIDE:
                accs.append(math.nan)
                continue
            r = train(model_fn, plan, method=method, data=data, loss_fn=grid._loss, optimizer=opt,
                      steps=per_epoch * e, backend="local", seed=seed, progress=False, **opts)
            accs.append(accuracy(r))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for e in range(epochs):
                resume = {"resume": tmp} if e else {}
                r = train(model_fn, plan, method=method, data=data, loss_fn=grid._loss, optimizer=opt,
                          steps=per_epoch * (e + 1), backend="local", seed=seed, progress=False,
                          checkpoint_every=per_epoch, checkpoint_dir=tmp, **resume, **opts)
                accs.append(accuracy(r))
    return {"config": config, "lr": lr, "seed": seed, "epochs": epochs,
            "accuracy_per_epoch": " ".join("nan" if math.isnan(a) else f"{a:.4f}" for a in accs),
            "seconds": round(time.perf_counter() - t0, 1), "commit": grid._commit()}


def configs() -> list[str]:
    """Every configuration the claim needs: DP at each replica count, WSP at each ``D``."""
    dp = [f"dp{n}" for n in sorted(set(DP_REPLICAS.values()), reverse=True)]
    return dp + [f"wsp-D{d}" for d in STALENESS]


def epochs_to(curve: list[float], target: float) -> float:
    """Epochs (from 1) to ``target``, interpolated from the one before (epoch 0: chance); inf: never."""
    prev, at = 0.25, 0.0             # chance before the first epoch
    for i, a in enumerate(curve):
        if math.isnan(a):
            continue
        if a >= target:
            return at + (i + 1 - at) * (target - prev) / (a - prev) if a > prev else float(i + 1)
        prev, at = a, float(i + 1)
    return math.inf


def load(path: Path = RUNS) -> list[dict[str, Any]]:
    """The runs' rows, typed."""
    if not path.exists():
        return []
    with path.open() as f:
        return [{**r, "lr": float(r["lr"]), "seed": int(r["seed"]),
                 "curve": [float(v) for v in r["accuracy_per_epoch"].split()]} for r in csv.DictReader(f)]


def best_lr(rows: list[dict[str, Any]], config: str, target: float = TARGET) -> float | None:
    """The step size at which ``config`` reaches the target soonest (median over seeds; then final)."""
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for r in rows:
        if r["config"] == config:
            by_lr.setdefault(r["lr"], []).append(r)
    if not by_lr:
        return None
    return min(by_lr, key=lambda lr: (statistics.median(epochs_to(r["curve"], target) for r in by_lr[lr]),
                                      -statistics.median(r["curve"][-1] for r in by_lr[lr])))


def hardware() -> list[dict[str, Any]]:
    """Simulated samples/s of DP and HetPipe (ED, HD, NP; each D) per model, into ``HARDWARE``."""
    import pandas as pd

    from reproductions.hetpipe import profiles
    from reproductions.hetpipe.virtual_workers import hetpipe_simulated

    out: list[dict[str, Any]] = []
    for m in profiles.MODELS:
        for how in ("kinds", "cpu-times"):
            df = hetpipe_simulated(profiles.gpu_profile(m, how), "hetpipe", staleness=STALENESS,
                                   policies=("ED", "HD", "NP"))
            for r in df.to_dict("records"):
                out.append({"model": m, "profile": how, "config": r["config"], "policy": r["policy"],
                            "D": "" if pd.isna(r["D"]) else int(r["D"]),
                            "samples_per_s": r["samples_per_s"], "speedup_over_dp": r["speedup_over_dp"],
                            "note": r["note"]})
    write_rows(HARDWARE, out)
    return out


def _spread(xs: list[float]) -> str:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return "never"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def _products(rows: list[dict[str, Any]], hw: list[dict[str, str]], target: float) -> list[dict[str, Any]]:
    """One row per model, profile pricing, policy and D >= 0 at test accuracy ``target``."""
    lrs = {c: best_lr(rows, c, target) for c in configs()}
    lrs.update({f"wsp-D{d}": lrs["wsp-D0"] for d in STALENESS if d > 0})      # run at D = 0's best only
    curves = {c: {r["seed"]: r["curve"] for r in rows if r["config"] == c and r["lr"] == lrs[c]}
              for c in configs()}
    out: list[dict[str, Any]] = []
    for m, n in DP_REPLICAS.items():
        dp = {s: epochs_to(c, target) for s, c in curves[f"dp{n}"].items()}
        for h in hw:
            if h["model"] != m or not h["D"]:
                continue
            wsp = {s: epochs_to(c, target) for s, c in curves[f"wsp-D{h['D']}"].items()}
            seeds = [s for s in sorted(set(dp) & set(wsp)) if math.isfinite(dp[s])]
            stat = [dp[s] / wsp[s] for s in seeds]
            speed = float(h["speedup_over_dp"])
            prod = [speed * x for x in stat]

            def q(xs: list[float], f: Any) -> float:
                return round(f(xs), 3) if xs else math.nan

            out.append({"model": m, "profile": h["profile"], "policy": h["policy"], "D": int(h["D"]),
                        "dp_gpus": n, "simulated_speedup": speed, "dp_lr": lrs[f"dp{n}"],
                        "wsp_lr": lrs[f"wsp-D{h['D']}"], "target": target,
                        "seeds_dp_reaching": len(seeds), "seeds_run": len(set(dp) & set(wsp)),
                        "seeds_wsp_reaching": sum(math.isfinite(wsp[s]) for s in seeds),
                        "dp_epochs": " ".join(f"{dp[s]:.2f}" for s in sorted(dp)),
                        "wsp_epochs": " ".join(f"{wsp[s]:.2f}" for s in sorted(wsp)),
                        "stat_efficiency_median": q(stat, statistics.median),
                        "stat_efficiency_min": q(stat, min), "stat_efficiency_max": q(stat, max),
                        "time_to_accuracy_speedup_median": q(prod, statistics.median),
                        "time_to_accuracy_speedup_min": q(prod, min),
                        "time_to_accuracy_speedup_max": q(prod, max), "paper_speedup": PAPER[m]})
    return out


def report() -> list[dict[str, Any]]:
    """Products per model, profile, policy and D into ``OUT``; prints a markdown table."""
    rows = load()
    with HARDWARE.open() as f:
        hw = list(csv.DictReader(f))
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        out += _products(rows, hw, target)
    if out:
        write_rows(OUT, out)
    print(f"{TASK}: epochs to each target test accuracy per seed; median (min-max) over the seeds on which "
          "DP reaches it (a WSP seed that never does counts 0)\n")
    print("| target | model | profile | HetPipe | DP GPUs | simulated × | seeds DP/WSP reach "
          "| epochs DP / WSP | product × | paper × |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in out:
        print(f"| {r['target']:g} | {r['model']} | {r['profile']} | {r['policy']} D={r['D']} | "
              f"{r['dp_gpus']} | {r['simulated_speedup']:.2f} | {r['seeds_dp_reaching']}/"
              f"{r['seeds_wsp_reaching']} of {r['seeds_run']} | {r['stat_efficiency_median']:.2f} "
              f"({r['stat_efficiency_min']:.2f}-{r['stat_efficiency_max']:.2f}) | "
              f"{r['time_to_accuracy_speedup_median']:.2f} "
              f"({r['time_to_accuracy_speedup_min']:.2f}-{r['time_to_accuracy_speedup_max']:.2f}) | "
              f"{r['paper_speedup']:.2f} |")
    return out


def _log(w: csv.DictWriter, f: Any, row: dict[str, Any]) -> None:
    w.writerow(row)
    f.flush()
    print(f"{row['config']} lr={row['lr']:g} seed={row['seed']}: {row['accuracy_per_epoch']} "
          f"({row['seconds']} s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="store_true", help="only read the CSVs")
    ap.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    ap.add_argument("--hardware", action="store_true", help="re-simulate the throughputs (about 20 s)")
    a = ap.parse_args(argv)
    if not a.report:
        done = {(r["config"], r["lr"], r["seed"]) for r in load()}
        new = not RUNS.exists()
        with RUNS.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                w.writeheader()
            swept = [c for c in configs() if not c.startswith("wsp-D") or c == "wsp-D0"]
            for sd in a.seeds:
                for c in swept:
                    for lr in LRS["dp" if c.startswith("dp") else "wsp"]:
                        if (c, lr, sd) not in done:
                            _log(w, f, run(c, lr, sd))
            lr0 = best_lr(load(), "wsp-D0")          # WSP at D > 0: at D = 0's best step size
            for sd in a.seeds:
                for d in STALENESS:
                    if d > 0 and lr0 is not None and (f"wsp-D{d}", lr0, sd) not in done:
                        _log(w, f, run(f"wsp-D{d}", lr0, sd))
    if a.hardware or not HARDWARE.exists():
        hardware()
    report()


if __name__ == "__main__":
    main()
