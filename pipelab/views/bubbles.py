"""Bubbles explained, drawn: per-worker stacked idle parts, the critical path on a Gantt chart, and a
planner's Pareto front. Pure: records in (a :class:`~pipelab.explain.BubbleBreakdown`, a trace, a
planner table), ``go.Figure`` out."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from pipelab.explain import PARTS, BubbleBreakdown
from pipelab.trace import Event, Trace

#: one colour per part of idle time (and busy time), colour-blind safe (Okabe-Ito)
PART_COLORS = {"busy": "#bbbbbb", "fill_drain": "#0072B2", "imbalance": "#E69F00", "straggler": "#D55E00",
               "transfer": "#009E73", "update": "#CC79A7"}
PART_NAMES = {"busy": "busy", "fill_drain": "fill / drain", "imbalance": "waiting on a slower stage",
              "straggler": "straggler", "transfer": "waiting on a transfer", "update": "updates / all-reduce"}


def bubbles(breakdown: BubbleBreakdown, *, share: bool = True, busy: bool = False,
            title: str | None = None) -> go.Figure:
    """One stacked bar per worker: its idle time split into :data:`~pipelab.explain.PARTS`.

    ``share``: parts as a share of the makespan (else seconds); ``busy``: stack busy time too. A
    negative part (a straggler's own row, see :mod:`pipelab.explain`) is drawn below zero.
    """
    if not isinstance(breakdown, BubbleBreakdown):
        raise TypeError(f"bubbles() draws a BubbleBreakdown (pl.explain(...)), got "
                        f"{type(breakdown).__name__}")
    t = breakdown.fractions() if share else breakdown.table
    cols = (["busy"] if busy else []) + list(PARTS)
    fig = go.Figure([go.Bar(name=PART_NAMES[col], x=[f"w{w}" for w in t.index], y=t[col].tolist(),
                            marker={"color": PART_COLORS[col]},
                            hovertemplate=f"%{{x}}: {PART_NAMES[col]} %{{y:{'.1%' if share else '.4g'}}}"
                                          "<extra></extra>") for col in cols])
    tot = breakdown.totals()
    head = title or "where the bubbles come from"
    fig.update_layout(barmode="relative", title={"text": f"{head} — idle {tot['idle']:.1%} of worker time"},
                      yaxis={"title": {"text": "share of the makespan" if share else "seconds"},
                             "tickformat": ".0%" if share else None},
                      xaxis={"title": {"text": "worker"}}, legend={"orientation": "h", "y": -0.2},
                      height=360, margin={"l": 10, "r": 10, "t": 50, "b": 40}, meta={"totals": tot})
    return fig


def with_critical_path(fig: go.Figure, trace: Trace, path: Sequence[Event], *, color: str = "#d62728"
                       ) -> go.Figure:
    """Draw ``path`` (:func:`pipelab.explain.critical_path`) over a :func:`~pipelab.views.gantt` of
    ``trace``: a line through the middle of each action and message on it. Returns ``fig``."""
    comp = trace.compute_events()
    if not comp:
        raise ValueError("the trace has no action to draw a critical path over")
    t0 = min(e.start_s for e in comp)
    row_of = {w: i for i, w in enumerate(sorted({e.worker for e in trace.events}))}
    xs: list[float | None] = []
    ys: list[float | None] = []
    for e in path:
        to = e.peer if e.kind == "send" else e.worker      # a message: from the sender to the receiver
        xs += [e.start_s - t0, e.end_s - t0]
        ys += [row_of.get(e.worker, 0), row_of.get(to, 0)]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="critical path",
                             line={"color": color, "width": 3}, hoverinfo="skip"))
    fig.update_layout(meta={**(fig.layout.meta or {}), "critical_path": len(path)})
    return fig


def pareto(table: pd.DataFrame, *, selected: int | None = None) -> go.Figure:
    """A planner table (:attr:`pipelab.planner.PlanTable.table`) as throughput against peak memory:
    every simulated candidate, those that fit solid, the Pareto front as a line, ``selected`` ringed.
    Each point's ``customdata`` is its table index."""
    sim = table[table["status"] == "simulated"]
    fig = go.Figure()
    for fits, name, opacity in ((False, "does not fit", 0.3), (True, "fits", 0.8)):
        part = sim[sim["fits"] == fits]
        if part.empty:
            continue
        fig.add_trace(go.Scatter(
            x=(part["peak_memory"] / 2**30).tolist(), y=part["throughput"].tolist(), mode="markers",
            name=name, opacity=opacity, customdata=list(part.index),
            text=[f"{m} · {p} {c} · M={mb}{' · chunks=' + str(k) if k else ''}{' · recompute' if r else ''}"
                  f"{' · ' + z if z != 'none' else ''}"
                  for m, p, c, mb, k, r, z in zip(part["method"], part["partitioner"], part["config"],
                                                   part["microbatches"], part["chunks"], part["recompute"],
                                                   part["compression"])],
            hovertemplate="%{text}<br>%{y:.1f} samples/s, %{x:.2f} GiB<extra></extra>",
        ))
    front = sim[sim["pareto"]].sort_values("peak_memory")
    if not front.empty:
        fig.add_trace(go.Scatter(x=(front["peak_memory"] / 2**30).tolist(), y=front["throughput"].tolist(),
                                 mode="lines", name="Pareto front", line={"shape": "hv", "color": "#222"},
                                 hoverinfo="skip"))
    if selected is not None and selected in sim.index:
        r = sim.loc[selected]
        ring = {"size": 16, "symbol": "circle-open", "color": "#d62728", "line": {"width": 3}}
        fig.add_trace(go.Scatter(x=[r["peak_memory"] / 2**30], y=[r["throughput"]], mode="markers",
                                 name="selected", marker=ring, hoverinfo="skip"))
    fig.update_layout(title={"text": "planner: throughput against peak memory per worker"},
                      xaxis={"title": {"text": "peak memory per worker (GiB)"}},
                      yaxis={"title": {"text": "samples/s"}}, height=420,
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig
