"""Simulator speed: actions per second for 32 stages x 512 microbatches (about 33k actions).

Run: ``.venv/bin/python reproductions/benchmarks/sim_speed.py [--repeat 5]``. Prints the median
seconds to build, validate and simulate the schedule (unit costs and a profile-based cost model)
and actions per second. Target on a 2-core laptop-class machine: simulation under 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pipelab.cluster import Cluster
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules import build, validate
from pipelab.sim import simulate, simulate_schedule


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    """Print build / validate / simulate medians and actions per second."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stages", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    P, M = args.stages, args.microbatches
    for method in ("1f1b-flush", "gpipe", "zb-h1"):
        sch = build(method, P, microbatches=M)
        n = len(sch)
        t_build = _median(lambda: build(method, P, microbatches=M), args.repeat)  # noqa: B023
        t_val = _median(lambda: validate(sch), max(1, args.repeat // 2))  # noqa: B023
        t_sim = _median(lambda: simulate_schedule(sch), args.repeat)  # noqa: B023
        print(f"{method:11s} {P} stages x {M} microbatches = {n} actions: build {t_build:.3f} s, "
              f"validate {t_val:.3f} s, simulate (unit costs) {t_sim:.3f} s = {n / t_sim:,.0f} actions/s")
    prof = Profile.synthetic(
        [1e-3] * P, [2e-3] * P, out_bytes=[10**6] * P, param_bytes=[10**6] * P, batch_size=M
    )
    cl = Cluster.preset("pipedream-a", servers=P // 4, gpus_per_server=4)
    plan = Plan.even(P, P, batch_size=M)
    t_prof = _median(lambda: simulate(plan, prof, cl, method="1f1b-flush", microbatches=M), args.repeat)
    n = len(build("1f1b-flush", P, microbatches=M))
    print(f"1f1b-flush with profile costs on pipedream-a:{P // 4}x4 (transfers, ports, memory timeline): "
          f"{t_prof:.3f} s = {n / t_prof:,.0f} actions/s")


if __name__ == "__main__":
    main()
