"""One core per worker: pin a CPU worker process to a core of its own (``pin_cores=``).

``None`` (default) pins when this host's workers fit its cores, ``True`` always (round robin),
``False`` never; ``reproductions/benchmarks/pin_cores.py`` measures the effect.
"""

from __future__ import annotations

import os


def pin_worker(local_rank: int, local_workers: int, mode: bool | None = None) -> int | None:
    """Pin this process to ``cores[local_rank % len(cores)]`` per ``mode``; return the core (or None)."""
    if mode is False or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if not cores or (mode is None and local_workers > len(cores)):
        return None
    core = cores[local_rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core
