"""Step size x method x pipeline depth: test accuracy after every epoch, per seed, one CSV row per cell.

Every run is real training with pipelab's runtime on its single-process reference executor
(``backend="local"``: the same workers, weight policies and schedules as the gloo runtime, which
computes the same weights; tests/test_runtime_async.py), one ``pl.train`` call per epoch resuming
from the previous epoch's checkpoint (the pipeline drains at each epoch's end, where the accuracy is
taken), as ``pipelab.reproduce.stash_experiment`` does for the digits.

Methods (``METHODS``): ``dp`` (P replicas), ``gpipe`` (M = P), ``pipedream`` (M = 1, stashing),
``pipedream+vertical_sync``, ``naive-async`` (M = 1, no stash), ``2bw`` (M = P), ``buffered:3``
(K = 3 versions, M = P), ``pipemare`` (M = 1, T1 over the whole run + T2), ``pipemare-T1`` (T2 only),
``pipemare-T2`` (T1 only), ``pipemare-K25`` (T1's K a quarter of the run), ``pipemare-K25-Dtau`` (and T2's
decay ``0.1 ** (1 / tau)``); PipeMare with neither technique is ``naive-async`` exactly (tested). Every
method takes one optimizer step per minibatch of ``BATCH`` samples, so the step counts and
samples per step are the same for all. The optimizer is the task's (``OPTIMIZERS``), the same for
every method; PipeMare's T1 rescales its param groups' ``lr`` before every step, which SGD and Adam
both read.

Usage::

    nice -n 15 .venv/bin/python reproductions/convergence/grid.py --full          # the whole grid
    .venv/bin/python reproductions/convergence/grid.py                            # the default subset
    .venv/bin/python reproductions/convergence/grid.py --tasks shapes --stages 4 --seeds 0 \\
        --methods dp pipedream --lrs 0.03 --out /tmp/x.csv

Rows already in ``--out`` are skipped (a grid can be stopped and continued). ``--full`` writes
``cells.csv``, the default subset ``cells_subset.csv``, beside this file; ``report.py`` reads them.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tasks  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from pipelab.graph import layer_nodes, trace  # noqa: E402
from pipelab.partition.plan import Plan  # noqa: E402
from pipelab.runtime import train  # noqa: E402
from pipelab.runtime.guards import NonFiniteError  # noqa: E402

METHODS = ["dp", "gpipe", "pipedream", "pipedream+vertical_sync", "naive-async", "2bw", "buffered:3",
           "pipemare", "pipemare-T1", "pipemare-T2", "pipemare-K25", "pipemare-K25-Dtau"]
EPOCHS = {"shapes": 4, "chars": 4}
#: the optimizer per task, the same for every method: ``(torch.optim class name, its options)``
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {"shapes": ("SGD", {"momentum": 0.9}),
                                                     "chars": ("Adam", {})}
#: a factor 2 apart, around the step size where data parallelism does best (with the task's optimizer)
LRS = {"shapes": [0.015, 0.03, 0.06], "chars": [0.002, 0.004, 0.008]}
#: gpipe is left out of the full grid: its update is dp's (minibatch SGD, equal to plain training in
#: tests/test_runtime.py), so its row would repeat dp's; ``--methods gpipe`` runs it
FULL = {"tasks": ["shapes", "chars"], "stages": [2, 4, 8], "seeds": [0, 1, 2],
        "methods": [m for m in METHODS if m != "gpipe"]}
SUBSET = {"tasks": ["shapes"], "stages": [4], "seeds": [0], "lrs": [0.015, 0.06],
          "methods": ["dp", "pipedream", "naive-async", "pipemare"]}
#: time to accuracy (report.py): runs long enough, at step sizes small enough, for the pipelines to reach
#: a target accuracy; ``--tta`` into cells_tta.csv
TTA = {"tasks": ["shapes"], "stages": [2, 4, 8], "seeds": [0, 1, 2], "lrs": [0.0075, 0.015],
       "methods": ["dp", "pipedream", "pipedream+vertical_sync", "pipemare"], "epochs": 12}
#: ``make reproduce``'s part of it: VGG-16's depth (P = 2), one seed, DP and PipeDream (cells_tta_subset.csv)
TTA_SUBSET = {**TTA, "stages": [2], "seeds": [0], "lrs": [0.015], "methods": ["dp", "pipedream"]}
FIELDS = ["task", "stages", "method", "lr", "seed", "epochs", "final_accuracy", "best_accuracy",
          "accuracy_per_epoch", "loss_per_epoch", "diverged", "seconds", "commit"]


def spec(method: str, stages: int, steps_total: int) -> tuple[str, dict[str, Any], int]:
    """``(pipelab method, options, microbatches)`` of a grid method name at ``stages``."""
    if method == "dp" or method == "gpipe":
        return method, {}, stages
    if method in ("2bw", "buffered:3"):
        return ("2bw", {}, stages) if method == "2bw" else ("buffered", {"versions": 3}, stages)
    if method.startswith("pipedream"):
        return "pipedream", ({"vertical_sync": True} if "vertical" in method else {}), 1
    if method == "naive-async":
        return "naive-async", {}, 1
    opts: dict[str, Any] = {"warmup_steps": steps_total}      # T1's K: the whole run (weight_buffer/run.py)
    if method.startswith("pipemare-K25"):     # T1's K: the first quarter of the run (a warm-up)
        opts["warmup_steps"] = max(1, steps_total // 4)
        if method.endswith("Dtau"):            # T2's decay gamma = D ** (1 / tau), D = 0.1
            opts.update(decay=0.1, decay_from_delay=True)
    if method == "pipemare-T1":
        opts["lr_reschedule"] = False
    elif method == "pipemare-T2":
        opts["discrepancy_correction"] = False
    return "pipemare", opts, 1


def _model(task: str) -> nn.Module:
    net = tasks.TASKS[task][0]()
    if task == "shapes":     # zero-initialized residual branches: stable without normalization
        for m in net.modules():
            if isinstance(m, tasks.Residual):
                nn.init.zeros_(m.b.weight)
                nn.init.zeros_(m.b.bias)
    return net


def constant_accuracy(task: str) -> float:
    """Test accuracy of always predicting the test set's most frequent class (what a dead model gets)."""
    y = tasks._chars_test()[1] if task == "chars" else tasks._shapes_test()[1]
    return round(float(torch.bincount(y).max()) / len(y), 4)


