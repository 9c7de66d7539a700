"""Bubbles explained: closed-form oracles on unit-cost schedules, a straggler, and the parts' sum."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import pipelab as pl
from pipelab.explain import PARTS, critical_path, explain
from pipelab.partition.plan import Plan
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.schedules.dataflow import UnitCosts
from pipelab.sim.simulate import simulate_schedule


@dataclass(frozen=True)
class _Slow(UnitCosts):
    """Unit costs with one worker ``factor`` times slower (what ``slowdown={worker: factor}`` emulates)."""

    slow: int = 0
    factor: float = 1.0

    def compute(self, worker: int, action: Action, split: bool) -> float:
        return super().compute(worker, action, split) * (self.factor if worker == self.slow else 1.0)


@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
@pytest.mark.parametrize("P,M", [(2, 2), (4, 8), (4, 3), (8, 16)])
def test_fill_drain_is_the_closed_form(method: str, P: int, M: int) -> None:
    sch = build(method, Plan.even(2 * P, P), microbatches=M, minibatches=1)
    bd = explain(simulate_schedule(sch, UnitCosts(1.0, 1.0, 1.0)).trace, sch)
    want = (P - 1) / (M + P - 1)
    for w in range(P):
        assert bd.fractions().loc[w, "fill_drain"] == pytest.approx(want)
        for part in PARTS[1:]:
            assert bd.table.loc[w, part] == pytest.approx(0.0, abs=1e-12)
    assert bd.totals()["idle"] == pytest.approx(want)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (6, 12)])
def test_zb_h1_fill_drain_is_a_third_of_1f1b(P: int, M: int) -> None:
    """Zero Bubble (Qi et al., ICLR'24 §3): with F = B = W, ZB-H1's bubble is a third of 1F1B's."""
    idle = {}
    for method in ("1f1b-flush", "zb-h1"):
        sch = build(method, Plan.even(2 * P, P), microbatches=M, minibatches=1)
        bd = explain(simulate_schedule(sch, UnitCosts(1.0, 1.0, 1.0)).trace, sch)
        idle[method] = bd.table["fill_drain"]
    assert (idle["zb-h1"] * 3).tolist() == pytest.approx(idle["1f1b-flush"].tolist())
    assert idle["1f1b-flush"].tolist() == pytest.approx([3.0 * (P - 1)] * P)


@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
@pytest.mark.parametrize("slow,factor", [(1, 1.5), (3, 2.0), (0, 1.25)])
def test_a_straggler_lands_on_its_worker_with_its_size(method: str, slow: int, factor: float) -> None:
    """One worker slowed by ``factor``: every other worker's straggler part is the makespan the
    slowdown adds (a separate run without it is the oracle), and for GPipe that is the closed form
    ``(factor - 1) x`` the slow worker's normal busy time (it is the bottleneck of both phases)."""
    P, M = 4, 8
    sch = build(method, Plan.even(8, P), microbatches=M, minibatches=1)
    res = simulate_schedule(sch, _Slow(slow=slow, factor=factor))
    added = res.trace.makespan - simulate_schedule(sch, UnitCosts()).trace.makespan
    if method == "gpipe":
        assert added == pytest.approx((factor - 1) * M * 3.0)
    bd = explain(res.trace, sch, slowdown={slow: factor})
    for w in range(P):
        if w != slow:
            assert bd.table.loc[w, "straggler"] == pytest.approx(added)
        assert bd.table.loc[w, "imbalance"] == pytest.approx(0.0, abs=1e-12)
        assert bd.table.loc[w, "fill_drain"] == pytest.approx(3.0 * (P - 1))
    # the slow worker's own wait grows by the added makespan less its added busy time
    assert bd.table.loc[slow, "straggler"] == pytest.approx(added - (factor - 1) * M * 3.0)
    assert bd.straggler_by_culprit == pytest.approx({slow: (P - 1) * added})
    # without being told, a worker slow on every action reads as a slower stage
    blind = explain(res.trace, sch)
    assert blind.table["straggler"].abs().max() == pytest.approx(0.0, abs=1e-12)
    assert blind.table["imbalance"].sum() > 0


def test_parts_sum_to_idle_and_transfers_are_found() -> None:
    prof = pl.Profile.synthetic([1e-3, 2e-3, 1e-3, 3e-3], out_bytes=[4_000_000] * 4, param_bytes=[1_000] * 4,
                                batch_size=8)
    cl = pl.Cluster.flat(2, bandwidth=1e9)
    res = pl.simulate(Plan.from_boundaries(4, [2], batch_size=8), prof, cl, "1f1b-flush", microbatches=4)
    bd = explain(res)
    assert bd.table[list(PARTS)].sum(axis=1).tolist() == pytest.approx(bd.table["idle"].tolist())
    assert bd.table["idle"].tolist() == pytest.approx([bd.makespan - b for b in bd.table["busy"]])
    assert bd.table["transfer"].sum() > 0          # 4 MB over 1 GB/s: 1 ms per microbatch
    assert bd.table["imbalance"].sum() > 0         # stage 1 is 5 ms, stage 0 3 ms


def test_critical_path_is_a_chain_to_the_end() -> None:
    prof = pl.Profile.synthetic([1e-3, 2e-3, 1e-3, 3e-3], out_bytes=[1_000_000] * 4, batch_size=8)
    plan = Plan.from_boundaries(4, [1, 2, 3], batch_size=8)
    res = pl.simulate(plan, prof, pl.Cluster.flat(4, bandwidth=1e9), "gpipe", microbatches=4)
    path = critical_path(res.trace, res.schedule)
    assert path[-1].end_s == pytest.approx(res.trace.makespan)
    assert path[0].start_s == pytest.approx(0.0)
    for a, b in zip(path, path[1:]):
        assert b.start_s >= a.end_s - 1e-12
    # no gap on a critical path of a schedule that never waits for nothing
    assert sum(e.end_s - e.start_s for e in path) == pytest.approx(res.trace.makespan)


def test_explain_refuses_a_trace_of_another_schedule() -> None:
    sch = build("gpipe", Plan.even(4, 2), microbatches=2, minibatches=1)
    other = build("gpipe", Plan.even(4, 2), microbatches=4, minibatches=1)
    tr = simulate_schedule(sch, UnitCosts()).trace
    with pytest.raises(ValueError, match="lacks"):
        explain(tr, other)
    with pytest.raises(TypeError, match="Schedule"):
        explain(tr)


def test_views_draw_the_parts_the_path_and_the_front() -> None:
    P, M = 4, 8
    sch = build("gpipe", Plan.even(8, P), microbatches=M, minibatches=1)
    res = simulate_schedule(sch, _Slow(slow=2, factor=1.5))
    bd = explain(res.trace, sch, slowdown={2: 1.5})
    fig = pl.views.bubbles(bd)
    by_name = {t.name: list(t.y) for t in fig.data}
    assert by_name["straggler"] == pytest.approx(list(bd.fractions()["straggler"]))
    assert by_name["fill / drain"] == pytest.approx([3.0 * (P - 1) / bd.makespan] * P)
    g = pl.views.with_critical_path(pl.views.gantt(res.trace), res.trace, bd.critical_path)
    line = g.data[-1]
    assert line.name == "critical path" and max(line.x) == pytest.approx(res.trace.makespan)
    assert 2 in set(line.y)   # the slow worker is on the critical path
    table = pl.plan(pl.Profile.synthetic([1e-3] * 4, batch_size=8), pl.Cluster.flat(2), methods=["gpipe"])
    fig2 = pl.views.pareto(table.table, selected=int(table.best.name))
    assert fig2.data[-1].name == "selected" and fig2.data[-1].y[0] == pytest.approx(table.best["throughput"])
