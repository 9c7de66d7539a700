"""Simulated against measured: both Gantt charts of one schedule on one time axis, each action
coloured by ``(measured - simulated) / simulated`` of its duration (red: slower than predicted).

Actions pair up by (worker, stage, kind, microbatch, occurrence). ``layout="rows"`` puts each worker's
measured row under its simulated one; ``"panels"`` draws all simulated rows, then all measured ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from pipelab.trace import COMPUTE_KINDS, Event, Trace
from pipelab.views.gantt import KIND_NAMES, KIND_STYLE, _as_trace, rows_layout, worker_labels

if TYPE_CHECKING:
    import pandas as pd

ERROR_SCALE = "RdBu_r"
#: the colour scale's default half-range: the largest |relative error|, capped here
ERROR_CAP = 1.0
NO_ESTIMATE_COLOR = "#bbbbbb"
LAYOUTS = ("rows", "panels")

Pair = tuple[Event, Event, float]


def _key_events(trace: Trace) -> dict[tuple[int, int, str, int, int], Event]:
    """Compute events keyed by (worker, stage, kind, microbatch, occurrence), in execution order."""
    out: dict[tuple[int, int, str, int, int], Event] = {}
    seen: dict[tuple[int, int, str, int], int] = {}
    for e in sorted(trace.compute_events(), key=lambda e: (e.worker, e.step, e.start_s)):
        k = (e.worker, e.stage, e.kind, e.microbatch)
        n = seen.get(k, 0)
        seen[k] = n + 1
        out[(*k, n)] = e
    return out


def match_actions(sim: Any, run: Any) -> list[Pair]:
    """``(sim_event, run_event, relative_error)`` per action (error NaN where simulated is 0);
    ``ValueError`` names the first difference when the two ran different schedules."""
    st, rt = _trace_of(sim, "sim"), _trace_of(run, "run")
    a, b = st.actions_by_worker(), rt.actions_by_worker()
    if not a:
        raise ValueError("the simulated trace has no actions (F/B/W/U) to compare")
    if a != b:
        raise ValueError(f"the traces ran different schedules: {_first_difference(a, b)}; compare a "
                         f"simulation and a run of the same schedule (same method, plan, microbatches "
                         f"and steps), e.g. pl.simulate(...).trace against pl.train(...).trace")
    kr = _key_events(rt)
    return [(es, kr[k], (kr[k].duration_s - es.duration_s) / es.duration_s if es.duration_s > 0 else math.nan)
            for k, es in _key_events(st).items()]


def _trace_of(source: Any, which: str) -> Trace:
    try:
        return _as_trace(source, None)[0]
    except TypeError:
        raise TypeError(f"compare(sim_trace, run_trace) takes Traces or results with .trace; the {which} "
                        f"argument is a {type(source).__name__}") from None


def _first_difference(a: dict[int, list[str]], b: dict[int, list[str]]) -> str:
    if sorted(a) != sorted(b):
        return f"workers {sorted(a)} were simulated, {sorted(b)} measured"
    for w in sorted(a):
        for i, (x, y) in enumerate(zip(a[w], b[w])):
            if x != y:
                return f"worker {w}'s action {i} is {x} in the simulated trace and {y} in the measured one"
        if len(a[w]) != len(b[w]):
            return f"worker {w} has {len(a[w])} simulated actions and {len(b[w])} measured ones"
    return "their action lists differ"   # pragma: no cover - a != b implies one of the above


def action_errors(sim: Any, run: Any) -> pd.DataFrame:
    """One row per action: worker, stage, kind, microbatch, ``sim_s``, ``run_s``, ``rel_error``."""
    import pandas as pd

    return pd.DataFrame([{"worker": s.worker, "stage": s.stage, "kind": s.kind, "microbatch": s.microbatch,
                          "action": s.action, "sim_s": s.duration_s, "run_s": r.duration_s, "rel_error": err}
                         for s, r, err in match_actions(sim, run)])


def error_summary(sim: Any, run: Any) -> dict[str, pd.DataFrame]:
    """``"by_kind"``: actions, median relative error and total seconds per kind; ``"by_worker"``:
    simulated and measured busy time per worker and its relative error."""
    import pandas as pd

    df = action_errors(sim, run)
    by_kind = (df.groupby("kind", sort=False)
               .agg(actions=("action", "size"), median_rel_error=("rel_error", "median"),
                    sim_s=("sim_s", "sum"), run_s=("run_s", "sum")))
    by_kind = by_kind.reindex([k for k in COMPUTE_KINDS if k in by_kind.index])
    sb, rb = _trace_of(sim, "sim").busy_time(), _trace_of(run, "run").busy_time()
    by_worker = pd.DataFrame(
        [{"worker": w, "sim_busy_s": sb[w], "run_busy_s": rb.get(w, 0.0),
          "busy_rel_error": (rb.get(w, 0.0) - sb[w]) / sb[w] if sb[w] > 0 else math.nan} for w in sorted(sb)]
    ).set_index("worker")
    return {"by_kind": by_kind, "by_worker": by_worker}


def _fmt(err: float) -> str:
    return "n/a" if math.isnan(err) else f"{err:+.0%}"


def compare_traces(sim: Any, run: Any, *, layout: str = "rows", error_range: float | None = None,
                   title: str | None = None) -> go.Figure:
    """The simulated and the measured Gantt chart on one time axis, coloured by relative error.

    Args:
        layout: ``"rows"`` or ``"panels"`` (module doc).
        error_range: the colour scale's half-range (default: the largest |error|, at most
            :data:`ERROR_CAP`); actions the simulator gave no time are grey.

    The title and ``fig.layout.meta`` carry :func:`error_summary`. Raises ``ValueError`` when the traces
    ran different schedules.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; use one of {LAYOUTS}")
    if error_range is not None and not error_range > 0:
        raise ValueError(f"error_range={error_range} must be > 0 (the colour scale's half-range)")
    pairs = match_actions(sim, run)
    summary = error_summary(sim, run)
    st, rt = _trace_of(sim, "sim"), _trace_of(run, "run")
    labels = worker_labels(st)
    row = _rows(sorted(labels), layout)
    ticks = sorted(row.items(), key=lambda kv: kv[1])
    ticktext = [f"{labels[w]} · {'measured' if side else 'simulated'}" for (w, side), _ in ticks]
    finite = [abs(e) for _, _, e in pairs if not math.isnan(e)]
    half = error_range or max(min(max(finite, default=0.0), ERROR_CAP), 0.05)
    t0s = (min(e.start_s for e in st.compute_events()), min(e.start_s for e in rt.compute_events()))

    fig = go.Figure()
    for kind in COMPUTE_KINDS:
        mine = [p for p in pairs if p[0].kind == kind]
        for estimated in (True, False):
            group = [p for p in mine if math.isnan(p[2]) != estimated]
            if group:
                fig.add_trace(_error_bars(group, kind, row, t0s, estimated))
    by_kind, by_worker = summary["by_kind"], summary["by_worker"]
    head = title or f"{st.meta.get('method', '') or 'pipeline'}: simulated against measured"
    kinds_txt = ", ".join(f"{k} {_fmt(float(v))}" for k, v in by_kind["median_rel_error"].items())
    busy_txt = ", ".join(f"w{w} {_fmt(float(v))}" for w, v in by_worker["busy_rel_error"].items())
    fig.update_layout(
        title={"text": f"{head}<br><sup>median duration error per kind: {kinds_txt} · busy time: "
                       f"{busy_txt} · makespan {st.makespan:.4g} s simulated, {rt.makespan:.4g} s "
                       f"measured</sup>"},
        coloraxis={"colorscale": ERROR_SCALE, "cmid": 0.0, "cmin": -half, "cmax": half,
                   "colorbar": {"title": {"text": "(measured − simulated)<br>/ simulated"},
                                "tickformat": "+.0%"}},
        xaxis={"title": {"text": "time (s) from each trace's first action"}, "rangemode": "tozero"},
        **rows_layout(ticktext, top=90, base=160, tickvals=[r for _, r in ticks]),
        meta={"layout": layout, "error_range": half, "boxes": 2 * len(pairs),
              "median_rel_error": {str(k): float(v) for k, v in by_kind["median_rel_error"].items()},
              "busy_rel_error": {str(w): float(v) for w, v in by_worker["busy_rel_error"].items()}},
    )
    if layout == "panels":
        fig.add_hline(y=len(labels), line={"color": "#888", "dash": "dot", "width": 1})
    return fig


