"""The crossing stall: two gloo processes swap a message each way per round, on one process group or two.

Each of 2 processes (one thread, pinned as pipelab pins its workers) runs rounds of: post a receive
from the peer, compute ``--compute-us`` microseconds, send ``--bytes`` to the peer, wait for both. The
two messages of a round cross, as a 1F1B backward's gradient crosses the peer's next activation.

* ``one group``: both directions on the default process group, one connection per pair;
* ``lanes``: each direction on a process group of its own (what :class:`pipelab.runtime.comm.DistComm`
  does with gloo), so a connection carries one direction of data.

It prints microseconds per round (median and range over ``--rounds`` alternating rounds) beside the
compute alone: the gap is the cost of the exchange. Run:

    python reproductions/benchmarks/gloo_crossing.py [--rounds 5] [--trips 400]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _pair import run_pair  # noqa: E402  (this folder's helper: two processes, reaped)

from pipelab.runtime.affinity import pin_worker  # noqa: E402


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _worker(rank: int, port: int, lanes: bool, trips: int, compute_us: float, nbytes: int,
            out: Any) -> None:
    torch.set_num_threads(1)
    pin_worker(rank, 2)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    up, down = dist.new_group([0, 1]), dist.new_group([0, 1])
    mine, theirs = (up, down) if rank == 0 else (down, up)
    if not lanes:
        mine = theirs = None
    peer = 1 - rank
    send, recv = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
    for i in range(trips // 10):    # warm-up
        r = dist.irecv(recv, src=peer, tag=i, group=theirs)
        s = dist.isend(send, dst=peer, tag=i, group=mine)
        r.wait()
        s.wait()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(trips):
        r = dist.irecv(recv, src=peer, tag=i, group=theirs)
        _busy(compute_us)
        s = dist.isend(send, dst=peer, tag=i, group=mine)
        r.wait()
        s.wait()
    if rank == 0:
        out.put((time.perf_counter() - t0) / trips * 1e6)
    dist.barrier()
    dist.destroy_process_group()


def one_run(lanes: bool, trips: int, compute_us: float, nbytes: int) -> float:
    """Microseconds per round of one two-process run."""
    return float(run_pair(_worker, lanes, trips, compute_us, nbytes, reports=1, timeout=120)[0])


def main() -> None:
    """Alternate the two variants over the rounds and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trips", type=int, default=400, help="timed rounds of exchange per run")
    ap.add_argument("--compute-us", type=float, default=150.0)
    ap.add_argument("--bytes", type=int, default=2048)
    args = ap.parse_args()
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"start: {now}, load average {os.getloadavg()[0]:.1f}")
    got: dict[str, list[float]] = {"one group": [], "lanes": []}
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for lanes in order:
            us = one_run(lanes, args.trips, args.compute_us, args.bytes)
            got["lanes" if lanes else "one group"].append(us)
        one, lanes_us = got["one group"][-1], got["lanes"][-1]
        print(f"round {r}: one group {one:.0f} us, lanes {lanes_us:.0f} us", flush=True)
    print(f"\n{args.bytes} B each way per round, {args.compute_us:.0f} us of compute before sending:")
    for k, v in got.items():
        print(f"  {k:9s} {statistics.median(v):6.0f} us per round [{min(v):.0f}-{max(v):.0f}], "
              f"{statistics.median(v) - args.compute_us:5.0f} us above the compute")
    ratios = [a / b for a, b in zip(got["one group"], got["lanes"])]
    print(f"  one group / lanes, paired: median {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    print(f"end: load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
