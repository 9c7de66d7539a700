"""One definition of each measure of a run, simulated or real, so every part computes it the same way.

Pure functions over event records (anything with ``worker``, ``kind``, ``microbatch``, ``start_s``,
``end_s``). Busy time counts compute actions (F, B, W, U) only; transfers and waits are idle. The
bubble fraction is ``1 - busy / (workers * span)``: ``(P - 1) / (M + P - 1)`` for GPipe and 1F1B with
equal stages (Huang et al. NeurIPS'19 §2.2; Narayanan et al. SC'21 §2.2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from pipelab.hostload import HostLoad

#: the kinds of compute actions (forward, backward, weight gradient, update); others are transfers
COMPUTE_KINDS = ("F", "B", "W", "U")


class Event(Protocol):
    """What the measures read of an event (:class:`pipelab.trace.Event` has it)."""

    @property
    def worker(self) -> int: ...  # noqa: D102
    @property
    def kind(self) -> str: ...  # noqa: D102
    @property
    def microbatch(self) -> int: ...  # noqa: D102
    @property
    def start_s(self) -> float: ...  # noqa: D102
    @property
    def end_s(self) -> float: ...  # noqa: D102


E = TypeVar("E", bound=Event)


def compute_events(events: Iterable[E]) -> list[E]:
    """The compute actions (F, B, W, U) among ``events``."""
    return [e for e in events if e.kind in COMPUTE_KINDS]


def busy_time(events: Iterable[Event], workers: Iterable[int], start: float | None = None,
              end: float | None = None) -> dict[int, float]:
    """Per worker of ``workers``, seconds in compute actions, clipped to ``[start, end]`` if given."""
    lo, hi = -math.inf if start is None else start, math.inf if end is None else end
    out: dict[int, float] = {w: 0.0 for w in workers}
    for e in compute_events(events):
        out[e.worker] += max(0.0, min(e.end_s, hi) - max(e.start_s, lo))
    return out


def span(events: Sequence[Event]) -> float:
    """Seconds from the first start to the last end of ``events`` (0 when there are none)."""
    return max(e.end_s for e in events) - min(e.start_s for e in events) if events else 0.0


def bubble_fraction(events: Iterable[Event], num_workers: int | None = None) -> float:
    """``1 - busy / (workers * span)`` over the compute actions (workers default: those that ran)."""
    comp = compute_events(events)
    if not comp:
        raise ValueError("no compute events (F/B/W/U): the bubble fraction of an empty trace is undefined")
    s, workers = span(comp), num_workers or len({e.worker for e in comp})
    return 1.0 - sum(e.end_s - e.start_s for e in comp) / (workers * s) if s > 0 else 0.0


def bubble_by_worker(busy: dict[int, float], window_s: float) -> dict[int, float]:
    """Per worker, the idle fraction ``1 - busy / window_s`` of a window (0 for an empty window)."""
    return {w: 1.0 - b / window_s if window_s > 0 else 0.0 for w, b in busy.items()}


#: rounds of one run whose rates differ by more than this factor say the machine's speed moved under it
BUSY_SPREAD = 1.25


def error_spread(predicted: float, measured: Sequence[float], *, load: HostLoad | None = None) -> str:
    """``(predicted - m) / m`` over measurements ``m``: median and range, e.g. ``+3.1% (-2.0% .. +7.4%
    over 5 rounds)``, noting a busy machine where the measurements differ by over :data:`BUSY_SPREAD`
    or, given the run's ``load`` (:class:`pipelab.hostload.HostLoadSampler`), where other processes
    held over :data:`pipelab.hostload.BUSY_SHARE` of the cores' time (a steady load that slows every
    round alike)."""
    if not measured or min(measured) <= 0:
        raise ValueError("error_spread needs at least one measurement, each > 0")
    errs = sorted((predicted - m) / m for m in measured)
    text = f"{statistics.median(errs):+.1%} ({errs[0]:+.1%} .. {errs[-1]:+.1%} over {len(errs)} rounds)"
    moved = max(measured) / min(measured)
    rounds, held = moved > BUSY_SPREAD, load is not None and load.busy
    if rounds or held:
        text += "; " + (f"the measured rate moved {moved:.2f}x between rounds, so " if rounds else "")
        text += "the machine was busy"
        if held:
            assert load is not None
            text += (f": other processes took {load.others_share:.0%} of the {load.cores} cores' time "
                     f"during the run (this run's processes got {load.own_share:.0%})")
        text += ": compare again when it is quieter"
    return text


def span_throughput(events: Iterable[Event], samples: float) -> float:
    """``samples`` per second of the compute actions' span (first start to last end); NaN if empty."""
    s = span(compute_events(events))
    return samples / s if s > 0 else math.nan


def minibatch_completions(events: Iterable[Event], microbatches: int, minibatches: int) -> list[float]:
    """Sorted end times of the minibatches (each its last compute action's end; a ``U`` with
    ``microbatches > 1`` names its minibatch, any other action microbatch ``m`` of ``m // microbatches``)."""
    done = [0.0] * minibatches
    for e in compute_events(events):
        k = e.microbatch if e.kind == "U" and microbatches > 1 else e.microbatch // microbatches
        done[k] = max(done[k], e.end_s)
    return sorted(done)


def steady_window(done: Sequence[float], in_flight: int, group: int) -> tuple[float, float, int] | None:
    """``(start, end, minibatches)`` of sorted completions ``done`` without ``in_flight`` of warm-up and
    as many of drain, both ends at multiples of ``group`` where possible; None for too short a run."""
    K = len(done)
    a, b = -(-in_flight // group) * group, (K - in_flight) // group * group
    if b <= a:
        a, b = in_flight, K - in_flight
    return (done[a - 1], done[b - 1], b - a) if b > a else None


def in_flight(replicas: Sequence[int], stage: int, *, per_replica: bool = True) -> int:
    """Microbatches a 1F1B pipeline keeps in flight at ``stage``: ``sum(replicas[stage:])``, per replica
    its ceiling over ``replicas[stage]`` (the input stage's is PipeDream's NOAM, SOSP'19 §3.2)."""
    if not 0 <= stage < len(replicas):
        raise ValueError(f"stage {stage} is outside 0..{len(replicas) - 1}")
    admitted = sum(int(r) for r in replicas[stage:])
    return -(-admitted // int(replicas[stage])) if per_replica else admitted


def most_live(kinds: Iterable[str], split_backward: bool = False) -> int:
    """Most microbatches alive at once in one stage's action kinds (``F`` adds, ``B`` or ``W`` retires)."""
    done = "W" if split_backward else "B"
    live = best = 0
    for k in kinds:
        if k == "F":
            live += 1
            best = max(best, live)
        elif k == done:
            live -= 1
    return best
