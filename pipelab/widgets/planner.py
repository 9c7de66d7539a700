"""``PlannerExplorer``: a planner's Pareto front as a scatter; choosing a point draws its Gantt chart
with the critical path, its memory per worker and where its bubbles come from."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from pipelab.explain import explain
from pipelab.planner import PlanTable
from pipelab.views import bubbles, gantt, pareto, with_critical_path
from pipelab.widgets.display import Displayable, ipywidgets, live_frontend
from pipelab.widgets.sync import sync_figure


class PlannerExplorer(Displayable):
    """Explore a :class:`~pipelab.planner.PlanTable` (``pl.plan(...)``): click a point of the scatter
    (or call :meth:`select`) to see that candidate simulated: Gantt chart with the critical path,
    peak memory per worker against the limit, and the bubble breakdown (:func:`pipelab.explain`)."""

    def __init__(self, table: PlanTable, *, row: int | None = None, live: bool | None = None) -> None:
        if not isinstance(table, PlanTable):
            raise TypeError(f"PlannerExplorer needs a PlanTable from pl.plan(...); got "
                            f"{type(table).__name__}")
        self.table = table
        self.live = live_frontend() if live is None else bool(live)
        self.row = int(str(table.best.name)) if row is None else int(row)
        self.figures: dict[str, go.Figure] = {}
        self.message = ""
        if self.live:
            w = ipywidgets()
            self.info = w.HTML()
            self.views = {k: go.FigureWidget() for k in ("pareto", "gantt", "memory", "bubbles")}
            self.widget = w.VBox([self.views["pareto"], self.info, self.views["gantt"],
                                  w.HBox([self.views["memory"], self.views["bubbles"]])])
        self.select(self.row)
        if self.live:
            for tr in self.views["pareto"].data:
                tr.on_click(self._on_click)

    def _on_click(self, trace: Any, points: Any, state: Any) -> None:
        if points.point_inds:
            self.select(int(trace.customdata[points.point_inds[0]]))

    def select(self, row: int) -> None:
        """Simulate the candidate of table index ``row`` and redraw everything."""
        t = self.table.table
        if row not in t.index or t.loc[row, "status"] != "simulated":
            raise ValueError(f"row {row} is not a simulated candidate; pick one of the scatter's points")
        self.row = row
        res = self.table.simulate(row)
        bd = explain(res)
        r = t.loc[row]
        limit = self.table.memory_limit
        workers = [f"w{w}" for w in range(len(res.peak_memory))]
        mem = go.Figure(go.Bar(x=workers, y=[p / 2**30 for p in res.peak_memory], name="simulated peak"))
        if limit:
            mem.add_trace(go.Scatter(x=workers, y=[x / 2**30 for x in limit[:len(workers)]], mode="lines",
                                     name="limit", line={"dash": "dash"}))
        mem.update_layout(title={"text": "peak memory per worker (GiB)"}, height=360)
        chart = gantt(res, render="bars" if len(res.trace) < 4000 else "raster")
        self.figures = {"pareto": pareto(t, selected=row), "memory": mem, "bubbles": bubbles(bd),
                        "gantt": with_critical_path(chart, res.trace, bd.critical_path)}
        fits = "fits" if r["fits"] else "does not fit"
        self.message = (f"<b>{html.escape(str(r['method']))}</b> on {html.escape(str(r['partitioner']))} "
                        f"{html.escape(str(r['config']))}, M={r['microbatches']}: "
                        f"{r['throughput']:.1f} samples/s, peak {r['peak_memory'] / 2**30:.2f} GiB ({fits}); "
                        f"{html.escape(bd.summary())}"
                        + (f" · <span style='color:#b00'>{html.escape(str(r['staleness_risk']))}</span>"
                           if r["staleness_risk"] else ""))
        if self.live:
            for k, fig in self.figures.items():
                sync_figure(self.views[k], fig)
            self.info.value = self.message

    def static_figures(self) -> list[go.Figure]:
        """The four figures of the current selection."""
        return list(self.figures.values())

    def static_text(self) -> list[str]:
        """The selection's summary line."""
        return [self.message]
