"""One core per worker: pipelab's runtime with its CPU workers pinned (``pin_cores=True``) against
unpinned (``pin_cores=False``), paired rounds.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python reproductions/benchmarks/pin_cores.py [--rounds 3]

For the two models of ``reproductions/sim_accuracy`` (the digits CNN, the 4-block transformer) and
the methods given (default: dp, gpipe, 1f1b-flush, pipedream, 2bw; 2 gloo workers, each method's
plan and microbatches as in sim_accuracy), runs both settings once per round, alternating which goes
first, and prints each setting's median samples/s (steady-state window) and the median, min and max
of the per-round ratio pinned / unpinned.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pipelab.methods as methods  # noqa: E402
from pipelab.cluster import Cluster  # noqa: E402
from pipelab.runtime import train  # noqa: E402
from reproductions.sim_accuracy import accuracy as acc  # noqa: E402


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="cnn,transformer")
    ap.add_argument("--methods", default="dp,gpipe,1f1b-flush,pipedream,2bw")
    args = ap.parse_args()
    models = args.models.split(",")
    profs = acc.profiles(models)
    cluster = Cluster.flat(2)
    print(f"{'model':12s} {'method':12s} {'unpinned':>9s} {'pinned':>9s}   pinned / unpinned per round")
    for model, method, workers, mb in acc.configurations(full=False, models=models,
                                                         methods_=args.methods.split(","),
                                                         workers=None, microbatches=None):
        prof = profs[model]
        model_fn, data_fn, loss_fn, batch = acc.MODELS[model]
        plan = acc.plan_for(prof, cluster, method, workers, mb)
        if methods.get(method).partitioner == "dp":
            prof = prof.at_batch_size(batch // mb)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for pin in ((False, True) if r % 2 == 0 else (True, False)):
                run = train(model_fn, acc.run_plan(plan, prof, method), method=method,
                            data=functools.partial(data_fn, batch), loss_fn=loss_fn, optimizer=acc.sgd,
                            steps=acc.STEPS[model], microbatches=mb, backend="gloo", progress=False,
                            timeout=180, pin_cores=pin, **acc.METHODS[method])
                rates[pin].append(acc.steady_throughput(run.trace, run.schedule, batch))
        ratios = [b / a for a, b in zip(rates[False], rates[True])]
        print(f"{model:12s} {method:12s} {statistics.median(rates[False]):9.0f} "
              f"{statistics.median(rates[True]):9.0f}   {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)


if __name__ == "__main__":
    main()
