"""How long a gloo message waits for its sender's communication thread when the sender computes.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python reproductions/benchmarks/notice_wait.py [--trips 200]

gloo moves a message between two processes only once the sender's side knows the receive is posted:
the receiver writes a "ready" notice, and the sender's I/O thread (one per process, pinned with the
worker to its core by pipelab's runtime) reads it; a send issued before that notice was read waits
for the I/O thread to send the data. This script times that wait directly. Two pinned gloo processes;
rank 0 sends 16 kB and then either computes (small matrix products, as a backward would) or sleeps
for 10 ms; rank 1 posts the receive 0.5-6 ms after the send and times posting to arrival. Trips
alternate between the two modes. A computing sender's trip less the median trip of a sleeping one is
the notice's wait for the busy core; the script prints both distributions and that wait's mean,
median and share over 1 ms.

The simulator does not use this wait as such: modelled per message (each message charged the
expected part of this wait left after the time its sender computed since the notice came), it
replayed the accuracy matrix's real runs too fast; see ``reproductions/sim_accuracy/README.md``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _pair import run_pair, spin  # noqa: E402  (this folder's helper: two processes, reaped)

HOLD_S = 10e-3


def _worker(rank: int, port: int, trips: int, queue: object) -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    rng = random.Random(7)
    buf = torch.zeros(4096)
    out: list[tuple[str, float]] = []
    for k in range(trips + 2):
        mode = "busy" if k % 2 else "idle"
        offset = rng.uniform(0.5e-3, 6e-3)
        dist.barrier()
        if rank == 0:
            work = dist.isend(buf, 1)
            if mode == "busy":
                spin(HOLD_S)
            else:
                time.sleep(HOLD_S)
            work.wait()
        else:
            time.sleep(offset)
            t0 = time.perf_counter()
            dist.irecv(buf, 0).wait()
            if k >= 2:
                out.append((mode, time.perf_counter() - t0))
    if rank == 1:
        queue.put(out)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main() -> None:
    """Print the two distributions and the notice's wait."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trips", type=int, default=200)
    args = ap.parse_args()
    got = run_pair(_worker, args.trips, reports=1)[0]     # rank 1 reports its receives
    idle = sorted(t for m, t in got if m == "idle")
    busy = sorted(t for m, t in got if m == "busy")
    base = statistics.median(idle)
    wait = sorted(max(t - base, 0.0) for t in busy)

    def deciles(v: list[float]) -> str:
        return " ".join(f"{v[min(int(k * len(v) / 10), len(v) - 1)] * 1e6:.0f}" for k in range(10))

    print(f"posting to arrival, us (deciles), sender sleeping:  {deciles(idle)}  max {idle[-1] * 1e6:.0f}")
    print(f"posting to arrival, us (deciles), sender computing: {deciles(busy)}  max {busy[-1] * 1e6:.0f}")
    print(f"the notice's wait on a computing sender: mean {statistics.fmean(wait) * 1e6:.0f} us, median "
          f"{statistics.median(wait) * 1e6:.0f} us, {sum(w > 1e-3 for w in wait) / len(wait):.0%} over 1 ms "
          f"({len(wait)} trips)")


if __name__ == "__main__":
    main()
