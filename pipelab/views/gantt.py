"""Gantt chart of a pipeline: one row per worker, one box per action, communication under them.

Draws a :class:`~pipelab.trace.Trace`, a result with ``.trace``, or a bare schedule laid out with unit
costs (:func:`schedule_trace`). Kinds differ by pattern, colour is the microbatch or weight version;
above :data:`BARS_MAX` actions the chart is one heatmap (``reproductions/benchmarks/gantt_render.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative, unlabel_rgb

import pipelab.metrics as metrics
from pipelab.schedules.actions import Schedule
from pipelab.schedules.dataflow import Deadlock, UnitCosts, dependencies, run
from pipelab.trace import COMPUTE_KINDS, Event, Trace

#: Unit costs of a bare schedule: B = 2 F (Narayanan et al. SC'21 §2.2); F = B = W with a split-off
#: weight gradient (Zero Bubble, Qi et al. ICLR'24 §2).
UNIT_COSTS: dict[str, float] = {"F": 1.0, "B": 2.0, "W": 1.0, "U": 0.0}
UNIT_COSTS_SPLIT: dict[str, float] = {"F": 1.0, "B": 1.0, "W": 1.0, "U": 0.0}

PALETTE: tuple[str, ...] = tuple(qualitative.Plotly) + tuple(qualitative.Safe)
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight grad", "U": "update"}
KIND_STYLE: dict[str, dict[str, Any]] = {
    "F": {"pattern_shape": "", "line": {"width": 0.5, "color": "#444"}, "opacity": 1.0},
    "B": {"pattern_shape": "/", "line": {"width": 0.5, "color": "#444"}, "opacity": 0.85},
    "W": {"pattern_shape": ".", "line": {"width": 0.5, "color": "#444"}, "opacity": 0.7},
    "U": {"pattern_shape": "x", "line": {"width": 2.0, "color": "#000"}, "opacity": 1.0},
}
TRANSFER_COLOR = "#7f7f7f"
#: communication drawn under the actions: point-to-point sends grey, each collective its own colour
COMM_COLORS: dict[str, str] = {"tensor": "#E69F00", "allreduce": "#6A3D9A"}
COMM_NAMES: dict[str, str] = {"tensor": "tensor-group collectives", "allreduce": "data-parallel all-reduce"}
KIND_LEGEND_COLOR = "#d9d9d9"
LEGEND_COLORS_MAX = 8
#: the legend-only entries' groups (:func:`action_traces` leaves them out)
LEGEND_GROUPS = ("kinds", "colours")
COLOR_BY = ("microbatch", "version")
#: most actions ``render="auto"`` draws as SVG boxes before it paints a raster
BARS_MAX = 2000
RASTER_MAX_BINS = 4000


def schedule_trace(schedule: Schedule, *, costs: Mapping[str, float] | None = None) -> Trace:
    """Lay a schedule out in time with per-kind unit costs and free transfers, on the simulator's engine
    (:func:`pipelab.schedules.dataflow.run`); ``ValueError`` if it deadlocks or is incomplete."""
    if len(schedule) == 0:
        raise ValueError("the schedule has no actions; build it with pl.schedules.build(method, plan, "
                         "microbatches=...)")
    split = any(a.kind == "W" for acts in schedule.actions for a in acts)
    cost = {**(UNIT_COSTS_SPLIT if split else UNIT_COSTS), **(costs or {})}
    unknown = set(cost) - set(COMPUTE_KINDS)
    if unknown or any(not (v >= 0) for v in cost.values()):
        raise ValueError(f"costs {dict(costs or {})} must map kinds F/B/W/U to durations >= 0")
    present = {(a.kind, a.stage, a.microbatch) for acts in schedule.actions for a in acts}
    for w, acts in enumerate(schedule.actions):
        for a in acts:
            for k, st, m in dependencies(a.kind, a.stage, a.microbatch, schedule.num_stages - 1):
                if (k, st, m) not in present:
                    raise ValueError(f"worker {w} action {a} needs {st}{k}{m}, which no worker runs; "
                                     f"the schedule is incomplete (check its builder)")
    meta = {"method": schedule.method, "unit_costs": cost, "layout": "unit-cost",
            "microbatches": schedule.microbatches, "minibatches": schedule.minibatches,
            "stage_ranks": [list(r) for r in schedule.stage_ranks]}
    uc = UnitCosts(f=cost["F"], b=cost["B"], w=cost["W"] if split else 0.0, u=cost["U"])
    try:
        evs = run(schedule, uc)
    except Deadlock as exc:
        raise ValueError(f"the {schedule.method!r} schedule deadlocks: {exc}") from None
    evs = [e for e in evs if e.kind in COMPUTE_KINDS or e.end_s > e.start_s]
    return Trace.from_events(evs, **meta, layout_engine="pipelab.schedules.dataflow")


def bubble_fraction(trace: Trace | Sequence[Event], *, num_workers: int | None = None) -> float:
    """Idle share of worker time, ``1 - busy / (workers * makespan)`` (:mod:`pipelab.metrics`)."""
    return metrics.bubble_fraction(trace.events if isinstance(trace, Trace) else trace, num_workers)


def worker_labels(trace: Trace, stage_ranks: Sequence[Sequence[int]] | None = None) -> dict[int, str]:
    """Row labels such as ``"w3 · stage 1 (replica 0)"``; replicas numbered by ``stage_ranks`` (default
    ``trace.meta["stage_ranks"]``, else by rank within each stage)."""
    stage_ranks = trace.meta.get("stage_ranks") if stage_ranks is None else stage_ranks
    stages_of: dict[int, set[int]] = {}
    for e in trace.events:
        if e.kind in COMPUTE_KINDS:
            stages_of.setdefault(e.worker, set()).add(e.stage)
    if stage_ranks is None:
        last = max((s for ss in stages_of.values() for s in ss), default=-1)
        stage_ranks = [sorted(w for w, ss in stages_of.items() if s in ss) for s in range(last + 1)]
    labels = {}
    for w in sorted({e.worker for e in trace.events}):
        hosted = sorted(stages_of.get(w, ()))
        if len(hosted) == 1:
            ranks = list(stage_ranks[hosted[0]]) if hosted[0] < len(stage_ranks) else []
            labels[w] = f"w{w} · stage {hosted[0]} (replica {ranks.index(w) if w in ranks else 0})"
        elif hosted:
            labels[w] = f"w{w} · stages {','.join(map(str, hosted))}"
        else:
            labels[w] = f"w{w}"
    return labels


def _as_trace(source: Any, costs: Mapping[str, float] | None) -> tuple[Trace, float | None]:
    """Normalize the accepted inputs to a Trace (and the source's own bubble fraction, if it has one)."""
    if isinstance(source, Schedule):
        return schedule_trace(source, costs=costs), None
    if isinstance(source, Trace):
        return source, None
    trace = getattr(source, "trace", None)
    if isinstance(trace, Trace):
        bub = getattr(source, "bubble_fraction", None)
        if isinstance(bub, (tuple, list)) and bub and all(isinstance(b, (int, float)) for b in bub):
            bub = sum(bub) / len(bub)    # the simulator's is per worker, over its measured window
        return trace, float(bub) if isinstance(bub, (int, float)) else None
    if isinstance(source, (list, tuple)) and all(isinstance(e, Event) for e in source):
        return Trace.from_events(source), None
    raise TypeError(f"gantt() draws a Trace, a Schedule, a list of Events or a result with .trace; "
                    f"got {type(source).__name__}")


def color_key(e: Event, color_by: str) -> int:
    """The number an event is coloured by (``PALETTE[key % len(PALETTE)]``): microbatch or weight version."""
    return e.microbatch if color_by == "microbatch" else max(e.weight_version, 0)


def gantt(trace_or_schedule: Trace | Schedule | Sequence[Event] | Any, *, color_by: str = "microbatch",
          show_transfers: bool = True, title: str | None = None, costs: Mapping[str, float] | None = None,
          time_unit: str | None = None, render: str = "auto",
          window: str | tuple[float, float] = "auto", range_slider: bool = True) -> go.Figure:
    """Draw one row per worker and one box per action; the title carries the bubble fraction.

    Args:
        color_by: ``"microbatch"`` or ``"version"`` (the weight version an action read).
        costs: per-kind durations for a bare schedule (default :data:`UNIT_COSTS`).
        time_unit: the x axis label (default ``"s"``, ``"unit"`` for schedules).
        render: ``"bars"`` (one SVG box per action), ``"raster"`` (one heatmap on a time grid of at most
            :data:`RASTER_MAX_BINS` bins) or ``"auto"`` (bars up to :data:`BARS_MAX` actions).
        window: the time range shown first (the whole run stays one zoom away on a range slider):
            ``"auto"`` the warm-up and :data:`STEADY_MINIBATCHES` steady minibatches of a long run,
            ``"latest"`` the last ones (the live chart), ``"all"`` the whole run, or ``(start, end)``
            in the axis' units. A raster also draws that window's actions as boxes.
        range_slider: with a window, the whole run on a slider under the axis (else a double click
            on the chart shows it).
    """
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by={color_by!r}; use one of {COLOR_BY}")
    if render not in ("auto", "bars", "raster"):
        raise ValueError(f"render={render!r}; use 'auto', 'bars' or 'raster'")
    trace, source_bubble = _as_trace(trace_or_schedule, costs)
    compute = trace.compute_events()
    if not compute:
        raise ValueError(f"nothing to draw: the trace has {len(trace)} events and none is an action "
                         f"(F/B/W/U); run or simulate at least one step before drawing")
    labels = worker_labels(trace)       # a laid-out schedule carries its stage_ranks in trace.meta
    rows = [labels[w] for w in sorted(labels)]
    bubble = source_bubble if source_bubble is not None else bubble_fraction(trace, num_workers=len(rows))
    unit = time_unit or ("unit" if trace.meta.get("layout") == "unit-cost" else "s")
    t0 = min(e.start_s for e in compute)
    row_of = {w: i for i, w in enumerate(sorted(labels))}
    raster = render == "raster" or (render == "auto" and len(compute) > BARS_MAX)
    mbs = trace.meta.get("microbatches")
    shown = _window(compute, t0, int(mbs) if isinstance(mbs, int) and mbs >= 1 else None, window)
    if raster:
        # the first window's actions as boxes, the rest as a raster: readable at once, the whole run one
        # zoom away
        inside = [] if shown is None else \
            [e for e in compute if e.end_s - t0 > shown[0] and e.start_s - t0 < shown[1]]
        boxed = shown if 0 < len(inside) <= BARS_MAX else None
        fig = _raster(compute, row_of, t0, color_by, unit, hole=boxed)
        if boxed is not None:
            fig.add_traces(list(_bars(inside, trace, labels, row_of, t0, color_by, unit, False).data))
    else:
        fig = _bars(compute, trace, labels, row_of, t0, color_by, unit, show_transfers)
    _legend(fig, compute, color_by, raster, boxed=raster and shown is not None and len(fig.data) > 1)
    head = title or " ".join(filter(None, (trace.meta.get("method", ""), "pipeline")))
    xaxis: dict[str, Any] = {"title": {"text": f"time ({unit})"}, "rangemode": "tozero"}
    slider = shown is not None and range_slider
    if shown is not None:
        xaxis.update(range=list(shown))
    if slider:
        xaxis.update(rangeslider={"visible": True, "thickness": RANGESLIDER_THICKNESS})
    fig.update_layout(
        title={"text": f"{head} — bubble {bubble:.1%}, makespan {trace.makespan:.4g} {unit}"},
        xaxis=xaxis,
        meta={**(fig.layout.meta or {}), "bubble_fraction": bubble, "color_by": color_by,
              "boxes": len(compute), "window": list(shown) if shown is not None else None},
        **rows_layout(rows, top=60, base=140))
    fit_legend(fig, slider=slider)
    return fig


#: steady-state minibatches the first window of a long run shows after its warm-up
STEADY_MINIBATCHES = 3
#: the range slider's height as a share of the plot's
RANGESLIDER_THICKNESS = 0.12


def minibatch_of(e: Event, microbatches: int) -> int:
    """The minibatch an action belongs to (a ``U``'s microbatch field is its minibatch)."""
    return e.microbatch if e.kind == "U" else e.microbatch // max(1, microbatches)


def _window(compute: Sequence[Event], t0: float, microbatches: int | None,
            window: str | tuple[float, float]) -> tuple[float, float] | None:
    """The x range shown first (relative to ``t0``), or None for the whole run.

    A minibatch ends with its last ``U`` (or, without ``U``, its last action); microbatches per
    minibatch come from the trace (else from the ratio of stage 0's forwards to its updates)."""
    if isinstance(window, tuple):
        lo, hi = (float(x) for x in window)
        if not hi > lo:
            raise ValueError(f"window={window!r}: give (start, end) with end > start")
        return lo, hi
    if window not in ("auto", "latest", "all"):
        raise ValueError(f"window={window!r}; use 'auto', 'latest', 'all' or (start, end)")
    if window == "all":
        return None
    ups = [e for e in compute if e.kind == "U"]
    if microbatches is None:
        firsts = {e.microbatch for e in compute if e.kind == "F"}
        updates = {e.microbatch for e in ups}
        microbatches = max(1, round(len(firsts) / len(updates))) if updates else 1
    done: dict[int, float] = {}
    for e in ups or compute:
        k = minibatch_of(e, microbatches)
        done[k] = max(done.get(k, -math.inf), e.end_s - t0)
    ends = sorted(done.values())
    # minibatches started (a forward) before the first one ended: the warm-up
    started = {minibatch_of(e, microbatches) for e in compute if e.kind == "F" and e.start_s - t0 < ends[0]}
    n = max(1, len(started)) + STEADY_MINIBATCHES
    if len(ends) <= n + 1:
        return None
    if window == "latest":
        return ends[-STEADY_MINIBATCHES - 2], ends[-1]
    return 0.0, ends[n - 1]


#: approximate pixel sizes of plotly's default 12 px legend font: one character, one entry's row,
#: the swatch and padding left of the text
LEGEND_CHAR_PX, LEGEND_ROW_PX, LEGEND_SWATCH_PX = 7.0, 20, 46
#: the height plotly adds under the plot for a range slider (measured in Chromium: about 64 px)
SLIDER_PX = 80


def fit_legend(fig: go.Figure, *, slider: bool = False) -> None:
    """Put the legend right of the plot, top-aligned with it, and size the margins and height so that
    it never covers the title or the bars: the right margin holds its widest entry, the height its
    rows (below the title's margin). ``slider``: leave room for a range slider under the x axis."""
    listed = [t for t in fig.data if t.name and (t.showlegend if t.showlegend is not None
                                                 else t.type != "heatmap")]
    names = [str(t.name) for t in listed]
    margin = fig.layout.margin
    top = margin.t if margin.t is not None else 60
    bottom = margin.b if margin.b is not None else 40
    groups = len({t.legendgroup for t in listed})
    legend_px = LEGEND_ROW_PX * len(names) + 10 * max(0, groups - 1) + 10
    # the plot area (the legend's height limit) holds the legend; plotly adds a slider below the margin
    need = top + bottom + legend_px + (SLIDER_PX if slider else 0)
    height = max(int(fig.layout.height or 0), need)
    width = int(LEGEND_SWATCH_PX + LEGEND_CHAR_PX * max((len(n) for n in names), default=0)) + 20
    fig.update_layout(
        height=height, margin={"r": max(10, width) if names else 10, "b": bottom},
        legend={"orientation": "v", "x": 1.0, "xanchor": "left", "xref": "paper", "y": 1.0, "yanchor": "top",
                "yref": "paper", "tracegroupgap": 10, "bgcolor": "rgba(255,255,255,0.9)"},
        meta={**(fig.layout.meta or {}), "legend_px": {"width": width, "rows": len(names)}})


def rows_layout(rows: Sequence[str], *, top: int, base: int,
                tickvals: Sequence[int] | None = None) -> dict[str, Any]:
    """The layout charts of horizontal bars share: one labelled row per entry of ``rows``, top down."""
    ticks = list(range(len(rows))) if tickvals is None else list(tickvals)
    return {"barmode": "overlay", "bargap": 0.15, "hovermode": "closest", "plot_bgcolor": "#f4f4f4",
            "yaxis": {"tickmode": "array", "tickvals": ticks, "ticktext": list(rows), "autorange": "reversed",
                      "zeroline": False, "showgrid": False},
            "height": min(base + 28 * len(rows), 2400), "margin": {"l": 10, "r": 10, "t": top, "b": 40},
            "legend": {"orientation": "v", "x": 1.0, "xanchor": "left", "y": 1.0, "yanchor": "top"}}


def _bars(compute: Sequence[Event], trace: Trace, labels: Mapping[int, str], row_of: Mapping[int, int],
          t0: float, color_by: str, unit: str, show_transfers: bool) -> go.Figure:
    """One go.Bar per kind: exact boxes with per-box hover (the default up to BARS_MAX actions)."""
    ncol = len(PALETTE)
    # value k paints PALETTE[k]: numeric colour arrays build fast (plotly checks colour strings one by one)
    scale = [[pos, c] for k, c in enumerate(PALETTE) for pos in (k / ncol, (k + 1) / ncol)]
    fig = go.Figure()
    for kind in COMPUTE_KINDS:
        evs = [e for e in compute if e.kind == kind]
        if not evs:
            continue
        style = KIND_STYLE[kind]
        fig.add_trace(go.Bar(
            name=KIND_NAMES[kind], orientation="h", legendgroup=kind, showlegend=False,
            base=np.array([e.start_s - t0 for e in evs]), x=np.array([e.duration_s for e in evs]),
            y=np.array([row_of[e.worker] for e in evs]),
            width=0.8, opacity=style["opacity"],
            marker={"color": np.array([color_key(e, color_by) % ncol for e in evs]), "colorscale": scale,
                    "cmin": -0.5, "cmax": ncol - 0.5, "showscale": False, "line": style["line"],
                    "pattern": {"shape": style["pattern_shape"], "fillmode": "overlay", "fgcolor": "#222",
                                "size": 6, "solidity": 0.25}},
            customdata=np.array([[e.stage, e.microbatch, e.weight_version, e.bytes, e.worker] for e in evs]),
            hovertemplate=(f"<b>%{{customdata[0]}}{kind}%{{customdata[1]}}</b> on w%{{customdata[4]}}<br>"
                           "stage %{customdata[0]}, microbatch %{customdata[1]}, version %{customdata[2]}<br>"
                           "start %{base:.4g}, duration %{x:.4g} " + unit + "<br>%{customdata[3]:,} bytes"
                           "<extra>" + KIND_NAMES[kind] + "</extra>"),
        ))
    transfers = [e for e in trace.events if e.kind not in COMPUTE_KINDS and e.worker in labels]
    if show_transfers and transfers:
        fig.add_trace(go.Bar(
            name="transfer", orientation="h", legendgroup="transfer",
            base=np.array([e.start_s - t0 for e in transfers]), x=np.array([e.duration_s for e in transfers]),
            y=np.array([row_of[e.worker] for e in transfers]), width=0.12, offset=0.42,
            marker={"color": np.array([COMM_COLORS.get(e.kind, TRANSFER_COLOR) for e in transfers],
                                      dtype=object), "line": {"width": 0}},
            text=np.array([e.kind for e in transfers], dtype=object), textposition="none",
            customdata=np.array([[e.stage, e.microbatch, e.peer, e.bytes] for e in transfers]),
            hovertemplate=("<b>%{text}</b> stage %{customdata[0]} microbatch %{customdata[1]} "
                           "peer w%{customdata[2]}<br>%{customdata[3]:,} bytes in %{x:.4g} " + unit
                           + "<extra>transfer</extra>"),
        ))
        for kind in sorted({e.kind for e in transfers} & set(COMM_COLORS)):
            fig.add_trace(go.Bar(name=COMM_NAMES[kind], orientation="h", x=[None], y=[None],
                                 legendgroup="kinds", showlegend=True, hoverinfo="skip",
                                 marker={"color": COMM_COLORS[kind], "line": {"width": 0}}))
    fig.update_layout(meta={"render": "bars"})
    return fig


def _legend(fig: go.Figure, compute: Sequence[Event], color_by: str, raster: bool, *,
            boxed: bool = False) -> None:
    """Legend-only entries: each kind by its pattern on grey (raster: its shading; a raster whose first
    window is drawn as boxes: the pattern, and the shading in the overview), then the colours."""
    kinds = [k for k in COMPUTE_KINDS if any(e.kind == k for e in compute)]
    shading = {"F": "as is", "B": "darker", "W": "lighter", "U": "black"}
    shaded = raster and not boxed          # the legend shows shades, not patterns
    for kind in kinds:
        style = KIND_STYLE[kind]
        name = f"{kind} · {KIND_NAMES[kind]}" + (f" (zoomed out: {shading[kind]})" if boxed
                                                  else f" ({shading[kind]})" if raster else "")
        fig.add_trace(go.Bar(
            name=name, orientation="h", x=[None], y=[None], legendgroup="kinds", showlegend=True,
            hoverinfo="skip", marker={"color": "#000000" if shaded and kind == "U" else KIND_LEGEND_COLOR,
                                      "line": style["line"],
                                      "pattern": {"shape": "" if shaded else style["pattern_shape"],
                                                  "fgcolor": "#222", "size": 6, "solidity": 0.25}}))
    keys = sorted({color_key(e, color_by) for e in compute})
    shown = keys[:LEGEND_COLORS_MAX]
    for k in shown:
        more = len(keys) > len(shown) and k == shown[-1]
        fig.add_trace(go.Bar(
            name=f"{color_by} {k}" + (f" (+{len(keys) - len(shown)} more)" if more else ""),
            orientation="h", x=[None], y=[None], legendgroup="colours", showlegend=True, hoverinfo="skip",
            marker={"color": PALETTE[k % len(PALETTE)], "line": {"width": 0}}))


def action_traces(fig: go.Figure) -> list[Any]:
    """The figure's traces that draw actions or transfers (not the legend-only entries)."""
    return [t for t in fig.data if t.legendgroup not in LEGEND_GROUPS]


def _shade(color: str, toward: tuple[int, int, int], amount: float) -> str:
    """``color`` blended ``amount`` of the way toward the RGB ``toward``."""
    rgb = hex_to_rgb(color) if color.startswith("#") else unlabel_rgb(color)
    r, g, b = (round(c + (t - c) * amount) for c, t in zip(rgb, toward))
    return f"rgb({r}, {g}, {b})"


def raster_colorscale() -> tuple[list[list[Any]], int]:
    """Raster mode's colour scale and its steps: value ``kind_index * len(PALETTE) + k`` paints palette
    colour ``k`` shaded by kind (F as is, B darker, W lighter, U black)."""
    steps = [c if kind == "F" else _shade(c, (0, 0, 0), 0.35) if kind == "B"
             else _shade(c, (255, 255, 255), 0.5) if kind == "W" else "rgb(0, 0, 0)"
             for kind in COMPUTE_KINDS for c in PALETTE]
    n = len(steps)
    return [[pos, c] for k, c in enumerate(steps) for pos in (k / n, (k + 1) / n)], n


def _raster(compute: Sequence[Event], row_of: Mapping[int, int], t0: float, color_by: str,
            unit: str, *, hole: tuple[float, float] | None = None) -> go.Figure:
    """Paint actions on a (worker x time-bin) grid as one heatmap; a bin shows the action at its centre.
    Bins whose centre lies in ``hole`` stay empty (boxes draw that range)."""
    span = max(e.end_s for e in compute) - t0
    shortest = min((e.duration_s for e in compute if e.duration_s > 0), default=span or 1.0)
    width = max(shortest, span / RASTER_MAX_BINS) if span > 0 else 1.0
    bins = max(1, math.ceil(span / width))
    ncol = len(PALETTE)
    kind_index = {k: i for i, k in enumerate(COMPUTE_KINDS)}
    z = np.full((len(row_of), bins), np.nan)
    text = np.full((len(row_of), bins), "", dtype=object)
    centres = (np.arange(bins) + 0.5) * width
    by_row: dict[int, list[Event]] = {}
    for e in compute:
        if e.duration_s > 0:
            by_row.setdefault(row_of[e.worker], []).append(e)
    # a bin centre lies in the row's last action starting at or before it, if that has not ended
    for r, evs in by_row.items():
        evs.sort(key=lambda e: e.start_s)
        starts = np.array([e.start_s - t0 for e in evs])
        ends = np.array([e.end_s - t0 for e in evs])
        idx = np.searchsorted(starts, centres, side="right") - 1
        hit = (idx >= 0) & (centres < ends[np.maximum(idx, 0)])
        values = np.array([kind_index[e.kind] * ncol + color_key(e, color_by) % ncol for e in evs], float)
        labels = np.array([f"{e.action} v{e.weight_version}" for e in evs], dtype=object)
        if hole is not None:
            hit &= (centres < hole[0]) | (centres >= hole[1])
        z[r, hit] = values[idx[hit]]
        text[r, hit] = labels[idx[hit]]
    scale, n = raster_colorscale()
    fig = go.Figure(go.Heatmap(
        z=z, x=centres, y=np.arange(len(row_of)), text=text,
        colorscale=scale, zmin=-0.5, zmax=n - 0.5, showscale=False, ygap=3, hoverongaps=False,
        hovertemplate="%{text} (stage, kind, microbatch; weight version)<br>t = %{x:.4g} " + unit
                      + "<extra></extra>", name="actions"))
    fig.update_layout(meta={"render": "raster", "bin_width": width, "bins": bins})
    return fig
