"""``LiveGantt``: a Gantt chart that fills in while a job runs."""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import plotly.graph_objects as go

from pipelab.trace import Event, Trace
from pipelab.views import gantt
from pipelab.widgets.display import Displayable, ipywidgets, live_frontend
from pipelab.widgets.sync import sync_figure


class LiveGantt(Displayable):
    """A Gantt chart of ``handle.events`` (what :func:`pipelab.launch` returns), redrawn as they arrive.

    A redraw rebuilds the chart from every event so far; after one of ``c`` CPU seconds the next waits
    ``c / cpu_share``, at most ``max(interval, 3 c)`` and at least ``1 / hz``. Without a live front end
    the display waits for the job's end (``reproductions/benchmarks/live_trace_cost.py``).
    """

    def __init__(self, handle: Any, *, hz: float = 4.0, live: bool | None = None,
                 color_by: str = "microbatch", title: str | None = None, start: bool = True,
                 cpu_share: float = 0.02, interval: float = 1.0) -> None:
        if not hasattr(handle, "events"):
            raise TypeError(f"LiveGantt needs a job handle with .events (from pl.launch); got "
                            f"{type(handle).__name__}")
        if not hz > 0:
            raise ValueError(f"hz={hz} must be > 0 (redraws per second)")
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share={cpu_share} must be in (0, 1] (the share of time spent redrawing)")
        if not interval > 0:
            raise ValueError(f"interval={interval} must be > 0 seconds (the longest wait between redraws)")
        self.handle, self.color_by, self.title = handle, color_by, title
        self.hz, self.cpu_share, self.interval = float(hz), float(cpu_share), float(interval)
        self.live = live_frontend() if live is None else bool(live)
        self.events: list[Event] = []
        self.redraw_cpu_s, self.redraws, self.result = 0.0, 0, None
        self.error: BaseException | None = None
        self._lock, self._done = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        self._started = self._ended = False
        self.figure: go.Figure = go.FigureWidget() if self.live else go.Figure()
        if self.live:
            w = ipywidgets()
            self.status = w.HTML(value="waiting for the first events…")
            self.widget = w.VBox([self.status, self.figure])
            self.figure.update_layout(height=300, title={"text": title or "pipeline (starting)"})
            if start:
                self.start()

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
        """Wait until the event stream ends and the last redraw is done (consuming it here if nothing
        does yet); True if it did."""
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

    def trace(self) -> Trace:
        """The events received so far, as a Trace."""
        with self._lock:
            return Trace.from_events(list(self.events))

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
            parts.append(f"{steps * batch / elapsed:.1f} samples/s" if batch
                         else f"{steps / elapsed:.2f} steps/s")
        loss = _last_loss(self.result) if self.result is not None else _last_loss(self.handle)
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        parts.append(f"{len(evs)} events")
        if self._ended:
            parts.append("finished" if self.error is None
                         else f"stopped: {type(self.error).__name__}: {self.error}")
        return " · ".join(parts)

    def current_figure(self) -> go.Figure | None:
        """The Gantt of the events so far (None until the first action has arrived): while the job runs
        it opens on the latest minibatches, once it ended on the first steady ones (the whole run stays
        on the range slider)."""
        trace = self.trace()
        if not trace.compute_events():
            return None
        # while running: the latest minibatches, without a range slider (a second copy of every box to
        # redraw at each update)
        window = "auto" if self._ended else "latest"
        return gantt(trace, color_by=self.color_by, title=self.title, window=window, range_slider=self._ended)

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
