"""How long the partitioners take: medians of a few runs, printed (no asserts).

Cases (the issue's targets in brackets): VGG-16 on PipeDream cluster A 4x4 [< 0.2 s], GNMT-16 on
A 4x4 [< 2 s], synthetic 1,000-layer models on 64 workers [< 10 s] (one where data parallelism
wins, on B 8x8; one with heavy weights where a deep pipeline wins, on A 16x4); plus
prefix-sum on the same cases. Run: ``python reproductions/benchmarks/partition_speed.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from pipelab.cluster import Cluster  # noqa: E402
from pipelab.partition import partition  # noqa: E402
from pipelab.profile.records import Profile  # noqa: E402


def synthetic(n: int, seed: int = 0, max_params: int = 10**6) -> Profile:
    """A random ``n``-layer profile: times 0.1-1 ms, outputs up to 1 MB, weights up to ``max_params``."""
    rng = np.random.default_rng(seed)
    return Profile.synthetic(list(rng.uniform(1e-4, 1e-3, n)),
                             param_bytes=[int(x) for x in rng.integers(0, max_params, n)],
                             out_bytes=[int(x) for x in rng.integers(0, 10**6, n)], model=f"synthetic{n}")


def median_s(fn, runs: int) -> tuple[float, str]:  # type: ignore[no-untyped-def]
    """Median wall seconds of ``runs`` calls and the last result's config."""
    ts, cfg = [], ""
    for _ in range(runs):
        t = time.perf_counter()
        cfg = fn().config
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), cfg


def main(argv: list[str] | None = None) -> int:
    """Print one line per case: method, model, cluster, median seconds, target, chosen config."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    cases = [
        ("vgg16", Profile.from_pipedream("vgg16"), Cluster.parse("pipedream-a:4x4"), 0.2),
        ("gnmt16", Profile.from_pipedream("gnmt16"), Cluster.parse("pipedream-a:4x4"), 2.0),
        ("synthetic1000", synthetic(1000), Cluster.preset("pipedream-b", servers=8, gpus_per_server=8), 10.0),
        # heavy weights: data parallelism loses, the DP's pruning bound comes from the straight pipeline
        ("heavy1000", synthetic(1000, max_params=3 * 10**7), Cluster.preset("pipedream-a", servers=16,
                                                                              gpus_per_server=4), 10.0),
    ]
    print(
        f"{'method':11s} {'model':14s} {'cluster':18s} {'layers':>6s} {'median s':>9s} {'target s':>9s}  "
        "config"
    )
    for method in ("pipedream", "prefix-sum"):
        for name, prof, cl, target in cases:
            t, cfg = median_s(
                lambda p=prof, c=cl, m=method: partition(p, c, m, memory_limit=float("inf")), args.runs
            )
            tgt = f"{target:9.1f}" if method == "pipedream" else f"{'-':>9s}"
            print(f"{method:11s} {name:14s} {cl.name:18s} {len(prof):6d} {t:9.3f} {tgt}  {cfg[:40]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
