"""Views: pure functions from pipelab records to ``plotly.graph_objects.Figure``.

- :func:`gantt` — one row per worker, one box per action (Trace, Schedule or a result with ``.trace``);
  :func:`schedule_trace` lays a bare schedule out with unit costs, :func:`bubble_fraction` measures idle time
- :func:`partition_graph` — the layer graph coloured by stage (Profile + Plan)
- :func:`memory` — per-worker memory, stacked by component, against the device limit
  (:func:`memory_breakdown` for a plan, :func:`schedule_memory` in units for a bare schedule)
- :func:`compare` — throughput and speed-up across methods or plans; ``compare(sim_trace, run_trace)``
  is :func:`compare_traces`: simulated and measured Gantt charts on one time axis, each action coloured
  by its relative error (:func:`action_errors`, :func:`error_summary` give the numbers)
- :func:`bubbles` — per worker, idle time split into its causes (:func:`pipelab.explain.explain`);
  :func:`with_critical_path` draws the critical path on a Gantt chart; :func:`pareto` a planner's table

Nothing here imports ipywidgets; live, interactive versions live in :mod:`pipelab.widgets`.
:func:`to_html` renders a figure for reports that must work offline.
"""

from __future__ import annotations

from pipelab.views.accuracy import action_errors, compare_traces, error_summary
from pipelab.views.bubbles import bubbles, pareto, with_critical_path
from pipelab.views.gantt import action_traces, bubble_fraction, gantt, schedule_trace, worker_labels
from pipelab.views.memory import memory, memory_breakdown, schedule_memory
from pipelab.views.partition_graph import partition_graph
from pipelab.views.tables import compare, compare_table, to_html

__all__ = ["action_errors", "action_traces", "bubble_fraction", "bubbles", "compare", "compare_table",
           "compare_traces", "error_summary", "gantt", "memory", "memory_breakdown", "pareto",
           "partition_graph", "schedule_memory", "schedule_trace", "to_html", "with_critical_path",
           "worker_labels"]