def optimizer(task: str, lr: float) -> functools.partial[torch.optim.Optimizer]:
    """The optimizer factory of ``task`` (``OPTIMIZERS``) at step size ``lr``."""
    name, options = OPTIMIZERS[task]
    return functools.partial(getattr(torch.optim, name), lr=lr, **options)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dim() == 3:     # chars: a target at every position
        return nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
    return nn.functional.cross_entropy(out, y)


def run_cell(task: str, stages: int, method: str, lr: float, seed: int,
             epochs: int | None = None) -> dict[str, Any]:
    """Train one cell; test accuracy and mean training loss after every epoch."""
    epochs = epochs or EPOCHS[task]
    per_epoch = tasks.STEPS_PER_EPOCH[task]
    name, opts, micro = spec(method, stages, per_epoch * epochs)
    L = len(layer_nodes(trace(_model(task))))
    plan = (Plan.from_boundaries(L, [], replicas=[stages], method="dp") if name == "dp"
            else Plan.even(L, stages, method=name))
    data = functools.partial(tasks.epochs_data, task, epochs, seed)
    model_fn = functools.partial(_model, task)
    accs: list[float] = []
    losses: list[float] = []
    t0 = time.perf_counter()
    diverged = False
    with tempfile.TemporaryDirectory() as tmp:
        for e in range(epochs):
            resume = {"resume": tmp} if e else {}
            try:
                r = train(model_fn, plan, method=name, data=data, loss_fn=_loss,
                          optimizer=optimizer(task, lr),
                          steps=per_epoch * (e + 1), microbatches=micro, backend="local", seed=seed,
                          progress=False, checkpoint_every=per_epoch, checkpoint_dir=tmp, **resume, **opts)
            except NonFiniteError:     # a NaN loss: diverged; a constant prediction's accuracy from here on
                diverged = True
                accs += [constant_accuracy(task)] * (epochs - e)
                losses += [float("nan")] * (epochs - e)
                break
            ls = [float(v) for v in r.losses]
            mean_loss = sum(ls) / max(len(ls), 1)
            net = _model(task)
            net.load_state_dict(r.state_dict())
            accs.append(round(tasks.accuracy(task, net), 4))
            losses.append(round(mean_loss, 4) if mean_loss == mean_loss else float("nan"))
            if not all(torch.isfinite(p).all() for p in net.parameters()) or not mean_loss < 1e6:
                diverged = True       # NaN or exploded: the remaining epochs stay at this accuracy
                accs += [accs[-1]] * (epochs - e - 1)
                losses += [float("nan")] * (epochs - e - 1)
                break
    return {"task": task, "stages": stages, "method": method, "lr": lr, "seed": seed, "epochs": epochs,
            "final_accuracy": accs[-1], "best_accuracy": max(accs),
            "accuracy_per_epoch": " ".join(f"{a:.4f}" for a in accs),
            "loss_per_epoch": " ".join(f"{v:.4f}" for v in losses), "diverged": int(diverged),
            "seconds": round(time.perf_counter() - t0, 1), "commit": _commit()}


