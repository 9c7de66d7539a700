"""Helpers of the two-process benchmarks: start two processes on a fresh local port, collect what
they report and reap them; keep a core busy computing for a while."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from pipelab.runtime.job import free_port


def run_pair(worker: Callable[..., None], *args: Any, reports: int = 2, timeout: float = 300.0) -> list[Any]:
    """Run ``worker(rank, port, *args, queue)`` in two spawned processes (ranks 0 and 1, one free
    port for their process group) and return the ``reports`` items they put on ``queue``, in arrival
    order; the processes are joined, and killed if they outlive the collection by 10 s."""
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, *args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        return [queue.get(timeout=timeout) for _ in range(reports)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def spin(seconds: float) -> None:
    """Compute for ``seconds`` on this thread (small matrix products, as a backward would)."""
    a = torch.full((64, 64), 0.01)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = torch.tanh(a @ a)
