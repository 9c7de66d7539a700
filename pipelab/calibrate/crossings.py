"""Crossing sends and arrivals priced in real runs: the extra of a crossed action, or one with an
arrival, over the quiet actions of the same worker and kind (:mod:`pipelab.schedules.crossing` says
which actions crossed)."""

from __future__ import annotations

import statistics
from typing import Any

from pipelab.calibrate.tiny import medium_data, medium_model, tiny_loss, tiny_sgd
from pipelab.graph import layer_nodes, trace
from pipelab.partition.plan import Plan
from pipelab.runtime import train
from pipelab.schedules.actions import Action
from pipelab.schedules.crossing import arrived_actions, crossed_actions


def extras_over_quiet(durations: dict[tuple[int, str, str], list[float]], cls: str
                      ) -> list[tuple[int, float]]:
    """``(count, mean extra seconds)`` of class ``cls`` over ``"quiet"``, per ``(worker, kind, class)`` key
    of ``durations`` that has a quiet twin."""
    out = []
    for (w, kind, c), ts in durations.items():
        quiet = durations.get((w, kind, "quiet"))
        if c == cls and ts and quiet:
            out.append((len(ts), statistics.fmean(ts) - statistics.fmean(quiet)))
    return out


def _extra(durations: dict[tuple[int, str, str], list[float]], cls: str) -> float:
    """Mean extra seconds of class ``cls`` over quiet actions, weighted by count, each at least 0."""
    pairs = extras_over_quiet(durations, cls)
    den = sum(n for n, _ in pairs)
    return sum(n * max(d, 0.0) for n, d in pairs) / den if den else 0.0


def _crossings(run: Any, pooled: dict[tuple[int, str, str], list[float]], cross_rounds: list[float],
               arrive_rounds: list[float]) -> tuple[set[tuple[int, Action]], set[tuple[int, Action]]]:
    """Pool the run's ``F``/``B`` durations past its first quarter as crossed, arrived or quiet, append
    the round's two extras; returns ``(crossed, arrived but not crossed)``."""
    comp = list(run.trace.compute_events())
    t0, t1 = min(e.start_s for e in comp), max(e.end_s for e in comp)
    crossed = crossed_actions(run.schedule, comp)
    arrived = arrived_actions(run.schedule, comp) - crossed
    mine: dict[tuple[int, str, str], list[float]] = {}
    for e in comp:
        a = (e.worker, Action(e.stage, e.kind, e.microbatch))
        if e.start_s < t0 + 0.25 * (t1 - t0) or e.kind not in ("F", "B"):
            continue
        c = "crossed" if a in crossed else "arrived" if a in arrived else "quiet"
        mine.setdefault((e.worker, e.kind, c), []).append(e.end_s - e.start_s)
    for k, v in mine.items():
        pooled.setdefault(k, []).extend(v)
    cross_rounds.append(_extra(mine, "crossed"))
    arrive_rounds.append(_extra(mine, "arrived"))
    return crossed, arrived


def interleaved_crossing(repeats: int, backend: str = "gloo", steps: int = 48) -> list[float]:
    """The crossing extra of a two-worker ``interleaved-1f1b`` run of the medium model cut in four, one
    figure per round (the stall depends on the schedule)."""
    n = len(layer_nodes(trace(medium_model())))     # the plan needs the count only: no profile
    plan = Plan.from_boundaries(n, [n // 4, n // 2, 3 * n // 4], batch_size=64)
    out: list[float] = []
    for _ in range(repeats):
        run = train(medium_model, plan, method="interleaved-1f1b", data=medium_data, loss_fn=tiny_loss,
                    optimizer=tiny_sgd, steps=steps, microbatches=4, backend=backend, progress=False,
                    timeout=120, chunks=2)
        pooled: dict[tuple[int, str, str], list[float]] = {}
        rounds: list[float] = []
        _crossings(run, pooled, rounds, [])
        if any(k[2] == "crossed" for k in pooled):
            out.append(rounds[-1])
    return out
