"""Widgets without a browser: their figures follow the controls and the event stream; static fallback.

The real-browser check (JupyterLab + Chromium, a real 2-process job) is tests/browser/test_browser.py.
"""

from __future__ import annotations

import json
import math
import threading
import time
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest

from pipelab import widgets
from pipelab.trace import Event
from pipelab.views import action_traces, gantt, schedule_trace
from pipelab.widgets import LiveGantt, PlanExplorer, ScheduleExplorer, live_frontend, static_html, sync_figure


def nbars(fig: go.Figure) -> int:
    return sum(len(t.x) for t in action_traces(fig) if t.type == "bar")


class FakeRun:
    """A job handle like pl.launch's: .events streams, .wait() returns the result, .job.batch_size."""

    def __init__(self, events, *, delay: float = 0.0, fail_after: int | None = None) -> None:
        self._events, self.delay, self.fail_after = list(events), delay, fail_after
        self.job = SimpleNamespace(batch_size=16)

    @property
    def events(self):
        for i, e in enumerate(self._events):
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("worker 1 died")
            time.sleep(self.delay)
            yield e

    def wait(self):
        return SimpleNamespace(losses=[2.5, 1.25])


def one_f_one_b_events(P=2, M=4):
    from pipelab import schedules

    tr = schedule_trace(schedules.build("1f1b-flush", P, microbatches=M))
    return sorted(tr.events, key=lambda e: e.end_s)


