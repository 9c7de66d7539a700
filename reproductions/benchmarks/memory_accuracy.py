"""Memory, predicted against measured: each worker's simulated peak (``pl.simulate(...).peak_memory``)
against the runtime's measured peak (``pl.train(..., measure_memory=True).peak_memory``, the bytes of
the storages a worker holds, :mod:`pipelab.runtime.memory`), per method, on the digits CNN and a
transformer-style block stack, 2 gloo processes on this CPU.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python reproductions/benchmarks/memory_accuracy.py [--models cnn]

Prints one line per (model, method, worker): predicted and measured bytes, the error (predicted /
measured - 1) and the measured parts at the peak (weights, gradients, optimizer state, activations,
messages). The first minibatch allocates the optimizer's state lazily, so runs take 3 minibatches.
"""

from __future__ import annotations

import argparse
import functools

import pipelab as pl
from reproductions.sim_accuracy.accuracy import MODELS, sgd

METHODS = ("gpipe", "1f1b-flush", "zb-h1", "pipedream", "2bw", "pipemare", "interleaved-1f1b", "dp")


def run(model: str, method: str, *, workers: int = 2, microbatches: int = 4, steps: int = 3,
        backend: str = "gloo") -> list[tuple[int, int, int, dict[str, int]]]:
    """``(worker, predicted, measured, measured parts)`` of one configuration."""
    model_fn, data_fn, loss_fn, batch = MODELS[model]
    data = data_fn(batch)
    x, y = data[0]
    M = {"pipedream": 1, "pipemare": 1, "2bw": 1, "dp": workers}.get(method, microbatches)
    # dp: the simulator runs each microbatch as one profile minibatch on one replica; the loss is
    # profiled too (the last stage holds what it saves for its backward)
    n = len(x) // M if method == "dp" else len(x)
    prof = pl.profile(model_fn(), x[:n], loss_fn=loss_fn, target=y[:n], progress=False)
    opts: dict[str, object] = {}
    if method == "interleaved-1f1b":
        opts["chunks"] = 2
    if method == "dp":
        plan = pl.partition(prof, pl.Cluster.flat(workers, bandwidth=1e9), method="dp",
                            allreduce_overlap="none")
    else:
        plan = pl.Plan.even(len(prof), workers, batch_size=batch)
    cluster = pl.Cluster.flat(workers, bandwidth=1e9)
    sim = pl.simulate(plan, prof, cluster, method=method, microbatches=M, minibatches=steps,
                      optimizer="sgd-momentum", **opts)
    sched = sim.schedule
    if method == "interleaved-1f1b":   # the runtime runs the simulator's virtual stages
        plan = pl.sim.virtual_plan(plan, prof, 2)
    res = pl.train(model_fn, plan, method=method, data=functools.partial(data_fn, batch), loss_fn=loss_fn,
                   optimizer=sgd, steps=steps, microbatches=M, backend=backend, progress=False,
                   schedule=sched,
                   measure_memory=True)
    return [(w, sim.peak_memory[w], res.peak_state[w], res.memory_breakdown[w])
            for w in range(sched.num_workers)]


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()
    print(f"{'model':12s} {'method':17s} w {'predicted':>10s} {'measured':>10s} {'error':>7s}  "
          "measured parts at the peak")
    for model in args.models:
        for method in args.methods:
            for w, pred, meas, parts in run(model, method, backend=args.backend):
                err = pred / meas - 1 if meas else float("nan")
                print(f"{model:12s} {method:17s} {w} {pred:10d} {meas:10d} {err:+7.1%}  "
                      + " ".join(f"{k}={v}" for k, v in parts.items()), flush=True)


if __name__ == "__main__":
    main()
