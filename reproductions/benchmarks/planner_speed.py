"""The planner's speed, and its pick against the default on PipeDream's shipped profiles.

Prints, per model and cluster: seconds ``pl.plan`` takes over all its default methods, candidates
(simulated / skipped by their bound / refused by a builder), the pick, and the default a torch or
Megatron user gets (1F1B-flush on a uniform layer split over every worker, ``M = P``), both
simulated. Nothing is asserted: speed on a shared machine is not a test. Target (issue 18):
GNMT-16 on 16 workers over all methods in under 30 s.

    .venv/bin/python reproductions/benchmarks/planner_speed.py [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import pipelab as pl

CASES = (("gnmt16", "pipedream-a:4x4"), ("vgg16", "pipedream-a:4x4"), ("gnmt8", "pipedream-b:2x8"),
         ("vgg16", "pipedream-b:2x8"))


def main() -> None:
    """Run the cases and print one line each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of the GNMT-16 / 16-worker case (median)")
    ap.add_argument("--quick", action="store_true", help="the GNMT-16 case only")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (2 shared cores)")
    cases = CASES[:1] if args.quick else CASES
    for i, (model, spec) in enumerate(cases):
        prof, cl = pl.Profile.open(model), pl.Cluster.parse(spec)
        times = []
        for _ in range(args.repeat if i == 0 else 1):
            t0 = time.perf_counter()
            table = pl.plan(prof, cl)
            times.append(time.perf_counter() - t0)
        status = table.table["status"]
        n_sim = int((status == "simulated").sum())
        n_skip = int(status.str.startswith("skipped").sum())
        n_err = int(status.str.startswith("error").sum())
        best, default = table.best, table.default
        runs = ", ".join(f"{t:.1f}" for t in times)
        print(f"{model} on {spec} ({cl.num_workers} workers): plan() {statistics.median(times):.1f} s "
              f"(median of {len(times)}: {runs}); {len(table.table)} candidates, "
              f"{n_sim} simulated, {n_skip} skipped by bound or memory, {n_err} refused by a builder")
        print(f"  pick:    {best['method']} {best['partitioner']} {best['config']} M={best['microbatches']} "
              f"chunks={best['chunks']} recompute={best['recompute']} compression={best['compression']}: "
              f"{best['throughput']:.0f} samples/s, peak {best['peak_memory'] / 2**30:.2f} GiB"
              + (f" [{best['staleness_risk']}]" if best["staleness_risk"] else ""))
        sync = table.table[(table.table["rank"] > 0) & table.table["synchronous"]].sort_values("rank")
        if not sync.empty:
            s = sync.iloc[0]
            print(f"  best synchronous: {s['method']} {s['partitioner']} {s['config']} "
                  f"M={s['microbatches']}: {s['throughput']:.0f} samples/s, "
                  f"peak {s['peak_memory'] / 2**30:.2f} GiB")
        print(f"  default: 1f1b-flush uniform {default['config']} M={default['microbatches']}: "
              f"{default['throughput']:.0f} samples/s, peak {default['peak_memory'] / 2**30:.2f} GiB "
              f"(fits: {default['fits']}); pick / default = "
              f"{best['throughput'] / default['throughput']:.2f}x")


if __name__ == "__main__":
    main()
