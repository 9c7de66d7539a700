"""The Gantt chart's layout, checked without a browser: the legend sits right of the plot below the
title's margin, in a right margin wide enough for its widest entry, and the figure is tall enough for
its rows; a long run opens on a readable window (warm-up and a few steady minibatches) with the whole
run on a range slider. tests/browser/ checks the same on the page JupyterLab draws."""

from __future__ import annotations

import pytest

from pipelab.schedules import build
from pipelab.views.gantt import (
    LEGEND_CHAR_PX,
    LEGEND_ROW_PX,
    LEGEND_SWATCH_PX,
    STEADY_MINIBATCHES,
    action_traces,
    gantt,
    minibatch_of,
    schedule_trace,
)

DEFAULT_WIDTH = 700      # plotly's default figure width in px


def _boxes(fig) -> dict[str, tuple[float, float, float, float]]:
    """(x0, y0, x1, y1) in px, y down, of the title band, the plot area and the legend, from the layout
    and the legend's own size estimate."""
    lay = fig.layout
    W, H = lay.width or DEFAULT_WIDTH, lay.height
    m = lay.margin
    plot = (m.l, m.t, W - m.r, H - m.b)
    lx = m.l + (W - m.l - m.r) * lay.legend.x
    ly = m.t + (H - m.t - m.b) * (1 - lay.legend.y)
    px = lay.meta["legend_px"]
    legend = (lx, ly, lx + px["width"], ly + LEGEND_ROW_PX * px["rows"])
    return {"title": (0, 0, W, m.t), "plot": plot, "legend": legend}


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize(("method", "P", "M", "K"), [("1f1b-flush", 2, 4, 1), ("zb-h1", 4, 8, 1),
                                                      ("gpipe", 8, 16, 2), ("pipedream", 4, 1, 40)])
def test_legend_never_covers_the_title_or_the_bars(method: str, P: int, M: int, K: int) -> None:
    fig = gantt(build(method, P, microbatches=M, minibatches=K), title="a long title " * 6)
    lay = fig.layout
    assert lay.legend.orientation == "v" and lay.legend.xanchor == "left" and lay.legend.x >= 1.0
    assert lay.legend.yanchor == "top" and lay.legend.y <= 1.0
    b = _boxes(fig)
    assert not _overlap(b["legend"], b["title"]), b
    assert not _overlap(b["legend"], b["plot"]), b
    assert b["legend"][2] <= (lay.width or DEFAULT_WIDTH) + 1, "the legend runs off the right edge"
    assert b["legend"][3] <= lay.height, "the legend runs off the bottom"
    longest = max(len(t.name) for t in fig.data if t.showlegend)
    assert lay.margin.r >= LEGEND_SWATCH_PX + LEGEND_CHAR_PX * longest


def _minibatches_in(fig, sch) -> set[int]:
    lo, hi = fig.layout.xaxis.range
    tr = schedule_trace(sch)
    t0 = min(e.start_s for e in tr.compute_events())
    return {minibatch_of(e, sch.microbatches) for e in tr.compute_events()
            if e.end_s - t0 > lo and e.start_s - t0 < hi}


@pytest.mark.parametrize(("method", "P", "M", "K"), [("1f1b-flush", 4, 8, 60), ("pipedream", 4, 1, 300),
                                                      ("gpipe", 2, 4, 12)])
def test_long_run_opens_on_a_few_minibatches_with_the_whole_run_one_zoom_away(method: str, P: int, M: int,
                                                                               K: int) -> None:
    sch = build(method, P, microbatches=M, minibatches=K)
    fig = gantt(sch)
    assert fig.layout.xaxis.rangeslider.visible
    shown = _minibatches_in(fig, sch)
    in_flight = -(-P // M)                   # minibatches the warm-up starts
    assert 1 < len(shown) <= 2 * (in_flight + 1) + STEADY_MINIBATCHES, sorted(shown)
    assert fig.layout.xaxis.range[1] < 0.5 * schedule_trace(sch).makespan
    latest = gantt(sch, window="latest")
    assert latest.layout.xaxis.range[1] == pytest.approx(schedule_trace(sch).makespan)
    assert max(_minibatches_in(latest, sch)) == K - 1
    assert gantt(sch, window="all").layout.xaxis.range is None


def test_short_run_shows_everything_and_raster_window_has_boxes() -> None:
    short = gantt(build("1f1b-flush", 4, microbatches=8, minibatches=2))
    assert short.layout.xaxis.range is None and not short.layout.xaxis.rangeslider.visible
    long = gantt(build("1f1b-flush", 4, microbatches=8, minibatches=80))
    assert long.layout.meta["render"] == "raster"
    boxes = [t for t in action_traces(long) if t.type == "bar"]
    assert boxes, "a raster's first window draws its actions as boxes"
    lo, hi = long.layout.xaxis.range
    assert all(b < hi for t in boxes for b in t.base)


def test_bad_window_is_refused() -> None:
    sch = build("gpipe", 2, microbatches=2)
    with pytest.raises(ValueError, match="use 'auto', 'latest', 'all'"):
        gantt(sch, window="middle")
    with pytest.raises(ValueError, match="end > start"):
        gantt(sch, window=(3.0, 1.0))


def test_window_without_range_slider() -> None:
    """The live chart's form: a window, and no slider's second copy of every box."""
    fig = gantt(build("1f1b-flush", 4, microbatches=8, minibatches=30), window="latest", range_slider=False)
    assert fig.layout.xaxis.range is not None and not fig.layout.xaxis.rangeslider.visible