@functools.lru_cache(maxsize=1)
def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(HERE.parent.parent / "pipelab")],
                               cwd=HERE, capture_output=True, text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def skipped(method: str, stages: int, seed: int, sel: dict[str, Any]) -> bool:
    """Cells the grid leaves out to fit its time: ``dp`` runs at the smallest depth only (minibatch SGD
    whatever the replica count; report.py uses it as the baseline of every depth) and ``gpipe`` at
    the first seed only (the same minibatch SGD as ``dp``, up to the order of floating-point sums)."""
    if method == "dp":
        return stages != min(sel["stages"])
    if method == "gpipe":
        return seed != sel["seeds"][0]
    return False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="the whole grid (FULL), into cells.csv")
    ap.add_argument("--tta", action="store_true", help="the time-to-accuracy runs (TTA), into cells_tta.csv")
    ap.add_argument("--tta-subset", action="store_true", help="make reproduce's part of TTA (TTA_SUBSET)")
    ap.add_argument("--epochs", type=int, help="epochs per run (default: EPOCHS, or the selection's)")
    ap.add_argument("--tasks", nargs="+")
    ap.add_argument("--stages", nargs="+", type=int)
    ap.add_argument("--seeds", nargs="+", type=int)
    ap.add_argument("--methods", nargs="+")
    ap.add_argument("--lrs", nargs="+", type=float)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    base = TTA if a.tta else TTA_SUBSET if a.tta_subset else FULL if a.full else SUBSET
    sel = {k: getattr(a, k, None) or v for k, v in base.items()}
    epochs = a.epochs or sel.get("epochs")
    bad = [m for m in sel["methods"] if m not in METHODS]
    if bad:
        raise SystemExit(f"unknown grid method(s) {bad}; choose from {METHODS}")
    name = ("cells_tta.csv" if a.tta else "cells_tta_subset.csv" if a.tta_subset else
            "cells.csv" if a.full else "cells_subset.csv")
    out = a.out or HERE / name
    done: set[tuple[str, int, str, float, int]] = set()
    if out.exists():
        with out.open() as f:
            done = {(r["task"], int(r["stages"]), r["method"], float(r["lr"]), int(r["seed"]))
                    for r in csv.DictReader(f)}
    new = not out.exists()
    with out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        # seeds outermost: a grid stopped early has every cell at the first seeds
        for seed in sel["seeds"]:
            for task in sel["tasks"]:
                for P in sel["stages"]:
                    for lr in (a.lrs or sel.get("lrs") or LRS[task]):
                        for m in sel["methods"]:
                            if (task, P, m, lr, seed) in done or skipped(m, P, seed, sel):
                                continue
                            row = run_cell(task, P, m, lr, seed, epochs)
                            w.writerow(row)
                            f.flush()
                            print(f"{task} P={P} {m:24s} lr={lr:<7g} seed={seed} "
                                  f"acc={row['final_accuracy']:.3f} ({row['seconds']}s)", file=sys.stderr,
                                  flush=True)


if __name__ == "__main__":
    main()
