"""Interactive views for JupyterLab: a live Gantt of a running job and three explorers.

The only unit that imports ``ipywidgets``. Each widget is a thin layer over the pure views in
:mod:`pipelab.views`: it recomputes a figure from records and copies the figure's data into a
``plotly.graph_objects.FigureWidget`` (plotly >= 6 needs ``anywidget`` for that).

Where no live front end exists (papermill, nbconvert: ``JPY_SESSION_NAME`` is set by jupyter_server
for the kernels it starts and by nothing else; or ``anywidget`` is missing), every widget displays
as a static figure instead, rendered to HTML with plotly.js inlined the first time in the kernel
only, so an HTML report renders offline and stays a sensible size.

- :class:`LiveGantt` ``(handle)``: fills in as ``handle.events`` arrive (background thread, a few
  redraws per second), with a status line (step, samples/s, loss).
- :class:`ScheduleExplorer` ``()``: method, stages, microbatches, v, K -> Gantt, bubble, memory.
- :class:`PlanExplorer` ``(profile)``: cluster preset, servers x GPUs, method, memory limit ->
  partition graph, config string, predicted speed-up over data parallel.
- :class:`PlannerExplorer` ``(pl.plan(...))`` (:mod:`pipelab.widgets.planner`): the planner's Pareto
  front as a scatter; a click draws that candidate's Gantt chart with its critical path, its memory
  per worker and its bubble breakdown.
"""

from __future__ import annotations

import html
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import plotly.graph_objects as go

import pipelab.methods as methods
from pipelab.cluster import Cluster
from pipelab.partition import METHODS, partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules import build as build_schedule
from pipelab.trace import Event, Trace
from pipelab.views import gantt, memory, partition_graph, to_html
from pipelab.widgets.sync import json_safe, sync_figure

_PLOTLYJS_FLAG = "_pipelab_plotlyjs_included"


# ---------------------------------------------------------------------------- live or static
def live_frontend() -> bool:
    """True when a JupyterLab/Notebook front end runs this kernel and FigureWidget can render.

    jupyter_server sets ``JPY_SESSION_NAME`` for kernels it starts; papermill and nbconvert do not.
    """
    return "JPY_SESSION_NAME" in os.environ and importlib.util.find_spec("anywidget") is not None


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with ipykernel
        return None
    return get_ipython()


def static_html(fig: go.Figure) -> str:
    """HTML for a report: plotly.js inlined on the first figure of this kernel, referenced after.

    Outside IPython every call inlines plotly.js (each HTML is then self-contained).
    """
    shell = _shell()
    first = shell is None or not getattr(shell, _PLOTLYJS_FLAG, False)
    if shell is not None:
        setattr(shell, _PLOTLYJS_FLAG, True)
    return to_html(fig, include_plotlyjs=bool(first))


def show(fig: go.Figure, *, live: bool | None = None) -> None:
    """Display a figure that will not change: with a live front end as plotly's own MIME bundle (drawn
    by JupyterLab's plotly extension; no widget comm, so a 65k-action Gantt arrives quickly), else as
    offline HTML (see the module doc)."""
    import plotly.io as pio
    from IPython.display import HTML, display

    if live if live is not None else live_frontend():
        pio.show(fig, renderer="plotly_mimetype")
    else:
        display(HTML(static_html(fig)))


class _Displayable:
    """Shared display logic: the widget box when live, else :meth:`static_figures` as offline HTML."""

    live: bool
    widget: Any

    def static_figures(self) -> list[go.Figure]:
        """The figures to show without a live front end."""
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        if self.live:
            display(self.widget)
        else:
            for text in self.static_text():
                display(HTML(text))
            for fig in self.static_figures():
                display(HTML(static_html(fig)))

    def static_text(self) -> list[str]:
        """HTML lines shown above the static figures."""
        return []


def _widgets() -> Any:
    import ipywidgets

    return ipywidgets


# ---------------------------------------------------------------------------- LiveGantt
class LiveGantt(_Displayable):
    """A Gantt chart that fills in while a job runs.

    ``handle`` is what :func:`pipelab.launch` returns (anything with an ``events`` iterable of
    :class:`~pipelab.trace.Event` that ends when the job ends; optional ``job.batch_size`` /
    ``batch_size`` and ``losses`` for the status line, and ``wait()``, whose result's ``losses`` give the
    final loss; a failed job's error is shown in the status line, not raised in the thread). A background
    thread consumes the events and redraws at most ``hz``
    times per second, so a fast job costs a few updates, not one per event. A redraw rebuilds the
    chart from every event so far, so its cost grows with the run: after one that took ``c`` CPU
    seconds the next waits ``c / cpu_share`` seconds, but no longer than the time budget ``interval``
    (or ``3 c`` where that is longer), so that a run of a few seconds still shows its progress; the last
    redraw follows the last event. (On a 2-core machine, redrawing a 3,500-action chart 4 times a second
    took a fifth of a core and slowed the run by 25-55%; ``reproductions/benchmarks/live_trace_cost.py``.)
    Without a live front end the display waits for the job to end and shows the finished chart.
    """

    def __init__(
        self,
        handle: Any,
        *,
        hz: float = 4.0,
        live: bool | None = None,
        color_by: str = "microbatch",
        title: str | None = None,
        start: bool = True,
        cpu_share: float = 0.02,
        interval: float = 1.0,
    ) -> None:
        if not hasattr(handle, "events"):
            raise TypeError(
                f"LiveGantt needs a job handle with .events (from pl.launch); got {type(handle).__name__}"
            )
        if not hz > 0:
            raise ValueError(f"hz={hz} must be > 0 (redraws per second)")
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share={cpu_share} must be in (0, 1] (the share of time spent redrawing)")
        self.handle = handle
        self.hz = float(hz)
        self.cpu_share = float(cpu_share)
        if not interval > 0:
            raise ValueError(f"interval={interval} must be > 0 seconds (the longest wait between redraws)")
        self.interval = float(interval)
        self.redraw_cpu_s = 0.0
        self.color_by = color_by
        self.title = title
        self.live = live_frontend() if live is None else bool(live)
        self.events: list[Event] = []
        self.redraws = 0
        self.error: BaseException | None = None
        self.result: Any = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None
        self._started = False
        self._ended = False
        self.figure: go.Figure = go.FigureWidget() if self.live else go.Figure()
        if self.live:
            w = _widgets()
            self.status = w.HTML(value="waiting for the first events…")
            self.widget = w.VBox([self.status, self.figure])
            self.figure.update_layout(height=300, title={"text": title or "pipeline (starting)"})
            if start:
                self.start()

    # -------------------------------------------------------------- consuming
    def start(self) -> None:
        """Start the background thread that consumes ``handle.events`` (idempotent)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self._thread = threading.Thread(target=self._consume, name="pipelab-live-gantt", daemon=True)
        self._thread.start()

    def _consume(self) -> None:
        period = 1.0 / self.hz
        next_at = 0.0
        try:
            for ev in self.handle.events:
                with self._lock:
                    self.events.append(ev)
                now = time.monotonic()
                if self.live and now >= next_at:
                    cpu = time.thread_time()
                    self.refresh()
                    spent = time.thread_time() - cpu
                    self.redraw_cpu_s += spent
                    budget = min(spent / self.cpu_share, max(self.interval, 3 * spent))
                    next_at = time.monotonic() + max(period, budget)
            wait = getattr(self.handle, "wait", None)
            if callable(wait):          # the finished run's result carries the losses
                self.result = wait()
        except BaseException as exc:  # shown in the status line; the kernel must not die with the job
            self.error = exc
        finally:
            self._ended = True          # before the last redraw, so its status line says so
            if self.live:
                self.refresh()
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the job's event stream ends (and the last redraw is done); True if it did.

        If nothing consumes the stream yet (static mode), consume it here, in the caller's thread.
        """
        with self._lock:
            mine = not self._started
            self._started = True
        if mine:
            self._consume()
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        """Whether the event stream has ended."""
        return self._done.is_set()

    # -------------------------------------------------------------- drawing
    def trace(self) -> Trace:
        """The events received so far, as a Trace."""
        with self._lock:
            evs = list(self.events)
        return Trace.from_events(evs)

    def status_text(self) -> str:
        """``step N · X samples/s · loss L · E events`` from what has arrived so far."""
        with self._lock:
            evs = list(self.events)
        steps = len({e.microbatch for e in evs if e.kind == "U" and e.stage == 0})
        elapsed = max((e.end_s for e in evs), default=0.0) - min((e.start_s for e in evs), default=0.0)
        batch = next((b for b in (getattr(self.handle, "batch_size", None),
                                  getattr(getattr(self.handle, "job", None), "batch_size", None)) if b), None)
        parts = [f"step {steps}"]
        if steps and elapsed > 0:
            parts.append(
                f"{steps * batch / elapsed:.1f} samples/s" if batch else f"{steps / elapsed:.2f} steps/s"
            )
        loss = _last_loss(self.result) if self.result is not None else _last_loss(self.handle)
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        parts.append(f"{len(evs)} events")
        if self._ended:
            parts.append(
                "finished" if self.error is None else f"stopped: {type(self.error).__name__}: {self.error}"
            )
        return " · ".join(parts)

    def current_figure(self) -> go.Figure | None:
        """The Gantt of the events so far (None until the first action has arrived)."""
        trace = self.trace()
        if not trace.compute_events():
            return None
        return gantt(trace, color_by=self.color_by, title=self.title)

    def refresh(self) -> None:
        """Redraw the widget from the events received so far (called by the consumer thread)."""
        fig = self.current_figure()
        if fig is not None and isinstance(self.figure, go.FigureWidget):
            sync_figure(self.figure, fig)
            self.redraws += 1
        if self.live:
            self.status.value = f"<code>{html.escape(self.status_text())}</code>"

    def static_figures(self) -> list[go.Figure]:
        """Waits for the job to end, then the finished chart."""
        self.join()
        fig = self.current_figure()
        if fig is None:
            raise ValueError(f"the job produced no actions to draw ({self.status_text()})")
        return [fig]

    def static_text(self) -> list[str]:
        """The final status line."""
        self.join()
        return [f"<code>{html.escape(self.status_text())}</code>"]


def _last_loss(handle: Any) -> float | None:
    losses = getattr(handle, "losses", None)
    if callable(losses):
        losses = losses()
    try:
        if isinstance(losses, dict):
            losses = [v for _, v in sorted(losses.items())]
        if losses:
            last = list(losses)[-1]
            return float(last[-1] if isinstance(last, (list, tuple)) else last)
    except (TypeError, ValueError):
        return None
    loss = getattr(handle, "loss", None)
    return float(loss) if isinstance(loss, (int, float)) else None


# ---------------------------------------------------------------------------- ScheduleExplorer
class _Explorer(_Displayable):
    """Shared control handling of the explorers: ``values`` mirror ``controls``; ``redraw`` on change."""

    live: bool
    values: dict[str, Any]
    controls: dict[str, Any]

    def redraw(self) -> None:  # pragma: no cover - every explorer defines its own
        raise NotImplementedError

    def _on_change(self, change: dict[str, Any]) -> None:
        for k, c in self.controls.items():
            self.values[k] = c.value
        self.redraw()

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

    Controls: method, stages P, microbatches M (minibatches for the methods that treat every
    microbatch as a minibatch), v (virtual stages per worker, interleaved-1f1b), K (weight versions,
    buffered). Every change rebuilds the schedule with :func:`pipelab.schedules.build`, lays it out
    with the simulator's unit costs (F=1, B=2; F=B=W=1 when split) and redraws both figures.
    """

    def __init__(self, *, method: str = "1f1b-flush", stages: int = 4, microbatches: int = 8, v: int = 2,
                 K: int = 2, live: bool | None = None) -> None:
        self._methods = list(methods.names())
        methods.get(method)     # an unknown method: the registry's error, listing the valid ones
        self.live = live_frontend() if live is None else bool(live)
        self.values: dict[str, Any] = {"method": method, "stages": stages, "microbatches": microbatches,
                                       "v": v, "K": K}
        self.message = ""
        self.schedule: Any = None
        self.gantt_figure: go.Figure = go.Figure()
        self.memory_figure: go.Figure = go.Figure()
        if self.live:
            w = _widgets()
            style = {"description_width": "initial"}
            self.controls = {
                "method": w.Dropdown(options=self._methods, value=method, description="method"),
                "stages": w.IntSlider(value=stages, min=1, max=16, description="stages P", style=style),
                "microbatches": w.IntSlider(value=microbatches, min=1, max=64, description="microbatches M",
                                            style=style),
                "v": w.IntSlider(value=v, min=1, max=4, description="v (chunks)", style=style),
                "K": w.IntSlider(value=K, min=2, max=6, description="K (versions)", style=style),
            }
            self.info = w.HTML()
            self.gantt_figure = go.FigureWidget()
            self.memory_figure = go.FigureWidget()
            for c in self.controls.values():
                c.observe(self._on_change, names="value")
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
        opts: dict[str, Any] = {}
        if "chunks" in takes:
            opts["chunks"] = int(self.values["v"])
        if "versions" in takes:
            opts["versions"] = int(self.values["K"])
        plan: Any = P
        if spec.order == "dp":
            plan = Plan.from_boundaries(max(P, 2), [], replicas=[P])
        elif not spec.replicas_allreduce and P >= 2:   # HetPipe: two virtual workers of P stages
            plan = Plan.from_boundaries(2 * P, [P], replicas=[2, 2])
        if spec.update == "microbatch":
            return build_schedule(m, plan, minibatches=M, **opts)
        return build_schedule(m, plan, microbatches=M, **opts)

    def redraw(self) -> None:
        """Rebuild the schedule and both figures; a bad combination shows its error, keeps the old figures."""
        if self.live:
            takes = {o.name for o in methods.get(self.values["method"]).options}
            self.controls["v"].disabled = "chunks" not in takes
            self.controls["K"].disabled = "versions" not in takes
        try:
            sched = self.build()
            g = gantt(
                sched, title=f"{sched.method}: P={self.values['stages']} M={self.values['microbatches']}"
            )
            mem = memory(sched)
        except (ValueError, TypeError) as exc:
            self.message = f"cannot draw: {exc}"
            if self.live:
                self.info.value = f"<span style='color:#b00'>{html.escape(self.message)}</span>"
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


# ---------------------------------------------------------------------------- PlanExplorer
class PlanExplorer(_Explorer):
    """Partition ``profile`` for a cluster and method of your choice and see the plan.

    Controls: cluster preset, servers, GPUs per server, partitioning method, memory limit per device
    (GB, 0 = the device's own). Output: the partition graph, the config string (paper notation) and
    the predicted speed-up over data parallel, from :func:`pipelab.partition`.
    """

    def __init__(
        self,
        profile: Any,
        *,
        preset: str = "pipedream-a",
        servers: int = 2,
        gpus_per_server: int = 2,
        method: str = "pipedream",
        memory_limit_gb: float = 0.0,
        live: bool | None = None,
        partitioner: Callable[..., Any] | None = None,
        presets: Iterable[str] | None = None,
        methods: Iterable[str] | None = None,
    ) -> None:

        if not isinstance(profile, Profile):
            raise TypeError(f"PlanExplorer needs a pl.Profile; got {type(profile).__name__}")
        self.profile = profile
        self._partition = partitioner
        self.presets = list(presets) if presets is not None else _cluster_presets()
        self.methods = list(methods) if methods is not None else _partition_methods()
        self.live = live_frontend() if live is None else bool(live)
        self.values: dict[str, Any] = {
            "preset": preset,
            "servers": servers,
            "gpus_per_server": gpus_per_server,
            "method": method,
            "memory_limit_gb": memory_limit_gb,
        }
        self.plan: Any = None
        self.message = ""
        self.figure: go.Figure = go.Figure()
        if self.live:
            w = _widgets()
            style = {"description_width": "initial"}
            self.controls = {
                "preset": w.Dropdown(options=self.presets, value=preset, description="cluster"),
                "servers": w.IntSlider(value=servers, min=1, max=16, description="servers", style=style),
                "gpus_per_server": w.IntSlider(
                    value=gpus_per_server, min=1, max=16, description="GPUs/server", style=style
                ),
                "method": w.Dropdown(options=self.methods, value=method, description="method"),
                "memory_limit_gb": w.BoundedFloatText(
                    value=memory_limit_gb,
                    min=0.0,
                    max=1024.0,
                    step=1.0,
                    description="memory limit GB (0 = device)",
                    style=style,
                ),
            }
            self.info = w.HTML()
            self.figure = go.FigureWidget()
            for c in self.controls.values():
                c.observe(self._on_change, names="value")
            self.widget = w.VBox([w.HBox([self.controls["preset"], self.controls["servers"],
                                          self.controls["gpus_per_server"]]),
                                  w.HBox([self.controls["method"], self.controls["memory_limit_gb"]]),
                                  self.info, self.figure])
        self.redraw()

    def make_plan(self) -> Any:
        """Partition the profile for the current control values."""

        v = self.values
        cluster = Cluster.preset(
            v["preset"], servers=int(v["servers"]), gpus_per_server=int(v["gpus_per_server"])
        )
        part = self._partition
        if part is None:

            part = partition
        kw: dict[str, Any] = {"method": v["method"]}
        if v["memory_limit_gb"]:
            kw["memory_limit"] = float(v["memory_limit_gb"]) * 1e9
        return part(self.profile, cluster, **kw)

    def redraw(self) -> None:
        """Partition again and redraw; an infeasible choice shows its error and keeps the old figure."""
        try:
            plan = self.make_plan()
            fig = partition_graph(self.profile, plan)
        except (ValueError, TypeError, ImportError) as exc:
            self.message = f"cannot partition: {exc}"
            if self.live:
                self.info.value = f"<span style='color:#b00'>{html.escape(self.message)}</span>"
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


def _cluster_presets() -> list[str]:

    return list(Cluster.presets())


def _partition_methods() -> list[str]:

    return list(METHODS)


from pipelab.widgets.planner import PlannerExplorer  # noqa: E402  (needs the classes above)

__all__ = [
    "LiveGantt",
    "PlanExplorer",
    "PlannerExplorer",
    "ScheduleExplorer",
    "json_safe",
    "live_frontend",
    "show",
    "static_html",
    "sync_figure",
]
