"""The simulated-against-measured view: errors checked exactly on synthetic traces, refusals, figure data.

Oracle: a trace laid out with per-kind unit costs against the same schedule laid out with one kind
1.2 times as long; that kind's relative error is +20% for every action, the others' 0, and each
worker's busy-time error is the extra time over the simulated busy time (plain arithmetic).
"""

from __future__ import annotations

import math

import pytest

import pipelab.views as views
from pipelab import schedules
from pipelab.trace import Trace
from pipelab.views import action_errors, compare, compare_traces, error_summary, schedule_trace

P, M = 3, 4
COSTS = {"F": 1.0, "B": 2.0, "U": 0.5}


def traces(scale_kind: str = "B", factor: float = 1.2) -> tuple[Trace, Trace]:
    sched = schedules.build("1f1b-flush", P, microbatches=M, minibatches=2)
    sim = schedule_trace(sched, costs=COSTS)
    run = schedule_trace(sched, costs={**COSTS, scale_kind: COSTS[scale_kind] * factor})
    return sim, run


@pytest.mark.parametrize("kind", ["F", "B", "U"])
def test_errors_are_exact_when_one_kind_is_scaled(kind: str) -> None:
    sim, run = traces(kind, 1.2)
    df = action_errors(sim, run)
    assert len(df) == len(sim.compute_events()) == 2 * P * (2 * M + 1)
    for k, errs in df.groupby("kind")["rel_error"]:
        assert errs.to_numpy() == pytest.approx(0.2 if k == kind else 0.0, abs=1e-12), k
    summary = error_summary(sim, run)
    med = summary["by_kind"]["median_rel_error"]
    assert list(med.index) == ["F", "B", "U"]
    assert med[kind] == pytest.approx(0.2) and all(med[k] == pytest.approx(0.0) for k in "FBU" if k != kind)
    n_kind = 2 * (M if kind != "U" else 1)                            # actions of that kind per worker
    busy = 2 * (M * COSTS["F"] + M * COSTS["B"] + COSTS["U"])         # simulated busy time per worker
    by_worker = summary["by_worker"]
    assert list(by_worker.index) == list(range(P))
    assert by_worker["sim_busy_s"].to_numpy() == pytest.approx(busy)
    assert by_worker["busy_rel_error"].to_numpy() == pytest.approx(n_kind * COSTS[kind] * 0.2 / busy)


def test_a_trace_against_itself_has_no_error_and_shares_one_time_axis() -> None:
    sim, _ = traces()
    fig = compare(sim, sim)
    assert fig.layout.meta["median_rel_error"] == {"F": 0.0, "B": 0.0, "U": 0.0}
    assert all(v == 0.0 for v in fig.layout.meta["busy_rel_error"].values())
    # both rows of an action start at the same time: one x axis, each trace from its first action
    for bar in fig.data:
        assert list(bar.base[0::2]) == list(bar.base[1::2])


def test_mismatched_schedules_are_refused_naming_the_difference() -> None:
    a = schedule_trace(schedules.build("1f1b-flush", P, microbatches=M, minibatches=1), costs=COSTS)
    b = schedule_trace(schedules.build("gpipe", P, microbatches=M, minibatches=1), costs=COSTS)
    with pytest.raises(ValueError, match=r"different schedules: worker 0's action \d+ is 0\w+ in the "
                                         r"simulated trace and 0\w+ in the measured one"):
        compare(a, b)
    c = schedule_trace(schedules.build("1f1b-flush", P, microbatches=M, minibatches=2), costs=COSTS)
    with pytest.raises(ValueError, match="worker 0 has 9 simulated actions and 18 measured ones"):
        compare_traces(a, c)
    d = schedule_trace(schedules.build("1f1b-flush", 2, microbatches=M, minibatches=1), costs=COSTS)
    with pytest.raises(ValueError, match=r"workers \[0, 1, 2\] were simulated, \[0, 1\] measured"):
        action_errors(a, d)
    with pytest.raises(ValueError, match="no actions"):
        compare(Trace.from_events([]), a)
    with pytest.raises(TypeError, match="the run argument is a str"):
        compare(a, "trace.json")
    with pytest.raises(TypeError, match="got one trace; pass two"):
        compare(a)
    with pytest.raises(TypeError, match="apply to compare"):
        compare({"x": 1.0}, layout="panels")


