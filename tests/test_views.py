"""Views: figures' data checked without a browser (boxes = actions, colours, hover, labels, errors).

Oracles: the closed-form bubble of GPipe/1F1B, (P-1)/(M+P-1) (Huang et al. §2.2; Narayanan et al.
SC'21 §2.2), for the unit-cost layout; hand-computed memory components; plain arithmetic for
speed-ups.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from pipelab.partition.plan import Plan, Stage
from pipelab.profile.records import Profile
from pipelab.schedules.actions import Action, Schedule
from pipelab.trace import Event, Trace
from pipelab.views import (
    action_traces,
    bubble_fraction,
    compare,
    compare_table,
    gantt,
    memory,
    memory_breakdown,
    partition_graph,
    schedule_trace,
    to_html,
)
from pipelab.views.gantt import PALETTE


# ------------------------------------------------------------------ tiny reference schedules (test oracles)
def gpipe(P: int, M: int, K: int = 1) -> Schedule:
    """Fill-drain: all forwards, then all backwards, then the update, per minibatch."""
    acts = []
    for s in range(P):
        a: list[Action] = []
        for k in range(K):
            ms = range(k * M, (k + 1) * M)
            a += (
                [Action(s, "F", m) for m in ms]
                + [Action(s, "B", m) for m in reversed(ms)]
                + [Action(s, "U", k)]
            )
        acts.append(a)
    return Schedule("gpipe", P, [(s,) for s in range(P)], M, K, acts)


def one_f_one_b(P: int, M: int) -> Schedule:
    """1F1B with flush: P-1-s warm-up forwards, then alternate, then drain."""
    acts = []
    for s in range(P):
        warm = min(P - 1 - s, M)
        a = [Action(s, "F", m) for m in range(warm)]
        f = warm
        for b in range(M):
            if f < M:
                a.append(Action(s, "F", f))
                f += 1
            a.append(Action(s, "B", b))
        acts.append(a + [Action(s, "U", 0)])
    return Schedule("1f1b-flush", P, [(s,) for s in range(P)], M, 1, acts)


def replicated() -> Schedule:
    """Stage 0 on one worker, stage 1 on two replicas (round-robin microbatches), with versions."""
    M = 4
    a0 = [Action(0, "F", m) for m in range(M)] + [Action(0, "B", m) for m in range(M)]
    a1 = [x for m in (0, 2) for x in (Action(1, "F", m), Action(1, "B", m))]
    a2 = [x for m in (1, 3) for x in (Action(1, "F", m), Action(1, "B", m))]
    versions = [[m // 2 for m in list(range(M)) * 2], [0, 0, 1, 1], [0, 0, 1, 1]]
    return Schedule("pipedream", 2, [(0,), (1, 2)], M, 1, [a0, a1, a2], versions=versions)


def bars(fig, kind_name: str):
    return next(t for t in fig.data if t.name == kind_name)


# ------------------------------------------------------------------ unit-cost layout
@pytest.mark.parametrize("P,M", [(1, 1), (2, 1), (2, 4), (4, 4), (4, 8), (8, 3), (5, 16)])
@pytest.mark.parametrize("builder", [gpipe, one_f_one_b])
def test_unit_layout_bubble_matches_closed_form(builder, P, M):
    trace = schedule_trace(builder(P, M), costs={"F": 1.0, "B": 2.0, "U": 0.0})
    assert bubble_fraction(trace) == pytest.approx((P - 1) / (M + P - 1))
    assert trace.makespan == pytest.approx(3.0 * (M + P - 1))


def test_unit_layout_respects_dependencies():
    trace = schedule_trace(one_f_one_b(4, 6))
    end = {(e.kind, e.stage, e.microbatch): e for e in trace.events}
    for e in trace.events:
        if e.kind == "F" and e.stage > 0:
            assert e.start_s >= end[("F", e.stage - 1, e.microbatch)].end_s
        if e.kind == "B":
            assert e.start_s >= end[("F", e.stage, e.microbatch)].end_s
            if e.stage < 3:
                assert e.start_s >= end[("B", e.stage + 1, e.microbatch)].end_s
    for w in trace.workers:   # one action at a time per worker, in list order
        evs = sorted((e for e in trace.events if e.worker == w), key=lambda e: e.step)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(evs, evs[1:]))


def test_deadlock_and_missing_actions_are_reported():
    # worker 0 wants B0 (needs worker 1's B0) before F1; worker 1 wants F1 first: a cycle
    bad = Schedule("x", 2, [(0,), (1,)], 2, 1,
                   [[Action(0, "F", 0), Action(0, "B", 0), Action(0, "F", 1), Action(0, "B", 1)],
                    [Action(1, "F", 1), Action(1, "F", 0), Action(1, "B", 0), Action(1, "B", 1)]])
    with pytest.raises(ValueError, match="deadlock"):
        schedule_trace(bad)
    missing = Schedule(
        "x", 2, [(0,), (1,)], 1, 1, [[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "B", 0)]]
    )
    with pytest.raises(ValueError, match="no worker runs"):
        schedule_trace(missing)


# ------------------------------------------------------------------ gantt figure data
def test_gantt_boxes_are_actions_and_title_has_bubble():
    sched = gpipe(4, 8, K=2)
    fig = gantt(sched)
    counts = {t.name: len(t.x) for t in action_traces(fig)}
    assert counts == {"forward": 64, "backward": 64, "update": 8}
    assert sum(counts.values()) == len(sched)
    f = bars(fig, "forward")
    assert np.allclose(np.asarray(f.x, float), 1.0)
    assert np.allclose(np.asarray(bars(fig, "backward").x, float), 2.0)
    assert "bubble 27.3%" in fig.layout.title.text          # (4-1)/(8+4-1) per minibatch, K=2 in a row
    assert fig.layout.meta["boxes"] == len(sched)
    # box positions equal the layout's events
    trace = schedule_trace(sched)
    fwd = sorted((e.worker, e.start_s) for e in trace.events if e.kind == "F")
    assert sorted(zip(np.asarray(f.y).tolist(), np.asarray(f.base, float).tolist())) == fwd


def test_gantt_kinds_are_distinguishable():
    fig = gantt(gpipe(2, 2))
    styles = {t.name: (t.marker.pattern.shape, t.opacity, t.marker.line.width) for t in action_traces(fig)}
    assert len(set(styles.values())) == len(styles)


def test_gantt_colors_by_microbatch_and_version():
    sched = replicated()
    by_mb = gantt(sched, color_by="microbatch")
    f = bars(by_mb, "forward")
    cd = np.asarray(f.customdata)
    assert np.array_equal(np.asarray(f.marker.color), cd[:, 1] % len(PALETTE))
    by_v = gantt(sched, color_by="version")
    f = bars(by_v, "forward")
    cd = np.asarray(f.customdata)
    assert np.array_equal(np.asarray(f.marker.color), cd[:, 2])
    assert set(np.asarray(f.marker.color).tolist()) == {0, 1}
    # the colour scale paints value k with PALETTE[k]
    scale = f.marker.colorscale
    k = 3
    mid = (k + 0.5 - f.marker.cmin) / (f.marker.cmax - f.marker.cmin)
    colour = next(c for (a, c), (b, _) in zip(scale, scale[1:]) if a <= mid <= b and a != b)
    assert colour.lower() == PALETTE[k].lower()
    with pytest.raises(ValueError, match="color_by"):
        gantt(sched, color_by="stage")


def test_gantt_hover_and_row_labels():
    fig = gantt(replicated())
    f = bars(fig, "forward")
    for word in ("stage", "microbatch", "version", "duration", "bytes"):
        assert word in f.hovertemplate
    assert list(fig.layout.yaxis.ticktext) == ["w0 · stage 0 (replica 0)", "w1 · stage 1 (replica 0)",
                                              "w2 · stage 1 (replica 1)"]
    # microbatch m of stage 1 runs on replica m % 2
    cd = np.asarray(f.customdata)
    for stage, mb, _v, _b, worker in cd.tolist():
        if stage == 1:
            assert worker == 1 + mb % 2


def test_gantt_of_trace_with_transfers_and_result_objects():
    evs = [Event(0, 0, "F", 0, 0.0, 1.0, bytes=10, weight_version=0, step=0),
           Event(0, 0, "send", 0, 1.0, 1.5, bytes=4096, peer=1),
           Event(1, 1, "recv", 0, 1.0, 1.5, bytes=4096, peer=0),
           Event(1, 1, "F", 0, 1.5, 2.5, weight_version=0, step=0),
           Event(1, 1, "B", 0, 2.5, 4.5, weight_version=0, step=1),
           Event(0, 0, "B", 0, 5.0, 7.0, weight_version=0, step=1)]
    trace = Trace.from_events(evs, method="demo")
    fig = gantt(trace)
    t = bars(fig, "transfer")
    assert len(t.x) == 2 and "bytes" in t.hovertemplate
    assert np.asarray(t.customdata)[:, 3].tolist() == [4096, 4096]
    assert "transfer" not in {d.name for d in gantt(trace, show_transfers=False).data}
    assert fig.layout.xaxis.title.text == "time (s)"
    # busy 1+1+2+2 = 6 of 2 workers x 7 s
    assert fig.layout.meta["bubble_fraction"] == pytest.approx(1 - 6 / 14)
    # a result object: its own bubble fraction wins; a plain list of events works too
    res = SimpleNamespace(trace=trace, bubble_fraction=0.125)
    assert "bubble 12.5%" in gantt(res).layout.title.text
    assert len(action_traces(gantt(list(evs)))) == 3


def test_gantt_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="nothing to draw"):
        gantt(Trace(events=()))
    with pytest.raises(ValueError, match="nothing to draw"):
        gantt(Trace.from_events([Event(0, 0, "send", 0, 0.0, 1.0)]))
    with pytest.raises(TypeError, match="Trace, a Schedule"):
        gantt({"not": "a trace"})
    with pytest.raises(ValueError, match="no actions"):
        gantt(Schedule("x", 1, [(0,)], 1, 1, [[]]))


# ------------------------------------------------------------------ partition graph
def _skip_profile() -> Profile:
    # 0 -> 1 -> 2 -> 3 -> 4 with a skip 1 -> 3 (a residual block)
    base = Profile.synthetic([1e-3, 2e-3, 4e-3, 1e-3, 2e-3], out_bytes=[10, 1000, 100, 10, 5],
                             param_bytes=[0, 4000, 8000, 0, 400], model="skipnet")
    return Profile(layers=base.layers, cut_bytes=(10, 1100, 1100, 10), batch_size=1, model="skipnet",
                   edges=((0, 1), (1, 2), (2, 3), (1, 3), (3, 4)))


def test_partition_graph_colours_sizes_and_annotations():
    prof = _skip_profile()
    plan = Plan.from_boundaries(5, [2, 4], replicas=[2, 1, 1], profile_fingerprint=prof.fingerprint())
    fig = partition_graph(prof, plan)
    nodes = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in nodes] == ["stage 0 ×2", "stage 1 ×1", "stage 2 ×1"]
    assert [len(t.x) for t in nodes] == [2, 2, 1]
    assert len({t.marker.color for t in nodes}) == 3
    assert list(fig.layout.meta["stage_of_layer"]) == [0, 0, 1, 1, 2]
    # node area grows with compute time: layer 2 (12 ms fwd+bwd) is the largest
    sizes = {int(cd[0]): s for t in nodes for cd, s in zip(t.customdata, t.marker.size)}
    assert max(sizes, key=sizes.get) == 2
    # layered layout: every edge points right; the skip edge spans two depths
    xs = {int(cd[0]): x for t in nodes for cd, x in zip(t.customdata, t.x)}
    assert all(xs[b] > xs[a] for a, b in prof.edges) and xs[3] - xs[1] == 2
    # edge width grows with bytes (layer 1's output, 1000 B, is the heaviest)
    edges = [t for t in fig.data if t.mode == "lines"]
    widest = max(edges, key=lambda t: t.line.width)
    assert 1.0 in [x for x in widest.x if x is not None]
    texts = [a.text for a in fig.layout.annotations]
    assert any("×2" in t and "ranks 0,1" in t for t in texts)


def test_partition_graph_refuses_a_plan_for_another_profile():
    prof = _skip_profile()
    other = Profile.synthetic([1.0] * 5, names=[f"x{i}" for i in range(5)], model="other")
    plan = Plan.from_boundaries(5, [2], profile_fingerprint=other.fingerprint(), model="other")
    with pytest.raises(ValueError, match="another model"):
        partition_graph(prof, plan)
    with pytest.raises(ValueError, match="layers"):
        partition_graph(prof, Plan.even(4, 2))


# ------------------------------------------------------------------ memory
def test_memory_breakdown_and_limit():
    # saved_bytes are not recorded, so a stage keeps its layers' outputs plus its input (the cut before it)
    prof = Profile.synthetic([1.0] * 4, out_bytes=[100, 200, 300, 400], param_bytes=[1000, 2000, 3000, 4000],
                             input_bytes=50)
    stages = (
        Stage(0, 0, 2, 1, (0,), in_flight=2, versions=2),
        Stage(1, 2, 4, 1, (1,), in_flight=1, versions=1),
    )
    plan = Plan(stages=stages, num_layers=4)
    mb = memory_breakdown(plan, prof, optimizer="adam")
    assert mb[0] == {"weights": 3000, "stashed versions": 3000, "gradients": 3000, "optimizer state": 6000,
                     "activations": 2 * (50 + 100 + 200)}
    assert mb[1] == {"weights": 7000, "stashed versions": 0, "gradients": 7000, "optimizer state": 14000,
                     "activations": 200 + 300 + 400}
    assert memory_breakdown(plan, prof, microbatches=2)[1]["activations"] == 450     # half a minibatch
    fig = memory(plan, prof, limit=16_000, optimizer="adam")
    assert [t.name for t in fig.data] == ["weights", "stashed versions", "gradients", "optimizer state",
                                          "activations"]
    assert fig.layout.barmode == "stack"
    assert list(fig.layout.meta["totals"]) == [15700, 28900]
    assert list(fig.layout.meta["over_limit"]) == ["w1"]
    assert any(abs(s.y0 - 16_000 / 1e9) < 1e-15 for s in fig.layout.shapes)
    # a result with per-worker peaks only; a plan without profile or predictions is an error
    peaks = memory(SimpleNamespace(peak_memory=[5e9, 7e9]))
    assert [t.name for t in peaks.data] == ["total"] and list(peaks.data[0].y) == [5.0, 7.0]
    with pytest.raises(ValueError, match="pass the profile"):
        memory(plan)


# ------------------------------------------------------------------ compare / html
def test_compare_speedups_against_dp():
    plan = Plan.even(4, 2, batch_size=32).with_predictions(time_per_minibatch=0.5)
    results = {"pipedream": SimpleNamespace(throughput=300.0), "dp": 100.0, "gpipe": plan}
    df = compare_table(results)
    assert df.loc["pipedream", "speedup"] == pytest.approx(3.0)
    assert df.loc["gpipe", "throughput"] == pytest.approx(64.0)
    assert bool(df.loc["dp", "baseline"])
    fig = compare(results)
    assert list(fig.data[1].y) == pytest.approx([3.0, 1.0, 0.64])
    with pytest.raises(ValueError, match="positive"):
        compare({"x": Plan.even(4, 2)})           # no predictions (NaN time)
    with pytest.raises(ValueError, match="baseline"):
        compare({"a": 1.0}, baseline="dp")


def test_to_html_is_self_contained():
    html = to_html(gantt(gpipe(2, 2)))
    assert "plotly.js" in html.lower() or "plotly" in html and len(html) > 1_000_000
    assert len(to_html(gantt(gpipe(2, 2)), include_plotlyjs=False)) < 200_000
    assert math.isfinite(len(html))


def list_schedule(schedule: Schedule, cost: dict[str, float]) -> list[Event]:
    """Oracle: list scheduling, each action once its worker is free and its inputs are done (``F(s,m)``
    after ``F(s-1,m)``; ``B(s,m)`` after ``F(s,m)`` and ``B(s+1,m)``; ``W`` after ``B``), written apart
    from the simulator's engine; it does not model the all-reduce barrier."""
    last = schedule.num_stages - 1

    def needs(a: Action) -> list[tuple[str, int, int]]:
        if a.kind == "F":
            return [("F", a.stage - 1, a.microbatch)] if a.stage > 0 else []
        if a.kind == "B":
            later = [("B", a.stage + 1, a.microbatch)] if a.stage < last else []
            return [("F", a.stage, a.microbatch), *later]
        return [("B", a.stage, a.microbatch)] if a.kind == "W" else []

    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * schedule.num_workers
    ptr = [0] * schedule.num_workers
    events: list[Event] = []
    while any(p < len(acts) for p, acts in zip(ptr, schedule.actions)):
        progress = False
        for w, acts in enumerate(schedule.actions):
            while ptr[w] < len(acts) and all(d in done for d in needs(acts[ptr[w]])):
                a = acts[ptr[w]]
                start = max([free[w], *(done[d] for d in needs(a))])
                done[(a.kind, a.stage, a.microbatch)] = free[w] = start + cost[a.kind]
                events.append(Event(w, a.stage, a.kind, a.microbatch, start, free[w], step=ptr[w]))
                ptr[w] += 1
                progress = True
        assert progress, f"{schedule.method} deadlocks in the oracle"
    return events


