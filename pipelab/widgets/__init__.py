"""Interactive views for JupyterLab, the only unit that imports ``ipywidgets``.

Each widget is a thin layer over the pure views of :mod:`pipelab.views`: it recomputes a figure from
records and copies its data into a ``plotly`` ``FigureWidget``; without a live front end it shows the
same figures as static HTML (:mod:`pipelab.widgets.display`).

- :class:`LiveGantt` ``(handle)``: fills in as ``handle.events`` arrive, with a status line.
- :class:`ScheduleExplorer` ``()``: method, stages, microbatches, v, K -> Gantt, bubble, memory.
- :class:`PlanExplorer` ``(profile)``: cluster, servers x GPUs, method, memory limit -> partition graph.
- :class:`PlannerExplorer` ``(pl.plan(...))``: the Pareto front; a click draws that candidate.
"""

from __future__ import annotations

from pipelab.widgets.display import live_frontend, show, static_html
from pipelab.widgets.explorers import PlanExplorer, ScheduleExplorer
from pipelab.widgets.live_gantt import LiveGantt
from pipelab.widgets.planner import PlannerExplorer
from pipelab.widgets.sync import json_safe, sync_figure

__all__ = ["LiveGantt", "PlanExplorer", "PlannerExplorer", "ScheduleExplorer", "json_safe", "live_frontend",
           "show", "static_html", "sync_figure"]