def test_figure_has_a_centred_colourbar_and_hover_with_both_durations() -> None:
    sim, run = traces("B", 1.2)
    fig = compare(sim, run, title="t")
    ca = fig.layout.coloraxis
    assert ca.cmid == 0.0 and ca.cmin == pytest.approx(-0.2) and ca.cmax == pytest.approx(0.2)
    assert ca.colorbar.title.text and ca.colorbar.tickformat == "+.0%"
    assert ca.colorscale[0][1] != ca.colorscale[-1][1]                    # diverging: two ends differ
    assert all(b.marker.coloraxis == "coloraxis" for b in fig.data)      # one shared, shown scale
    assert sum(len(b.x) for b in fig.data) == 2 * len(sim.compute_events()) == fig.layout.meta["boxes"]
    back = next(b for b in fig.data if b.name == "backward")
    assert list(back.marker.color) == pytest.approx([0.2] * len(back.x))
    forward = next(b for b in fig.data if b.name == "forward")
    assert set(forward.marker.color) == {0.0}
    hover = back.hovertemplate
    assert "simulated %{customdata[3]" in hover and "measured %{customdata[4]" in hover
    assert "relative error %{customdata[5]}" in back.hovertemplate
    row = list(back.customdata[0])
    assert row[3] == pytest.approx(2000.0) and row[4] == pytest.approx(2400.0) and row[5] == "+20%"
    assert "B +20%" in fig.layout.title.text and "F +0%" in fig.layout.title.text
    # rows interleaved per worker: simulated on even rows, measured on odd rows
    assert set(back.y[0::2]) == {0, 2, 4} and set(back.y[1::2]) == {1, 3, 5}
    assert [t.split(" · ")[-1] for t in fig.layout.yaxis.ticktext[:2]] == ["simulated", "measured"]


def test_panels_layout_and_colour_range() -> None:
    sim, run = traces("F", 3.0)
    fig = compare_traces(sim, run, layout="panels")
    back = next(b for b in fig.data if b.name == "forward")
    assert set(back.y[0::2]) == {0, 1, 2} and set(back.y[1::2]) == {4, 5, 6}
    assert fig.layout.coloraxis.cmax == 1.0                  # +200% saturates at the cap
    assert compare_traces(sim, run, error_range=3.0).layout.coloraxis.cmin == -3.0
    with pytest.raises(ValueError, match="layout='grid'"):
        compare_traces(sim, run, layout="grid")
    with pytest.raises(ValueError, match="error_range=0"):
        compare_traces(sim, run, error_range=0)


def test_actions_without_simulated_time_are_grey_not_infinite() -> None:
    sched = schedules.build("1f1b-flush", 2, microbatches=2, minibatches=1)
    sim = schedule_trace(sched, costs={"F": 1.0, "B": 2.0, "U": 0.0})
    run = schedule_trace(sched, costs={"F": 1.0, "B": 2.0, "U": 0.1})
    fig = compare(sim, run)
    grey = next(b for b in fig.data if "no simulated time" in b.name)
    assert grey.marker.color == views.accuracy.NO_ESTIMATE_COLOR and len(grey.x) == 2 * 2
    assert list(grey.customdata[:, 5]) == ["n/a"] * 4
    assert math.isnan(error_summary(sim, run)["by_kind"]["median_rel_error"]["U"])


def test_results_with_a_trace_are_accepted_and_the_table_compare_still_works() -> None:
    sim, run = traces()

    class Result:
        def __init__(self, trace: Trace) -> None:
            self.trace = trace
    fig = compare(Result(sim), Result(run))
    assert fig.layout.meta["median_rel_error"]["B"] == pytest.approx(0.2)
    table = compare({"a": 100.0, "b": 200.0}, baseline="a")
    assert list(table.data[1].y) == [1.0, 2.0]