def test_simulator_engine_and_list_scheduling_oracle_agree():
    """The chart uses the simulator's engine; its unit-cost layout equals plain list scheduling."""
    from pipelab import schedules as builders
    from pipelab.views.gantt import UNIT_COSTS, UNIT_COSTS_SPLIT

    schedules = [gpipe(3, 5, K=2), one_f_one_b(4, 7)]
    schedules += [builders.build(m, 4, microbatches=8) for m in ("gpipe", "1f1b-flush", "zb-h1", "2bw")]
    schedules += [builders.build("interleaved-1f1b", 2, microbatches=4, chunks=2),
                  builders.build("pipedream", 4, minibatches=12)]
    for sched in schedules:
        a = schedule_trace(sched)
        split = any(x.kind == "W" for acts in sched.actions for x in acts)
        b = list_schedule(sched, UNIT_COSTS_SPLIT if split else UNIT_COSTS)
        assert a.meta["layout_engine"] == "pipelab.schedules.dataflow"
        key = lambda e: (e.worker, e.step)  # noqa: E731
        ca = sorted(a.compute_events(), key=key)
        cb = sorted(b, key=key)
        assert [(e.action, e.start_s, e.end_s) for e in ca] == [(e.action, e.start_s, e.end_s) for e in cb], (
            sched.method
        )