def test_live_frontend_detection(monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert live_frontend() is False
    monkeypatch.setenv("JPY_SESSION_NAME", "x.ipynb")
    assert live_frontend() is True          # anywidget is installed in this environment


def test_static_html_inlines_plotlyjs_once_per_kernel(monkeypatch):
    shell = SimpleNamespace()
    monkeypatch.setattr(widgets.display, "_shell", lambda: shell)
    fig = go.Figure(go.Bar(x=[1], y=[1]))
    first, second = static_html(fig), static_html(fig)
    assert "window.PlotlyConfig" in first and len(first) > 1_000_000
    assert "window.PlotlyConfig" not in second and len(second) < 50_000
    monkeypatch.setattr(widgets.display, "_shell", lambda: None)  # outside IPython: always self-contained
    assert "window.PlotlyConfig" in static_html(fig)


def test_live_gantt_fills_in_batches_and_reports_status(monkeypatch):
    # redraws cost no CPU time here, and events come further apart than 1/hz: every event is due for a
    # redraw, however slowly plotly runs on a loaded machine, so the figure must grow one bar at a time
    monkeypatch.setattr(widgets.live_gantt, "time", SimpleNamespace(monotonic=time.monotonic,
                                                                    thread_time=lambda: 0.0))
    evs = one_f_one_b_events(2, 4)
    g = LiveGantt(FakeRun(evs, delay=0.11), hz=10, live=True, cpu_share=1.0, start=False)
    seen: list[int] = []
    draw = g.refresh

    def counted() -> None:
        draw()
        seen.append(nbars(g.figure))

    g.refresh = counted                             # type: ignore[method-assign]
    g.start()
    assert g.join(30)
    assert nbars(g.figure) == len(evs) and len(g.events) == len(evs)
    assert seen == list(range(1, len(evs) + 1)) + [len(evs)]    # one redraw per event, then the final one
    assert g.redraws == len(evs) + 1
    status = g.status_text()
    assert status.startswith("step 1 · ") and "samples/s" in status and "loss 1.25" in status
    assert "finished" in g.status.value
    assert g.figure.layout.title.text.startswith("pipeline — bubble")


def test_live_gantt_redraws_in_batches():
    evs = one_f_one_b_events(2, 4)
    g = LiveGantt(FakeRun(evs), hz=1, live=True)    # a burst of events: a redraw per second, not per event
    assert g.join(10)
    assert nbars(g.figure) == len(evs)
    assert 1 <= g.redraws <= len(evs) // 3


class FakeClock:
    """Stands in for the time module: ``monotonic`` and ``thread_time`` move only when the test says."""

    def __init__(self) -> None:
        self.wall, self.cpu = 0.0, 0.0

    def monotonic(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


@pytest.mark.parametrize(("share", "interval", "gap", "redraws"),
                         [(1 / 32, 8.0, 4.0, 4), (1 / 4, 8.0, 0.5, 30), (1.0, 8.0, 0.25, 60),
                          (1 / 32, 1.0, 1.0, 15), (1 / 32, 0.25, 0.375, 40)])
def test_live_gantt_spends_at_most_its_cpu_share_redrawing(monkeypatch, share, interval, gap, redraws):
    # 240 events 1/16 s apart (15 s of run), each redraw costing 1/8 CPU second, hz=4: after a redraw at
    # t the next comes at the first event at or after t + max(1/hz, min(cost / share, max(interval,
    # 3 cost))) (binary fractions, so the times are exact); share 1 is hz alone (every 0.25 s); the time
    # budget ``interval`` caps the wait (a run of a few seconds still shows progress), but a redraw
    # always waits 3 times its cost
    clock = FakeClock()
    monkeypatch.setattr(widgets.live_gantt, "time", clock)
    evs = [Event(0, 0, "F", m, m / 16, m / 16 + 0.05) for m in range(240)]

    class Stream:
        @property
        def events(self):
            for e in evs:
                yield e
                clock.wall += 1 / 16

    g = LiveGantt(Stream(), hz=4, live=True, cpu_share=share, interval=interval, start=False)
    calls: list[float] = []

    def refresh() -> None:
        calls.append(clock.wall)
        clock.cpu += 1 / 8

    monkeypatch.setattr(g, "refresh", refresh)
    g._consume()
    during = calls[:-1]                                   # the last call is the final redraw at the end
    assert {b - a for a, b in zip(during, during[1:])} == {gap}
    assert len(during) == redraws and during[0] == 0.0
    assert g.redraw_cpu_s == len(during) / 8
    # the budget holds (a redraw pays for its gap): its CPU share, or a third where the interval is shorter
    assert g.redraw_cpu_s <= max(share, 1 / 3) * (clock.wall + gap) if interval < 8 else \
        g.redraw_cpu_s <= share * (clock.wall + gap)
    with pytest.raises(ValueError, match="cpu_share=0"):
        LiveGantt(Stream(), cpu_share=0)


def test_live_gantt_shows_a_failed_job_in_its_status():
    g = LiveGantt(FakeRun(one_f_one_b_events(), fail_after=5), live=True)
    assert g.join(5)
    assert "stopped: RuntimeError: worker 1 died" in g.status_text()
    assert nbars(g.figure) == 5
    with pytest.raises(TypeError, match="events"):
        LiveGantt(object())


def test_live_gantt_static_mode_consumes_the_stream_once(monkeypatch):
    evs = one_f_one_b_events(2, 3)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    g = LiveGantt(FakeRun(evs), live=False)
    g._ipython_display_()
    assert len(g.events) == len(evs)
    figs = g.static_figures()
    assert nbars(figs[0]) == len(evs)
    assert any("finished" in o.data for o in shown) and any("js-plotly-plot" in o.data or "Plotly" in o.data
                                                             for o in shown)


def test_schedule_explorer_redraws_on_control_changes():
    ex = ScheduleExplorer(method="gpipe", stages=4, microbatches=8, live=True)
    assert isinstance(ex.gantt_figure, go.FigureWidget) and nbars(ex.gantt_figure) == 2 * 4 * 8 + 4
    assert "bubble 27.3%" in ex.message
    ex.controls["microbatches"].value = 9           # as the slider would
    assert nbars(ex.gantt_figure) == 2 * 4 * 9 + 4
    assert ex.gantt_figure.layout.title.text.startswith("gpipe: P=4 M=9")
    ex.set(method="interleaved-1f1b", microbatches=8, v=2)
    assert not ex.controls["v"].disabled and ex.controls["K"].disabled
    assert (
        ex.schedule.method == "interleaved-1f1b" and "stages 0,4" in ex.gantt_figure.layout.yaxis.ticktext[0]
    )
    before = nbars(ex.gantt_figure)
    ex.set(microbatches=3)  # interleaved needs M >= P: error, old figure kept
    assert ex.message.startswith("cannot draw") and nbars(ex.gantt_figure) == before
    assert "cannot draw" in ex.info.value
    ex.set(method="buffered", microbatches=8, K=3)
    assert ex.controls["K"].disabled is False and ex.schedule.options.get("versions", 3) == 3
    assert [t.name for t in ex.memory_figure.data][:2] == ["weights", "stashed versions"]
    with pytest.raises(ValueError, match="unknown control"):
        ex.set(colour="red")


def test_schedule_explorer_static_mode():
    ex = ScheduleExplorer(method="1f1b-flush", stages=3, microbatches=4, live=False)
    g, m = ex.static_figures()
    assert nbars(g) == 2 * 3 * 4 + 3 and len(m.data) >= 2
    ex.set(stages=2)
    assert nbars(ex.static_figures()[0]) == 2 * 2 * 4 + 2


def test_plan_explorer_partitions_on_change():
    import pipelab as pl

    prof = pl.Profile.from_pipedream("vgg16")
    ex = PlanExplorer(prof, preset="pipedream-a", servers=2, gpus_per_server=2, method="gpipe", live=True)
    assert ex.plan is not None and "config" in ex.message and "speed-up" in ex.message
    assert ex.plan.num_workers == 4
    ex.controls["servers"].value = 4
    assert ex.plan.num_workers == 8
    stages = [t.name for t in ex.figure.data if t.mode == "markers"]
    assert len(stages) == ex.plan.num_stages
    ex.set(memory_limit_gb=0.001)                   # nothing fits: error shown, plan kept
    assert ex.message.startswith("cannot partition") and ex.plan.num_workers == 8
    with pytest.raises(TypeError, match="Profile"):
        PlanExplorer("vgg16")
    narrow = PlanExplorer(prof, method="gpipe", live=True, choices={"method": ["gpipe", "pipedream"]})
    assert list(narrow.controls["method"].options) == ["gpipe", "pipedream"]
    with pytest.raises(ValueError, match="servers"):
        PlanExplorer(prof, live=False, choices={"servers": ["1"]})


def test_sync_figure_updates_in_place_or_rebuilds():
    evs = one_f_one_b_events(2, 2)
    target = go.FigureWidget()
    sync_figure(target, gantt(evs[:3]))
    assert [t.name for t in action_traces(target)] == ["forward"]
    sync_figure(target, gantt(evs))
    assert nbars(target) == len(evs) and target.layout.title.text == gantt(evs).layout.title.text
    first = target.data[0]
    sync_figure(target, gantt(evs[:-1]))
    assert target.data[0] is first                   # same traces: updated in place, not re-created
    assert nbars(target) == len(evs) - 1


def _finite(obj) -> bool:
    """No NaN or infinity anywhere in ``obj`` (what a widget's JSON may hold)."""
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_finite(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return obj.dtype.kind not in "fc" or bool(np.isfinite(obj).all()) if obj.dtype != object else all(
            _finite(v) for v in obj.ravel())
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def test_no_nan_goes_through_a_widget():
    evs = one_f_one_b_events(2, 4)
    fig = gantt(evs, render="raster")                # the raster's empty cells are NaN in the figure
    assert not _finite([t.to_plotly_json() for t in fig.data])
    target = go.FigureWidget()
    sync_figure(target, fig)
    assert _finite([t.to_plotly_json() for t in target.data])
    sync_figure(target, gantt(evs[:-2], render="raster"))   # in place, the same
    data = [t.to_plotly_json() for t in target.data]
    assert _finite(data)
    json.dumps(data, allow_nan=False, cls=_NumpyJSON)


class _NumpyJSON(json.JSONEncoder):
    def default(self, o):
        return o.tolist() if isinstance(o, np.ndarray) else super().default(o)


def test_events_are_events():
    assert isinstance(one_f_one_b_events()[0], Event)
    assert threading.active_count() >= 1


def test_planner_explorer_draws_the_selected_candidate():
    import pipelab as pl
    from pipelab.widgets import PlannerExplorer

    prof = pl.Profile.synthetic([1e-3, 3e-3, 1e-3, 1e-3], out_bytes=[1000] * 4, param_bytes=[1000] * 4,
                                batch_size=8)
    table = pl.plan(prof, pl.Cluster.flat(2), methods=["gpipe", "1f1b-flush", "pipedream"])
    for live in (False, True):
        ex = PlannerExplorer(table, live=live)
        assert ex.row == int(table.best.name)
        assert set(ex.figures) == {"pareto", "gantt", "memory", "bubbles"}
        other = int(table.default.name)
        ex.select(other)
        res = table.simulate(other)
        assert list(ex.figures["memory"].data[0].y) == pytest.approx([p / 2**30 for p in res.peak_memory])
        assert ex.figures["gantt"].data[-1].name == "critical path"
        assert table.table.loc[other, "method"] in ex.message
    with pytest.raises(ValueError, match="not a simulated"):
        ex.select(10**6)
    with pytest.raises(TypeError, match="PlanTable"):
        PlannerExplorer(prof)
