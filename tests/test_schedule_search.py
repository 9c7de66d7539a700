"""The memory-budgeted schedule search (pipelab.schedules.search) against its oracles: the paper's closed
forms for ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, Table 1: bubbles (p-1)(T_F+T_B-T_W) at p activations and
(p-1)(T_F+T_B-2T_W) at 2p-1), pipelab's own ZB-H1 builder, an exhaustive search on small cases, and the
dataflow engine's timing of the same orders."""

from __future__ import annotations

import pytest

from pipelab.schedules import ScheduleError, build, validate
from pipelab.schedules import search as S
from pipelab.schedules.dataflow import run
from pipelab.sim.simulate import simulate_schedule


def _span(events: list, workers: int) -> float:
    comp = [e for e in events if e.kind in ("F", "B", "W")]
    return max(max(e.end_s for e in comp if e.worker == w) - min(e.start_s for e in comp if e.worker == w)
               for w in range(workers))


@pytest.mark.parametrize("method", ["1f1b-flush", "zb-h1", "gpipe"])
def test_evaluate_agrees_with_the_dataflow_engine(method: str) -> None:
    """The search's own timing (the paper's model) equals the engine's on uneven stages with messages."""
    times = S.StageTimes((1.0, 1.5, 0.7, 1.2), (1.1, 2.0, 0.9, 1.3), (0.5, 0.8, 0.6, 0.4), send_s=0.3)
    sch = build(method, 4, microbatches=7)
    cost, _ = S.evaluate(S.orders_of(sch), times, fused=S.fused_stages(sch))
    assert cost == pytest.approx(_span(run(sch, S.StageCosts(times, 7)), 4), rel=1e-12)


@pytest.mark.parametrize("fbw", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 2.0, 1.0)])
@pytest.mark.parametrize("p", [3, 4, 6])
def test_recovers_zb_h1_and_zb_h2_at_their_memory(p: int, fbw: tuple[float, float, float]) -> None:
    f, b, w = fbw
    m = 3 * p
    times = S.StageTimes.uniform(p, forward=f, backward_input=b, backward_weight=w)
    work = m * (f + b + w)
    h1 = S.search_order(times, m, p)
    assert h1.cost == pytest.approx(work + (p - 1) * (f + b - w))                 # ZB-H1's closed form
    assert h1.cost == pytest.approx(S.evaluate(S.orders_of(build("zb-h1", p, microbatches=m)), times)[0])
    assert max(h1.peak_activations) <= p
    h2 = S.search_order(times, m, 2 * p - 1)
    assert h2.cost == pytest.approx(work + max(0.0, (p - 1) * (f + b - 2 * w)))    # ZB-H2's closed form
    assert max(h2.peak_activations) <= 2 * p - 1
    zb_h2 = build("zb-h2", p, microbatches=m)
    assert h2.cost == pytest.approx(S.evaluate(S.orders_of(zb_h2), times)[0])   # pipelab's ZB-H2 builder


@pytest.mark.parametrize("p", [3, 4, 5])
def test_interpolates_monotonically_between_zb_h1_and_zb_h2(p: int) -> None:
    m = 3 * p
    times = S.StageTimes.uniform(p, send_s=0.1)
    costs = []
    for budget in range(1, 2 * p + 2):
        r = S.search_order(times, m, budget)
        assert all(k <= budget for k in r.peak_activations), (budget, r.peak_activations)
        costs.append(r.cost)
    assert all(a >= b - 1e-9 for a, b in zip(costs, costs[1:])), costs
    mid = costs[p - 1:2 * p - 1]                       # budgets p .. 2p-1
    assert mid[0] > mid[-1] and len(set(mid)) > 2      # strictly better somewhere between


