"""Comparisons across methods or plans (throughput, speed-up), and offline HTML for reports."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipelab.partition.plan import Plan
from pipelab.trace import Trace
from pipelab.views.accuracy import compare_traces

if TYPE_CHECKING:
    import pandas as pd


def throughput_of(result: Any) -> float:
    """Samples per second of a SimResult/RunResult (``.throughput``), a Plan (batch / time per
    minibatch) or a number. Raises ``ValueError`` when none is known."""
    if isinstance(result, bool):
        raise TypeError("a bool is not a throughput")
    if isinstance(result, (int, float)):
        value = float(result)
    elif isinstance(result, Plan):
        value = result.batch_size / result.time_per_minibatch if result.time_per_minibatch > 0 else math.nan
    else:
        raw = getattr(result, "throughput", None)
        raw = getattr(result, "samples_per_s", None) if raw is None else raw
        if callable(raw):
            raw = raw()
        if raw is None:
            raise TypeError(f"{type(result).__name__} has no throughput; pass a SimResult, RunResult, Plan "
                            f"or samples/s number")
        value = float(raw)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"throughput {value!r} is not a positive number; a Plan needs predictions "
                         f"(make it with pl.partition), a result needs at least one finished step")
    return value


def compare_table(results: Mapping[str, Any], *, baseline: str | None = None) -> pd.DataFrame:
    """One row per entry: ``throughput`` (samples/s) and ``speedup`` over ``baseline`` (default "dp",
    else the first entry)."""
    import pandas as pd

    if not results:
        raise ValueError("compare() needs at least one result: {name: SimResult | RunResult | Plan}")
    names = list(results)
    base = baseline if baseline is not None else ("dp" if "dp" in results else names[0])
    if base not in results:
        raise ValueError(f"baseline {base!r} is not one of {names}")
    thr = {n: throughput_of(results[n]) for n in names}
    rows = [{"name": n, "throughput": thr[n], "speedup": thr[n] / thr[base], "baseline": n == base}
            for n in names]
    return pd.DataFrame(rows).set_index("name")


def compare(results: Mapping[str, Any] | Any, run: Any = None, /, *, baseline: str | None = None,
            title: str | None = None, **kwargs: Any) -> go.Figure:
    """Throughput and speed-up over ``baseline`` of named results, plans or samples/s numbers.

    ``compare(sim_trace, run_trace)`` is :func:`~pipelab.views.accuracy.compare_traces` (``kwargs`` go
    there): the simulated against the measured Gantt chart.
    """
    if run is not None:
        return compare_traces(results, run, title=title, **kwargs)
    if kwargs:
        raise TypeError(f"compare(results) takes baseline= and title=; {sorted(kwargs)} apply to "
                        f"compare(sim_trace, run_trace) only")
    if isinstance(results, Trace) or isinstance(getattr(results, "trace", None), Trace):
        raise TypeError("compare() got one trace; pass two, compare(sim_trace, run_trace), to see where "
                        "the simulation and the run differ, or a dict {name: result} to compare throughputs")
    df = compare_table(results, baseline=baseline)
    base = str(df.index[df["baseline"]][0])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput (samples/s)", f"speed-up over {base}"))
    names = [str(n) for n in df.index]
    fig.add_trace(go.Bar(x=names, y=df["throughput"].tolist(), name="throughput", marker_color="#1f77b4",
                         text=[f"{v:.4g}" for v in df["throughput"]], textposition="outside",
                         hovertemplate="%{x}: %{y:.4g} samples/s<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=df["speedup"].tolist(), name="speed-up", marker_color="#ff7f0e",
                         text=[f"{v:.2f}×" for v in df["speedup"]], textposition="outside",
                         hovertemplate="%{x}: %{y:.3f}×<extra></extra>"), row=1, col=2)
    fig.add_hline(y=1.0, line={"color": "#555", "dash": "dot"}, row=1, col=2)
    fig.update_layout(title={"text": title or "methods compared"}, showlegend=False, height=420,
                      margin={"l": 10, "r": 10, "t": 80, "b": 40})
    return fig


def to_html(fig: go.Figure, *, include_plotlyjs: bool | str = True, full_html: bool = False) -> str:
    """HTML for ``fig`` that renders offline (plotly.js inlined unless ``include_plotlyjs=False``)."""
    return str(fig.to_html(include_plotlyjs=include_plotlyjs, full_html=full_html))
