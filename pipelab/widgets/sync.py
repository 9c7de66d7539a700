"""Copying a figure into a live ``FigureWidget``: in place where the traces match, as strict JSON."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go


def json_safe(fig: go.Figure) -> go.Figure:
    """``fig`` with every NaN or infinity in its traces' data replaced by None, in place (a widget's
    messages are strict JSON, and a raster Gantt's empty cells are NaN)."""
    for t in fig.data:
        for name, value in t.to_plotly_json().items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
                safe = value.astype(object)
                safe[~np.isfinite(value)] = None
                t[name] = safe
            elif isinstance(value, (list, tuple)) and any(
                    isinstance(v, float) and not math.isfinite(v) for v in value):
                t[name] = [None if isinstance(v, float) and not math.isfinite(v) else v for v in value]
    return fig


def sync_figure(target: go.FigureWidget, fig: go.Figure) -> None:
    """Make ``target`` show ``fig``: one batched update when the traces match by name, else a rebuild.
    Non-finite numbers go as None (:func:`json_safe`)."""
    fig = json_safe(fig)
    if [t.name for t in target.data] != [t.name for t in fig.data]:
        with target.batch_update():
            target.data = ()
            target.layout = fig.layout
        target.add_traces(list(fig.data))
        return
    with target.batch_update():
        for dst, src in zip(target.data, fig.data):
            dst.update(src.to_plotly_json(), overwrite=True)
        target.layout = fig.layout