@pytest.mark.parametrize(("p", "m"), [(2, 3), (3, 3)])
def test_heuristic_against_the_exhaustive_search(p: int, m: int) -> None:
    """The exhaustive search is a lower bound; at 1, p and >= 2p-1 activations the greedy reaches it."""
    times = S.StageTimes((1.0,) * p, (2.0,) * p, (1.0,) * p, send_s=0.5)
    for budget in (1, 2, 3, 2 * p - 1):
        ex = S.search_order(times, m, budget, exact=True)
        he = S.search_order(times, m, budget)
        assert he.cost >= ex.cost - 1e-9
        assert max(ex.peak_activations) <= budget
        if budget in (1, p, 2 * p - 1):
            assert he.cost == pytest.approx(ex.cost), budget


def test_result_is_a_schedule_that_validates_and_simulates() -> None:
    times = S.StageTimes((1.0, 1.2, 0.8), (1.0, 1.5, 1.1), (0.6, 0.5, 0.7), send_s=0.2)
    r = S.search_order(times, 6, 4)
    validate(r.schedule)
    sim = simulate_schedule(r.schedule, S.StageCosts(times, 6))
    assert _span(list(sim.trace.events), 3) == pytest.approx(r.cost)
    assert tuple(r.schedule.in_flight(s) for s in range(3)) == r.peak_activations
    assert r.bubble_rate == pytest.approx((r.cost - max(times.work(j, 6) for j in range(3))) / r.cost)


def test_budget_below_any_order_is_refused_with_what_it_needs() -> None:
    times = S.StageTimes.uniform(3)
    with pytest.raises(ScheduleError, match=r"below what any order needs.*at least 1 microbatch"):
        S.search_order(times, 4, 0.5)
    with pytest.raises(ScheduleError, match="one per stage"):
        S.search_order(times, 4, (2, 2))
    with pytest.raises(ScheduleError, match="for small cases"):
        S.search_order(S.StageTimes.uniform(4), 8, 7, exact=True)
    with pytest.raises(ScheduleError, match="F, B and W time"):
        S.StageTimes((1.0,), (0.0,), (1.0,))


def test_input_grad_frees_counts_the_paper_way() -> None:
    """F takes one microbatch's activations, B frees the share given, W the rest (the paper's scheduler:
    half at B, ``mem_f = 2, mem_b = mem_w = -1``); counted by hand."""
    order = (("F", 0), ("F", 1), ("B", 0), ("F", 2), ("W", 0), ("B", 1), ("W", 1), ("B", 2), ("W", 2))
    assert S.peak_activations(order) == 3                          # 1, 2, 2, 3, 2, ...
    assert S.peak_activations(order, input_grad_frees=0.5) == 2.5   # 1, 2, 1.5, 2.5, 2, ...
    assert S.peak_activations(order, input_grad_frees=1.0) == 2     # 1, 2, 1, 2, 2, ...
    with pytest.raises(ScheduleError, match=r"input_grad_frees=1.5 .* in \[0, 1\]"):
        S.search_order(S.StageTimes.uniform(2), 4, 2, input_grad_frees=1.5)


@pytest.mark.parametrize(("p", "m"), [(2, 3), (3, 3)])
def test_half_freeing_admits_more_orders(p: int, m: int) -> None:
    """With B freeing half, the exhaustive search's best never loses to the stricter count (its orders
    are a superset) and holds at most the budget; the greedy stays above the exhaustive optimum."""
    times = S.StageTimes((1.0,) * p, (2.0,) * p, (1.0,) * p, send_s=0.5)
    gained = []
    for budget in (1.5, 2, p, 2 * p - 1):
        strict = S.search_order(times, m, budget, exact=True)
        half = S.search_order(times, m, budget, exact=True, input_grad_frees=0.5)
        greedy = S.search_order(times, m, budget, input_grad_frees=0.5)
        assert max(half.peak_activations) <= budget and max(greedy.peak_activations) <= budget
        assert half.cost <= strict.cost + 1e-9
        assert greedy.cost >= half.cost - 1e-9
        gained.append(strict.cost - half.cost)
    assert max(gained) > 0, gained            # the count matters somewhere
    validate(greedy.schedule)
    assert greedy.schedule.options["input_grad_frees"] == 0.5      # how its budget was counted
