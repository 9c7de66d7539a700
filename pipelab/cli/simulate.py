"""``pipelab simulate PROFILE --cluster pipedream-a:4x4 --method pipedream ...``: simulate and report.

PROFILE is a profile JSON (``Profile.save``) or a PipeDream ``graph.txt``. The plan comes from
``--plan plan.json`` or is made by ``pipelab.partition.partition`` (``--partition METHOD``, default:
the method's natural partitioner). Prints the plan, the measured time per minibatch, throughput,
utilization and peak memory per worker; optionally writes the trace (JSONL / Chrome) and the
schedule (CSV).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pipelab import methods
from pipelab.cluster import Cluster
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules import ScheduleError
from pipelab.sim.simulate import simulate

_PARTITIONER = {"dp": "dp", "gpipe": "gpipe", "hetpipe": "hetpipe", "buffered": "prefix-sum"}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipelab simulate``; returns the exit code."""

    p = argparse.ArgumentParser(prog="pipelab simulate", description="simulate a plan with a method")
    p.add_argument("profile", help="profile JSON (Profile.save) or PipeDream graph.txt")
    p.add_argument("--cluster", default="pipedream-a:4x4", help="cluster spec, e.g. pipedream-a:4x4, flat:8")
    p.add_argument("--method", default="pipedream", choices=list(methods.names()))
    p.add_argument("--plan", help="plan JSON (Plan.save); default: partition the profile")
    p.add_argument(
        "--partition", help="partitioner when no --plan (pipedream, prefix-sum, gpipe, hetpipe, dp)"
    )
    p.add_argument("--microbatches", type=int)
    p.add_argument("--minibatches", type=int)
    p.add_argument("--chunks", type=int, help="interleaved-1f1b: virtual stages per worker")
    p.add_argument("--versions", type=int, help="buffered: weight versions K")
    p.add_argument("--vertical-sync", action="store_true", help="pipedream: vertical sync")
    p.add_argument("--compression", type=float, default=1.0, help="activation compression ratio (2 = fp16)")
    p.add_argument("--trace", help="write the trace as JSONL here")
    p.add_argument("--chrome", help="write a Chrome/Perfetto trace here")
    p.add_argument("--schedule-csv", help="write the schedule as CSV here")
    p.add_argument("--show-schedule", action="store_true", help="print the schedule grid")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))


    try:
        prof = Profile.open(args.profile)
        cluster = Cluster.parse(args.cluster)
        if args.plan:
            plan = Plan.load(args.plan)
        else:
            plan = partition(
                prof, cluster, method=args.partition or _PARTITIONER.get(args.method, "pipedream")
            )
        opts: dict[str, Any] = {}
        if args.chunks is not None:
            opts["chunks"] = args.chunks
        if args.versions is not None:
            opts["versions"] = args.versions
        if args.vertical_sync:
            opts["vertical_sync"] = True
        res = simulate(plan, prof, cluster, method=args.method, microbatches=args.microbatches,
                       minibatches=args.minibatches, compression=args.compression, **opts)
    except (ValueError, FileNotFoundError, ScheduleError) as exc:
        print(f"pipelab simulate: {exc}", file=sys.stderr)
        return 2
    print(plan.describe())
    print(res.summary())
    if plan.time_per_minibatch == plan.time_per_minibatch:  # not NaN
        print(f"partitioner predicted {plan.time_per_minibatch * 1e3:.3f} ms/minibatch; simulated "
              f"{res.time_per_minibatch * 1e3:.3f} ({res.time_per_minibatch / plan.time_per_minibatch:.3f}x)")
    for w, (u, m) in enumerate(zip(res.utilization, res.peak_memory)):
        print(f"  worker {w:3d}: utilization {u:6.1%}  peak memory {m / 2**30:7.2f} GiB")
    if args.show_schedule:
        print(res.schedule.grid(max_steps=40))
    if args.trace:
        print(f"trace: {res.trace.save_jsonl(args.trace)}")
    if args.chrome:
        print(f"chrome trace: {res.trace.to_chrome_trace(args.chrome)}")
    if args.schedule_csv:
        print(f"schedule: {res.schedule.to_csv(args.schedule_csv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
