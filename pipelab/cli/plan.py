"""``pipelab plan PROFILE --cluster SPEC [--method M | --auto] [-o plan.json]``: plan from the shell."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pipelab._io import atomic_write_text
from pipelab.cli._common import Parser, add_profile_and_cluster, fail, load_inputs, number_or_text, parse_args
from pipelab.cluster import Cluster
from pipelab.partition import METHODS, partition
from pipelab.planner import plan as auto_plan
from pipelab.profile.records import Profile

PROG = "pipelab plan"


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description=(
        "Partition a profile into pipeline stages for a cluster (--method), or search every method, "
        "partition, microbatch count and option with the planner (--auto)."))
    add_profile_and_cluster(ap)
    ap.add_argument("--method", default="pipedream", type=str.lower, choices=METHODS,
                    help="partitioner (default pipedream)")
    ap.add_argument("--straight", action="store_true", help="pipedream: no replication")
    ap.add_argument("--memory-limit-gb", type=float, default=None, help="per-worker memory limit in GiB")
    ap.add_argument("--optimizer", default="sgd-momentum", help="sgd, sgd-momentum or adam")
    ap.add_argument("--allreduce-overlap", default="ddp", choices=("ddp", "none"),
                    help="replicated stages' all-reduce: overlapped with backward (ddp) or after it "
                         "(none, as pipelab's runtime does)")
    ap.add_argument("--microbatches", type=int, default=None,
                    help="gpipe: microbatches per minibatch (default: one per stage)")
    ap.add_argument("--batch-size", type=int, default=None, help="override the profile's minibatch size")
    ap.add_argument("--auto", action="store_true",
                    help="search methods x partitions x microbatches x options with the planner")
    ap.add_argument("--methods", default=None,
                    help="--auto: comma-separated methods to search (default: all but the ablations)")
    ap.add_argument("--top", type=int, default=10, help="--auto: rows to print")
    ap.add_argument("--margin", type=number_or_text, default=None,
                    help="--auto: the simulator's relative throughput error on this machine: a number for "
                         "every method, or the sim_errors.json (or results.csv) reproductions/sim_accuracy "
                         "wrote here (default: none known; ranked by prediction alone)")
    ap.add_argument("--table", default=None, help="--auto: write the whole ranked table as CSV here")
    ap.add_argument("--no-progress", action="store_true", help="--auto: no progress bar")
    ap.add_argument("-o", "--output", default=None, help="write the plan JSON here")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, partition, print the plan; write it with ``-o``. Returns the exit code."""
    args = parse_args(_parser(), argv)
    if args is None:
        return 0
    limit = args.memory_limit_gb * 2**30 if args.memory_limit_gb is not None else None
    try:
        prof, cluster = load_inputs(args)
        if args.batch_size is not None:
            prof = prof.scaled(batch_size=args.batch_size)
        if args.auto:
            return _auto(args, prof, cluster, limit)
        opts: dict[str, Any] = {}
        if args.straight:
            if args.method != "pipedream":
                raise ValueError("--straight applies to --method pipedream")
            opts["straight"] = True
        if args.microbatches is not None:
            if args.method != "gpipe":
                raise ValueError("--microbatches applies to --method gpipe (the other partitioners predict "
                                 "whole minibatches; pipelab simulate --microbatches times any M)")
            opts["microbatches"] = args.microbatches
        plan = partition(prof, cluster, args.method, compression=args.compression, memory_limit=limit,
                         optimizer=args.optimizer, allreduce_overlap=args.allreduce_overlap, **opts)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        return fail(PROG, exc)
    print(plan.describe())
    if args.output:
        print(f"wrote {plan.save(args.output)}")
    return 0


def _auto(args: argparse.Namespace, prof: Profile, cluster: Cluster, limit: float | None) -> int:
    """``--auto``: run the planner, print its table, default and Pareto front; write what was asked."""
    names = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    table = auto_plan(prof, cluster, memory_limit=limit, methods=names, optimizer=args.optimizer,
                      margin=args.margin, progress=not args.no_progress)
    print(table.describe(args.top))
    try:
        best = table.best
    except ValueError as exc:
        return fail(PROG, exc)
    peak = float(best["peak_memory"]) / 2**30
    M = int(best["microbatches"])
    print(f"\npick: {best['method']} on {best['partitioner']} {best['config']} ({best['stages']} stages), "
          f"M={M} microbatches of {prof.batch_size // M}: {best['throughput']:.1f} samples/s "
          f"(simulated, {'flush included' if best['synchronous'] else 'steady state, no flush'}), "
          f"peak {peak:.2f} GiB")
    if table.default_row is not None:
        d = table.default
        print(f"default (1f1b-flush, uniform split, M={int(d['microbatches'])}, flush included): "
              f"{d['throughput']:.1f} samples/s "
              f"(pick {best['throughput'] / d['throughput']:.2f}x; the simulator's error above the table)"
              if d["status"] == "simulated" else
              f"default (1f1b-flush, uniform split): {d['status']}")
    front = table.pareto
    points = [f"{m}/{c}/M={mb}: {t:.0f} at {p / 2**30:.2f} GiB" for m, c, mb, t, p in zip(
        front["method"], front["config"], front["microbatches"], front["throughput"], front["peak_memory"])]
    print("Pareto front (throughput vs peak memory): " + ", ".join(points))
    if args.table:
        print(f"wrote {atomic_write_text(args.table, table.table.to_csv(index=False))}")
    if args.output:
        print(f"wrote {table.candidate().plan.save(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