def _rows(workers: list[int], layout: str) -> dict[tuple[int, int], int]:
    """The y row of each (worker, side), side 0 simulated and 1 measured; "panels" leaves a gap row."""
    n = len(workers)
    return {(w, side): 2 * i + side if layout == "rows" else side * (n + 1) + i
            for i, w in enumerate(workers) for side in (0, 1)}


def _error_bars(group: list[Pair], kind: str, row: dict[tuple[int, int], int], t0s: tuple[float, float],
                estimated: bool) -> go.Bar:
    """One horizontal bar trace: both boxes (simulated row, measured row) of each action in ``group``."""
    boxes = [(side, p) for p in group for side in (0, 1)]
    ev = [p[1] if side else p[0] for side, p in boxes]
    style = KIND_STYLE[kind]
    marker: dict[str, Any] = {
        "line": style["line"],
        "color": np.array([p[2] for _, p in boxes]) if estimated else NO_ESTIMATE_COLOR,
        "pattern": {"shape": style["pattern_shape"], "fillmode": "overlay", "fgcolor": "#222", "size": 6,
                    "solidity": 0.25}, **({"coloraxis": "coloraxis"} if estimated else {})}
    side_names = ("simulated", "measured")
    return go.Bar(
        name=KIND_NAMES[kind] + ("" if estimated else " (no simulated time)"), orientation="h",
        legendgroup=kind, opacity=style["opacity"], width=0.8, marker=marker,
        base=np.array([e.start_s - t0s[side] for (side, _), e in zip(boxes, ev, strict=True)]),
        x=np.array([e.duration_s for e in ev]),
        y=np.array([row[(e.worker, side)] for (side, _), e in zip(boxes, ev, strict=True)]),
        customdata=np.array([[p[0].action, p[0].worker, side_names[side], p[0].duration_s * 1e3,
                              p[1].duration_s * 1e3, _fmt(p[2])] for side, p in boxes], dtype=object),
        hovertemplate=("<b>%{customdata[0]}</b> on w%{customdata[1]} (%{customdata[2]} row)<br>"
                       "simulated %{customdata[3]:.4g} ms, measured %{customdata[4]:.4g} ms<br>"
                       "relative error %{customdata[5]}<extra>" + KIND_NAMES[kind] + "</extra>"),
    )
