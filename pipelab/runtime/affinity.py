"""One core per worker: pin a CPU worker process to a core of its own (``pin_cores=``).

On a CPU, each worker computes on one thread, and the backend's I/O threads (gloo's device loop)
wake whenever a message or an all-reduce moves. Left to the scheduler, a worker's threads migrate
between the cores and preempt the other worker's compute. Pinning each worker process (and so every
thread it starts) to its own core, as ``torchrun --numa-binding`` and DeepSpeed's
``--bind_cores_to_rank`` do, helps some methods and not others (``reproductions/benchmarks/pin_cores.py``
and its README section measure it).

``pin_cores=None`` (the default) pins when the workers of this host fit its cores (the ones this
process may run on); ``True`` pins anyway (round robin over the cores); ``False`` never pins.
"""

from __future__ import annotations

import os


def pin_worker(local_rank: int, local_workers: int, mode: bool | None = None) -> int | None:
    """Pin this process to core ``cores[local_rank % len(cores)]`` of the cores it may run on, as
    ``mode`` says (module docstring); return that core, or None where nothing was pinned (``mode``
    False, more workers than cores with ``mode`` None, or a platform without CPU affinity). Call it
    before the process group starts its threads: they inherit the affinity."""
    if mode is False or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if not cores or (mode is None and local_workers > len(cores)):
        return None
    core = cores[local_rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


__all__ = ["pin_worker"]
