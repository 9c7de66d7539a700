"""Explorers: a schedule, or a partition, redrawn as the user moves the controls."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

import pipelab.methods as methods
from pipelab.cluster import Cluster
from pipelab.partition import METHODS, partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules import build as build_schedule
from pipelab.views import gantt, memory, partition_graph
from pipelab.widgets.display import Displayable, ipywidgets, live_frontend
from pipelab.widgets.sync import sync_figure


class _Explorer(Displayable):
    """Shared control handling of the explorers: ``values`` mirror ``controls``; ``redraw`` on change."""

    live: bool
    values: dict[str, Any]
    controls: dict[str, Any]
    info: Any
    message: str

    def redraw(self) -> None:  # pragma: no cover - every explorer defines its own
        raise NotImplementedError

    def _on_change(self, change: dict[str, Any]) -> None:
        self.values.update({k: c.value for k, c in self.controls.items()})
        self.redraw()

    def _observe(self, controls: dict[str, Any]) -> None:
        """Take ``controls`` and an info line, and redraw whenever a control changes."""
        self.controls, self.info = controls, ipywidgets().HTML()
        for c in controls.values():
            c.observe(self._on_change, names="value")

    def _fail(self, message: str) -> None:
        """Show why the figures could not be redrawn; the old ones stay."""
        self.message = message
        if self.live:
            self.info.value = f"<span style='color:#b00'>{html.escape(message)}</span>"

    def set(self, **values: Any) -> None:
        """Change controls programmatically (as a user would) and redraw."""
        unknown = set(values) - set(self.values)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; controls are {sorted(self.values)}")
        if self.live:
            for k, v in values.items():   # each assignment fires the observer (and a redraw)
                self.controls[k].value = v
        else:
            self.values.update(values)
            self.redraw()


class ScheduleExplorer(_Explorer):
    """Pick a method and a pipeline shape; see its schedule laid out with unit costs, bubble and memory.

    Controls: method, stages P, microbatches M (minibatches for per-microbatch methods), v (virtual
    stages per worker, interleaved-1f1b) and K (weight versions, buffered).
    """

    def __init__(self, *, method: str = "1f1b-flush", stages: int = 4, microbatches: int = 8, v: int = 2,
                 K: int = 2, live: bool | None = None) -> None:
        self._methods = list(methods.names())
        methods.get(method)     # an unknown method: the registry's error
        self.live = live_frontend() if live is None else bool(live)
        self.values: dict[str, Any] = {"method": method, "stages": stages, "microbatches": microbatches,
                                       "v": v, "K": K}
        self.message = ""
        self.schedule: Any = None
        self.gantt_figure: go.Figure = go.Figure()
        self.memory_figure: go.Figure = go.Figure()
        if self.live:
            w = ipywidgets()
            style = {"description_width": "initial"}
            self._observe({
                "method": w.Dropdown(options=self._methods, value=method, description="method"),
                "stages": w.IntSlider(value=stages, min=1, max=16, description="stages P", style=style),
                "microbatches": w.IntSlider(value=microbatches, min=1, max=64, description="microbatches M",
                                            style=style),
                "v": w.IntSlider(value=v, min=1, max=4, description="v (chunks)", style=style),
                "K": w.IntSlider(value=K, min=2, max=6, description="K (versions)", style=style)})
            self.gantt_figure, self.memory_figure = go.FigureWidget(), go.FigureWidget()
            self.widget = w.VBox([w.HBox([self.controls["method"], self.controls["stages"],
                                          self.controls["microbatches"]]),
                                  w.HBox([self.controls["v"], self.controls["K"], self.info]),
                                  self.gantt_figure, self.memory_figure])
        self.redraw()

    def build(self) -> Any:
        """The schedule for the current control values."""
        m, P, M = self.values["method"], int(self.values["stages"]), int(self.values["microbatches"])
        spec = methods.get(m)
        takes = {o.name for o in spec.options}
        opts = {k: int(self.values[c]) for k, c in (("chunks", "v"), ("versions", "K")) if k in takes}
        plan: Any = P
        if spec.order == "dp":
            plan = Plan.from_boundaries(max(P, 2), [], replicas=[P])
        elif not spec.replicas_allreduce and P >= 2:   # HetPipe: two virtual workers of P stages
            plan = Plan.from_boundaries(2 * P, [P], replicas=[2, 2])
        count = "minibatches" if spec.update == "microbatch" else "microbatches"
        return build_schedule(m, plan, **{count: M}, **opts)

    def redraw(self) -> None:
        """Rebuild the schedule and both figures; a bad combination shows its error, keeps the old figures."""
        if self.live:
            takes = {o.name for o in methods.get(self.values["method"]).options}
            self.controls["v"].disabled = "chunks" not in takes
            self.controls["K"].disabled = "versions" not in takes
        try:
            sched = self.build()
            v = self.values
            g = gantt(sched, title=f"{sched.method}: P={v['stages']} M={v['microbatches']}")
            mem = memory(sched)
        except (ValueError, TypeError) as exc:
            self._fail(f"cannot draw: {exc}")
            return
        self.schedule = sched
        bub = g.layout.meta["bubble_fraction"]
        self.message = f"{len(sched)} actions on {sched.num_workers} workers, bubble {bub:.1%}"
        if self.live:
            sync_figure(self.gantt_figure, g)
            sync_figure(self.memory_figure, mem)
            self.info.value = html.escape(self.message)
        else:
            self.gantt_figure, self.memory_figure = g, mem

    def static_figures(self) -> list[go.Figure]:
        """The Gantt and memory figures for the current values."""
        return [go.Figure(self.gantt_figure), go.Figure(self.memory_figure)]

    def static_text(self) -> list[str]:
        """The summary line."""
        return [html.escape(self.message)]


class PlanExplorer(_Explorer):
    """Partition ``profile`` with :func:`pipelab.partition` for a cluster and method of your choice.

    Controls: cluster preset, servers, GPUs per server, partitioning method, memory limit per device
    (GB, 0 = the device's own). Shows the partition graph, the config string and the predicted speed-up
    over data parallel. ``choices`` narrows the dropdowns: ``{"preset": [...], "method": [...]}``.
    """

    def __init__(self, profile: Any, *, preset: str = "pipedream-a", servers: int = 2,
                 gpus_per_server: int = 2, method: str = "pipedream", memory_limit_gb: float = 0.0,
                 live: bool | None = None, choices: Mapping[str, Iterable[str]] | None = None) -> None:
        if not isinstance(profile, Profile):
            raise TypeError(f"PlanExplorer needs a pl.Profile; got {type(profile).__name__}")
        choices = dict(choices or {})
        unknown = set(choices) - {"preset", "method"}
        if unknown:
            raise ValueError(f"choices {sorted(unknown)}: only 'preset' and 'method' have dropdowns")
        self.profile = profile
        self.presets = list(choices.get("preset", Cluster.presets()))
        self.methods = list(choices.get("method", METHODS))
        self.live = live_frontend() if live is None else bool(live)
        self.values: dict[str, Any] = {"preset": preset, "servers": servers, "method": method,
                                       "gpus_per_server": gpus_per_server, "memory_limit_gb": memory_limit_gb}
        self.plan: Any = None
        self.message = ""
        self.figure: go.Figure = go.Figure()
        if self.live:
            w = ipywidgets()
            style = {"description_width": "initial"}
            self._observe({
                "preset": w.Dropdown(options=self.presets, value=preset, description="cluster"),
                "servers": w.IntSlider(value=servers, min=1, max=16, description="servers", style=style),
                "gpus_per_server": w.IntSlider(value=gpus_per_server, min=1, max=16,
                                               description="GPUs/server", style=style),
                "method": w.Dropdown(options=self.methods, value=method, description="method"),
                "memory_limit_gb": w.BoundedFloatText(value=memory_limit_gb, min=0.0, max=1024.0, step=1.0,
                                                      description="memory limit GB (0 = device)", style=style)
            })
            self.figure = go.FigureWidget()
            self.widget = w.VBox([w.HBox([self.controls["preset"], self.controls["servers"],
                                          self.controls["gpus_per_server"]]),
                                  w.HBox([self.controls["method"], self.controls["memory_limit_gb"]]),
                                  self.info, self.figure])
        self.redraw()

    def make_plan(self) -> Plan:
        """Partition the profile for the current control values."""
        v = self.values
        cluster = Cluster.preset(v["preset"], servers=int(v["servers"]),
                                 gpus_per_server=int(v["gpus_per_server"]))
        gb = float(v["memory_limit_gb"])
        kw: dict[str, Any] = {"memory_limit": gb * 1e9} if gb else {}
        return partition(self.profile, cluster, method=v["method"], **kw)

    def redraw(self) -> None:
        """Partition again and redraw; an infeasible choice shows its error and keeps the old figure."""
        try:
            plan = self.make_plan()
            fig = partition_graph(self.profile, plan)
        except (ValueError, TypeError, ImportError) as exc:
            self._fail(f"cannot partition: {exc}")
            return
        self.plan = plan
        speed = plan.speedup_over_dp
        self.message = (f"config <b>{html.escape(plan.config)}</b> · {plan.num_stages} stages on "
                        f"{plan.num_workers} workers · predicted speed-up over DP "
                        + (f"<b>{speed:.2f}×</b>" if speed == speed else "n/a"))
        if self.live:
            sync_figure(self.figure, fig)
            self.info.value = self.message
        else:
            self.figure = fig

    def static_figures(self) -> list[go.Figure]:
        """The partition graph for the current values."""
        return [go.Figure(self.figure)]

    def static_text(self) -> list[str]:
        """The config / speed-up line."""
        return [self.message]
