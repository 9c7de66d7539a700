"""How a tensor group moves a stage's activation: one rank receives it whole and broadcasts it to its
group (pipelab's choice, :mod:`pipelab.runtime.tensor_group`), or every rank receives a slice and the
group all-gathers them (Megatron-LM's scatter/gather, Narayanan et al. SC'21 §4.1).

Four gloo processes, one thread each: ranks 0 and 1 are the sending stage's tensor group, ranks 2
and 3 the receiving stage's. Per round the sending group hands one activation of ``--kib`` KiB to the
receiving group, which then holds it whole on both ranks:

* ``leader``: rank 0 sends it whole to rank 2; rank 2 broadcasts it to rank 3 (group {2, 3});
* ``slices``: rank 0 sends the first half to rank 2, rank 1 the second half to rank 3; ranks 2 and 3
  all-gather their halves.

It prints microseconds per hand-off (median and range over ``--rounds`` alternating rounds of
``--trips`` hand-offs each). Run:

    python reproductions/benchmarks/tensor_group_io.py [--rounds 5] [--trips 200] [--kib 16 256 2048]
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
import torch.multiprocessing as mp  # noqa: E402

from pipelab.runtime.job import free_port  # noqa: E402


def _handoff(rank: int, mode: str, x: torch.Tensor, recv_group: Any) -> None:
    half = x.numel() // 2
    if mode == "leader":
        if rank == 0:
            dist.send(x, 2)
        elif rank == 2:
            dist.recv(x, 0)
        if rank in (2, 3):
            dist.broadcast(x, src=2, group=recv_group)
        return
    flat = x.view(-1)
    if rank in (0, 1):
        dist.send(flat[rank * half:(rank + 1) * half].contiguous(), rank + 2)
    else:
        part = torch.empty(half)
        dist.recv(part, rank - 2)
        parts = [torch.empty(half), torch.empty(half)]
        dist.all_gather(parts, part, group=recv_group)
        flat.copy_(torch.cat(parts))


def _worker(rank: int, port: int, kibs: list[int], rounds: int, trips: int, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4,
                            timeout=timedelta(seconds=300))
    send_group, recv_group = dist.new_group([0, 1]), dist.new_group([2, 3])
    del send_group
    res: dict[tuple[str, int], list[float]] = {}
    for kib in kibs:
        sent = torch.arange(kib * 256, dtype=torch.float32)   # the sending group's (identical) activation
        x = sent.clone() if rank < 2 else torch.full_like(sent, -1.0)
        for mode in ("leader", "slices"):     # check once: the receiving group then holds it whole
            if rank >= 2:
                x.fill_(-1.0)
            _handoff(rank, mode, x, recv_group)
            if not torch.equal(x, sent):
                raise RuntimeError(f"{mode}: rank {rank} does not hold the activation after the hand-off")
        for r in range(rounds):
            for mode in (("leader", "slices") if r % 2 == 0 else ("slices", "leader")):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(trips):
                    _handoff(rank, mode, x, recv_group)
                dist.barrier()
                res.setdefault((mode, kib), []).append((time.perf_counter() - t0) / trips * 1e6)
    if rank == 3:
        out.put(res)
    dist.destroy_process_group()


def main() -> None:
    """Run the comparison and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trips", type=int, default=200)
    ap.add_argument("--kib", type=int, nargs="+", default=[16, 256, 2048])
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, a.kib, a.rounds, a.trips, q)) for r in range(4)]
    for p in procs:
        p.start()
    res = q.get(timeout=1800)
    for p in procs:
        p.join(30)
    print(f"{'KiB':>6} {'leader us':>22} {'slices us':>22} {'slices/leader':>14}")
    for kib in a.kib:
        lead, sl = res[("leader", kib)], res[("slices", kib)]
        print(f"{kib:>6} {statistics.median(lead):>9.0f} ({min(lead):.0f}-{max(lead):.0f}) "
              f"{statistics.median(sl):>9.0f} ({min(sl):.0f}-{max(sl):.0f}) "
              f"{statistics.median(sl) / statistics.median(lead):>13.2f}")


if __name__ == "__main__":
    main()
