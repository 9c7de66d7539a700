"""A Gantt chart of a run whose stages are tensor-parallel groups: one row per group, or one per process.

A run's trace holds each schedule worker's actions once (its group's leader, process rank = worker);
the other members' copies are ``RunResult.member_events`` (worker = their process rank) and
``trace.meta["tensor_groups"]`` lists each worker's process ranks. Collapsed, a group is one row
labelled with its ranks; expanded, each member gets a row of its own under its group's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from pipelab.trace import Event, Trace
from pipelab.views.gantt import gantt, worker_labels


def group_rows(trace: Trace, member_events: Sequence[Event] = (), *,
               expand: bool = False) -> tuple[Trace, dict[int, str]]:
    """The trace to draw and its row labels: collapsed, each worker's row names its group's ranks;
    expanded, the members' events join the trace, each member's row after its leader's."""
    groups = [list(g) for g in trace.meta.get("tensor_groups", [])]
    labels = worker_labels(trace)
    for w, g in enumerate(groups):
        if w in labels and len(g) > 1:
            labels[w] += f" · tensor ranks {', '.join(map(str, g))}"
    if not expand or not member_events:
        return trace, labels
    order: list[int] = []
    for w in sorted(labels):
        order.append(w)
        g = groups[w] if w < len(groups) else [w]
        for i, r in enumerate(g[1:], start=1):
            order.append(r)
            labels[r] = f"  rank {r} · w{w}'s shard {i} of {len(g)}"
    # rows are drawn in worker order: renumber so each member sits right under its leader
    slot = {w: i for i, w in enumerate(order)}
    events = [dataclasses.replace(e, worker=slot[e.worker]) for e in (*trace.events, *member_events)
              if e.worker in slot]
    meta = {k: v for k, v in trace.meta.items() if k != "stage_ranks"}
    return Trace.from_events(events, **meta), {slot[w]: labels[w] for w in order}


def gantt_groups(result: Any, *, expand: bool = False, **kw: Any) -> go.Figure:
    """:func:`~pipelab.views.gantt` of a run with tensor groups: one row per group (``expand=False``) or
    one per process (``expand=True``); ``kw`` as ``gantt``'s."""
    trace = result.trace if hasattr(result, "trace") else result
    members = getattr(result, "member_events", ())
    drawn, labels = group_rows(trace, members, expand=expand)
    fig = gantt(drawn, **kw)
    rows = [labels[w] for w in sorted(labels)]
    fig.update_yaxes(tickvals=list(range(len(rows))), ticktext=rows)
    return fig
