"""How long gloo's all-reduce takes on this machine after a given stretch of compute.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python reproductions/benchmarks/allreduce_after_compute.py [--steps 40]

Two gloo processes, each pinned to a core of its own as pipelab's runtime pins its workers. Each step
both compute for ``c`` milliseconds (small matrix products, as a backward would), then all-reduce a
buffer of ``n`` bytes with no barrier in between (as a ``dp`` run's ``U`` does); a step's time is the
slower rank's all-reduce. For each size and compute stretch the script prints the mean and the median
over the steps after the first five.

The calibration times the all-reduce inside a two-replica ``dp`` run of a model of about 1.3 ms of
compute per step (``pipelab.calibrate.allreduce_in_run``); this script shows how far that one point is
from what a model with longer or shorter actions pays (``reproductions/sim_accuracy/README.md``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _pair import run_pair, spin  # noqa: E402  (this folder's helper: two processes, reaped)

from pipelab.runtime.affinity import pin_worker  # noqa: E402

SIZES = (150_000, 860_000)          # bytes: the digits CNN's gradients, the transformer stack's
COMPUTE_S = (0.0005, 0.002, 0.008)  # a step's compute before its all-reduce


def _worker(rank: int, port: int, steps: int, queue: object) -> None:
    pin_worker(rank, 2)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out: dict[tuple[int, float], list[float]] = {}
    for n in SIZES:
        buf = torch.zeros(n // 4)
        for c in COMPUTE_S:
            times = []
            for _ in range(steps + 5):
                spin(c)
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                times.append(time.perf_counter() - t0)
            out[(n, c)] = times[5:]
    queue.put((rank, out))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    got = dict(run_pair(_worker, args.steps))
    print(f"{'bytes':>8s} {'compute':>8s} {'mean':>8s} {'median':>8s}   (us, the slower rank's all-reduce)")
    for key in got[0]:
        slower = [max(a, b) for a, b in zip(got[0][key], got[1][key])]
        print(f"{key[0]:8d} {key[1] * 1e3:6.1f}ms {statistics.fmean(slower) * 1e6:8.0f} "
              f"{statistics.median(slower) * 1e6:8.0f}")


if __name__ == "__main__":
    main()
