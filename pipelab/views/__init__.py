"""Views: pure functions from pipelab records to ``plotly`` figures (no ipywidgets; see widgets).

:func:`gantt` (a trace or schedule), :func:`partition_graph` (profile + plan), :func:`memory` per worker,
:func:`compare` (methods, or simulated against measured), :func:`bubbles` (idle time by cause),
:func:`pareto` (a planner's table), :func:`gantt_groups` (a run whose stages are tensor-parallel
groups: a group per row, or ``expand=True`` a process per row) and :func:`to_html` for offline reports.
"""

from __future__ import annotations

from pipelab.views.accuracy import action_errors, compare_traces, error_summary
from pipelab.views.bubbles import bubbles, pareto, with_critical_path
from pipelab.views.gantt import action_traces, bubble_fraction, gantt, schedule_trace, worker_labels
from pipelab.views.memory import memory, memory_breakdown, schedule_memory
from pipelab.views.partition_graph import partition_graph
from pipelab.views.tables import compare, compare_table, to_html
from pipelab.views.tensor_groups import gantt_groups

__all__ = ["action_errors", "action_traces", "bubble_fraction", "bubbles", "compare", "compare_table",
           "compare_traces", "error_summary", "gantt", "gantt_groups", "memory", "memory_breakdown", "pareto",
           "partition_graph", "schedule_memory", "schedule_trace", "to_html", "with_critical_path",
           "worker_labels"]