def test_raster_mode_paints_every_action_at_its_place():
    from pipelab.views.gantt import BARS_MAX, COMPUTE_KINDS, raster_colorscale

    sched = one_f_one_b(4, 6)
    trace = schedule_trace(sched)
    fig = gantt(sched, render="raster")
    hm = fig.data[0]
    assert fig.layout.meta["render"] == "raster" and hm.type == "heatmap"
    z, text, xs = np.asarray(hm.z, float), np.asarray(hm.text, object), np.asarray(hm.x, float)
    width = fig.layout.meta["bin_width"]
    assert width == 1.0                                   # as fine as the shortest action (F = 1)
    n_pal = len(PALETTE)
    for e in trace.compute_events():
        if e.duration_s == 0:
            continue
        cols = np.nonzero((xs >= e.start_s) & (xs < e.end_s))[0]
        assert len(cols) == round(e.duration_s / width)   # covered exactly, nothing lost
        assert set(text[e.worker, cols]) == {f"{e.action} v{e.weight_version}"}
        assert set(z[e.worker, cols]) == {COMPUTE_KINDS.index(e.kind) * n_pal + e.microbatch % n_pal}
    busy = sum(e.duration_s for e in trace.compute_events())
    assert np.count_nonzero(~np.isnan(z)) * width == pytest.approx(busy)   # idle cells stay empty
    scale, n = raster_colorscale()
    assert n == len(COMPUTE_KINDS) * n_pal and scale[0][1] == PALETTE[0]
    # "auto" switches to raster above BARS_MAX actions
    big = gpipe(8, BARS_MAX // 16 + 1)
    assert len(big) > BARS_MAX and gantt(big).layout.meta["render"] == "raster"
    assert gantt(gpipe(8, 8)).layout.meta["render"] == "bars"
    with pytest.raises(ValueError, match="render"):
        gantt(big, render="svg")


def test_schedule_memory_closed_forms():
    from pipelab.views import schedule_memory

    P, M = 4, 8
    g = schedule_memory(gpipe(P, M))
    assert all(g[w]["activations"] == M for w in range(P))                 # GPipe keeps all M
    f = schedule_memory(one_f_one_b(P, M))
    assert [f[w]["activations"] for w in range(P)] == [P - s for s in range(P)]   # 1F1B: P - s
    assert all(f[w]["weights"] == 1 and f[w]["stashed versions"] == 0 for w in range(P))
    fig = memory(one_f_one_b(P, M))
    assert fig.layout.yaxis.title.text == "units"
    assert list(fig.layout.meta["totals"]) == [1 + P - s for s in range(P)]


def test_views_of_a_real_simulation():
    """gantt/memory/compare over pl.simulate's SimResult (the simulator's own bubble and peaks)."""
    import pipelab as pl

    prof = Profile.synthetic([1e-3] * 8, out_bytes=[4096] * 8, param_bytes=[10_000] * 8)
    cluster = pl.Cluster.flat(4)
    plan = Plan.even(8, 4, profile_fingerprint=prof.fingerprint())
    sim = pl.simulate(plan, prof, cluster, method="1f1b-flush", microbatches=8, minibatches=2)
    fig = gantt(sim)
    mean_bubble = sum(sim.bubble_fraction) / len(sim.bubble_fraction)
    assert fig.layout.meta["bubble_fraction"] == pytest.approx(mean_bubble)
    assert fig.layout.meta["boxes"] == len(sim.trace.compute_events()) == len(sim.schedule)
    assert sum(len(t.x) for t in action_traces(fig) if t.name != "transfer") == len(sim.schedule)
    mem = memory(sim, limit=1e9)
    assert list(mem.layout.meta["totals"]) == list(sim.peak_memory)
    df = compare_table({"sim": sim, "plan": Plan.even(8, 4).with_predictions(time_per_minibatch=1.0)})
    assert df.loc["sim", "throughput"] == pytest.approx(sim.throughput)
