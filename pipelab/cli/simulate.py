"""``pipelab simulate PROFILE --cluster SPEC --method M [--plan plan.json]``: simulate a plan and report."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from pipelab import methods
from pipelab.cli._common import Parser, add_profile_and_cluster, fail, load_inputs, parse_args
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.schedules import ScheduleError
from pipelab.sim.simulate import simulate

PROG = "pipelab simulate"


def _parser() -> Parser:
    p = Parser(prog=PROG, description=(
        "Simulate a method's schedule on a plan with a profile's costs on a cluster, and report time per "
        "minibatch, throughput, utilization and peak memory per worker."))
    add_profile_and_cluster(p, "pipedream-a:4x4")
    p.add_argument("--method", default="pipedream", type=str.lower, choices=list(methods.names()),
                   help="schedule (default pipedream)")
    p.add_argument("--plan", help="plan JSON (Plan.save); default: partition the profile")
    p.add_argument("--partition", help="partitioner without --plan (pipedream, prefix-sum, gpipe, ...)")
    p.add_argument("--microbatches", type=int, help="per minibatch (default: one per stage)")
    p.add_argument("--minibatches", type=int, help="minibatches to simulate (default: the method's)")
    p.add_argument("--chunks", type=int, help="interleaved-1f1b: virtual stages per worker")
    p.add_argument("--versions", type=int, help="buffered: weight versions K")
    p.add_argument("--vertical-sync", action="store_true", help="pipedream: vertical sync")
    p.add_argument("--trace", help="write the trace as JSONL here")
    p.add_argument("--chrome", help="write a Chrome/Perfetto trace here")
    p.add_argument("--schedule-csv", help="write the schedule as CSV here")
    p.add_argument("--show-schedule", action="store_true", help="print the schedule grid")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipelab simulate``; returns the exit code."""
    args = parse_args(_parser(), argv)
    if args is None:
        return 0
    try:
        prof, cluster = load_inputs(args)
        plan = Plan.load(args.plan) if args.plan else \
            partition(prof, cluster, method=args.partition or methods.get(args.method).partitioner)
        given = {"chunks": args.chunks, "versions": args.versions,
                 "vertical_sync": args.vertical_sync or None}
        opts: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        res = simulate(plan, prof, cluster, method=args.method, microbatches=args.microbatches,
                       minibatches=args.minibatches, compression=args.compression, **opts)
    except (ValueError, TypeError, FileNotFoundError, ScheduleError) as exc:
        return fail(PROG, exc)
    print(plan.describe())
    print(res.describe())
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
