"""What else ran on this machine while a measurement ran: the cores' busy time split into ours and others'.

A real run's throughput is this machine's at that moment. Other processes that hold the cores for
the whole run slow every part of it alike, so the run's rounds agree with each other and only the
machine itself can say it was busy. :class:`HostLoadSampler` samples, in a background thread, the busy
time of the cores this process may run on (Linux's ``/proc/stat``) and the CPU time of this process
and all its descendants (``/proc/<pid>/stat``), so that a worker started through a fork server counts
as ours. The difference is the other processes' share.

Invariants: ``others_share`` and ``own_share`` lie in [0, 1] (fractions of ``wall_s * cores``,
clipped: a descendant that exits between two samples loses at most one interval of its CPU time to
"others", and clock ticks round the busy time of a short span). Where ``/proc`` is missing (not
Linux) the sampler records ``sampled=False`` and no share, and says so; it never guesses.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: other processes holding more than this share of the cores' time during a run make the machine busy
BUSY_SHARE = 0.25

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cores() -> tuple[int, ...]:
    """The CPU numbers this process may run on (all of them where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def _busy_ticks(cores: tuple[int, ...]) -> int | None:
    """Busy clock ticks (everything but idle and iowait) summed over ``cores``; None without /proc."""
    try:
        lines = (_PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    want = {f"cpu{c}" for c in cores}
    total = 0
    for line in lines:
        name, *fields = line.split()
        if name in want:
            ticks = [int(f) for f in fields[:8]]        # user nice system idle iowait irq softirq steal
            total += sum(ticks) - ticks[3] - ticks[4]
    return total


def _tree_ticks(root: int) -> int:
    """CPU clock ticks (user + system) of process ``root`` and every living descendant."""
    ticks: dict[int, int] = {}
    parent: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:                                  # exited while we looked
            continue
        fields = text[text.rindex(")") + 2:].split()     # after "pid (comm) "
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])    # utime, stime
    ours, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in ours:
                ours.add(child)
                frontier.append(child)
    return sum(ticks.get(p, 0) for p in ours)


@dataclass(frozen=True)
class HostLoad:
    """The cores' time during one measured span: how much went to this process tree, how much to others.

    Args:
        wall_s: the span's wall-clock seconds.
        cores: how many cores this process could run on.
        busy_core_s: core-seconds those cores were busy (all processes).
        own_core_s: of which this process and its descendants used.
        samples: how many samples the span holds (0 when not sampled).
        sampled: False where the platform has no ``/proc`` (no share is known then).
    """

    wall_s: float
    cores: int
    busy_core_s: float
    own_core_s: float
    samples: int
    sampled: bool = True

    @property
    def others_share(self) -> float:
        """The other processes' share of the cores' time (0 when unknown)."""
        if not self.sampled or self.wall_s <= 0:
            return 0.0
        return min(1.0, max(0.0, self.busy_core_s - self.own_core_s) / (self.wall_s * self.cores))

    @property
    def own_share(self) -> float:
        """This process tree's share of the cores' time (0 when unknown)."""
        if not self.sampled or self.wall_s <= 0:
            return 0.0
        return min(1.0, max(0.0, self.own_core_s) / (self.wall_s * self.cores))

    @property
    def busy(self) -> bool:
        """True when other processes held more than :data:`BUSY_SHARE` of the cores' time."""
        return self.others_share > BUSY_SHARE

    def describe(self) -> str:
        """One line: who held the cores during the span."""
        if not self.sampled:
            return "the machine's load was not sampled (no /proc here)"
        return (f"other processes took {self.others_share:.0%} of the {self.cores} cores' time over "
                f"{self.wall_s:.0f} s, this run's processes {self.own_share:.0%}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_json`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostLoad:
        """The record ``to_json`` wrote."""
        return cls(**data)


class HostLoadSampler:
    """``with HostLoadSampler() as load: ...`` then ``load.result``: the :class:`HostLoad` of the block
    (or ``load = HostLoadSampler().start()`` ... ``load.stop()`` where the span crosses notebook cells).

    Args:
        interval_s: seconds between samples of this process tree (a descendant that exits loses at most
            this much of its CPU time to "others").
    """

    def __init__(self, *, interval_s: float = 0.25) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s}")
        self.interval_s = interval_s
        self.result: HostLoad | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._own_ticks = 0
        self._samples = 0

    def _sample_tree(self, last: dict[str, int]) -> None:
        now = _tree_ticks(os.getpid())
        self._own_ticks += max(0, now - last["tree"])
        last["tree"] = now
        self._samples += 1

    def _loop(self, last: dict[str, int]) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample_tree(last)

    def start(self) -> HostLoadSampler:
        """Begin the span (what ``with`` does on entry); returns the sampler, e.g. across notebook cells."""
        if self._thread is not None or self.result is not None:
            raise RuntimeError("this HostLoadSampler was already started; make a new one for another span")
        self._cores = _cores()
        self._t0 = time.perf_counter()
        self._busy0 = _busy_ticks(self._cores)
        if self._busy0 is not None:
            self._last = {"tree": _tree_ticks(os.getpid())}
            self._thread = threading.Thread(target=self._loop, args=(self._last,), daemon=True,
                                            name="pipelab-hostload")
            self._thread.start()
        return self

    def stop(self) -> HostLoad:
        """End the span (what ``with`` does on exit); returns and keeps :attr:`result`."""
        if self.result is not None:
            return self.result
        if not hasattr(self, "_t0"):
            raise RuntimeError("stop() before start(): nothing was sampled")
        wall = time.perf_counter() - self._t0
        if self._thread is None or self._busy0 is None:
            self.result = HostLoad(wall, len(self._cores), 0.0, 0.0, 0, sampled=False)
            return self.result
        self._stop.set()
        self._thread.join()
        self._sample_tree(self._last)
        busy = (_busy_ticks(self._cores) or self._busy0) - self._busy0
        self.result = HostLoad(wall, len(self._cores), busy / _TICK, self._own_ticks / _TICK, self._samples)
        return self.result

    def __enter__(self) -> HostLoadSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
