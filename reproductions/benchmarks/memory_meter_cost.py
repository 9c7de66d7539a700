"""The cost of ``measure_memory=True``: samples/s of the same run with the meter off and on, interleaved.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python reproductions/benchmarks/memory_meter_cost.py [--repeats 5]

The meter adds ``saved_tensors_hooks`` to every forward (a Python call per saved tensor) and a count of
every held storage after every action. Prints the median samples/s (``RunResult.throughput``) of each
setting over interleaved repeats, per model and backend, and the slowdown.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import pipelab as pl
from reproductions.sim_accuracy.accuracy import MODELS, sgd


def once(model: str, on: bool, backend: str, steps: int, method: str = "1f1b-flush") -> float:
    """Samples/s of one run."""
    model_fn, data_fn, loss_fn, batch = MODELS[model]
    n = len(list(model_fn().children())) if model == "cnn" else 10
    plan = pl.Plan.from_boundaries(n, [n // 2], batch_size=batch)
    res = pl.train(model_fn, plan, method=method, data=functools.partial(data_fn, batch), loss_fn=loss_fn,
                   optimizer=sgd, steps=steps, microbatches=4, backend=backend, progress=False,
                   measure_memory=on)
    return float(res.throughput)


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--backends", nargs="*", default=["gloo", "local"])
    args = ap.parse_args()
    for model in args.models:
        for backend in args.backends:
            runs: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.repeats):
                for on in (False, True):
                    runs[on].append(once(model, on, backend, args.steps))
            off, on_ = statistics.median(runs[False]), statistics.median(runs[True])
            print(f"{model:12s} {backend:6s} off {off:9.1f} samples/s  on {on_:9.1f} samples/s  "
                  f"slowdown {off / on_ - 1:+.1%}  (medians of {args.repeats}, interleaved)", flush=True)


if __name__ == "__main__":
    main()
