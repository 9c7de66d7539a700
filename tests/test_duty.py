"""Duty cycle (``pipelab.schedules.duty``, a host effect): a worker busy only part of the time computes
slower.

Oracles: the calibration's interpolation at its points and between them, the isotonic reduction of
the probe's rows, a closed-form fixed point of the simulator's passes (data parallelism with unit
costs), the fixed-point property itself on pipelines, JSON round trips (old files without the term),
and the probe's rows on this machine (shape, not speed)."""

from __future__ import annotations

import json
import math

import pytest
from _calibrations import bare_calibration

from pipelab.calibrate import duty_points
from pipelab.calibrate.probes import duty_cycle
from pipelab.calibration import Calibration, HostEffects
from pipelab.schedules import build
from pipelab.schedules.dataflow import UnitCosts, run
from pipelab.schedules.duty import Scaled, settle, utilization
from pipelab.sim import simulate_schedule


def _cal(**kw: object) -> Calibration:
    return bare_calibration(**kw)


def _host(duty_slowdown: object = ()) -> HostEffects:
    return HostEffects(duty_slowdown=duty_slowdown)  # type: ignore[arg-type]


def linear(utilization: float) -> float:
    """A machine whose cores compute ``2 - u`` times slower when busy ``u`` of the time."""
    return 2.0 - min(utilization, 1.0)


#: the same machine as a host-effects record: the line from (0.01, 1.99) to (1, 1) is ``2 - u``
LINEAR = HostEffects(duty_slowdown=((0.01, 1.99),))


# ---------------------------------------------------------------------- the calibrated curve
def test_duty_factor_interpolates_between_points_and_is_one_at_full_duty() -> None:
    cal = _host(((0.2, 1.4), (0.5, 1.1)))
    assert cal.duty_factor(1.0) == 1.0 and cal.duty_factor(1.3) == 1.0
    assert cal.duty_factor(0.5) == pytest.approx(1.1)
    assert cal.duty_factor(0.75) == pytest.approx(1.05)            # halfway from (0.5, 1.1) to (1, 1)
    assert cal.duty_factor(0.35) == pytest.approx(1.25)            # halfway from (0.2, 1.4) to (0.5, 1.1)
    assert cal.duty_factor(0.05) == pytest.approx(1.4)             # below the lowest duty: no extrapolation
    assert _host().duty_factor(0.1) == 1.0                         # not measured: no effect
    assert LINEAR.duty_factor(0.3) == pytest.approx(linear(0.3))


def test_duty_points_take_median_floor_at_one_and_never_fall_as_duty_falls() -> None:
    rows = [(r, d, x) for r, row in enumerate([(1.05, 0.97, 1.3), (1.15, 0.99, 1.2), (1.10, 0.95, 1.5)])
            for d, x in zip((0.6, 0.35, 0.2), row)]
    # medians: 0.6 -> 1.10, 0.35 -> 0.97 (below 1, and below the higher duty's) -> 1.10, 0.2 -> 1.3
    assert duty_points(rows) == ((0.2, 1.3), (0.35, 1.10), (0.6, 1.10))
    assert duty_points([]) == ()


def test_duty_slowdown_round_trips_and_old_files_load_without_it() -> None:
    cal = _cal(host_effects=_host(((0.6, 1.06), (0.2, 1.37))))
    host = cal.host_effects
    assert host.duty_slowdown == ((0.2, 1.37), (0.6, 1.06))           # kept sorted by duty
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal and again.host_effects.duty_factor(0.4) == host.duty_factor(0.4)
    d = cal.to_dict()
    del d["host_effects"]["duty_slowdown"]
    assert Calibration.from_dict(d).host_effects.duty_slowdown == ()
    # a file from before HostEffects kept the points at the top level: they load into the record
    old = {k: v for k, v in cal.to_dict().items() if k != "host_effects"}
    old["duty_slowdown"] = [[0.2, 1.37]]
    assert Calibration.from_dict(old).host_effects.duty_slowdown == ((0.2, 1.37),)
    assert "20% of the time computes 1.37x" in cal.describe()


@pytest.mark.parametrize("bad", [((1.0, 1.2),), ((0.0, 1.2),), ((0.5, -1.0),), ((0.5, math.nan),), ((0.5,),)])
def test_a_bad_duty_point_is_a_clear_error(bad: tuple[tuple[float, ...], ...]) -> None:
    with pytest.raises(ValueError, match="duty_slowdown point"):
        _host(bad)


# ---------------------------------------------------------------------- the simulator's passes
def test_data_parallel_settles_at_the_closed_form_fixed_point() -> None:
    """dp, 2 replicas, F = B = g, an all-reduce of 5 s starting with the backward: a step takes g + 5
    with 2g busy, so g = 2 - 2g / (g + 5), i.e. g^2 + 5g - 10 = 0."""
    g = (-5 + math.sqrt(25 + 40)) / 2
    sch = build("dp", 2, microbatches=2)
    res = simulate_schedule(sch, UnitCosts(f=1.0, b=1.0, w=0.0, allreduce_s=5.0), host_effects=LINEAR)
    assert res.makespan == pytest.approx(g + 5, rel=2e-3)
    plain = simulate_schedule(sch, UnitCosts(f=1.0, b=1.0, w=0.0, allreduce_s=5.0))
    assert plain.makespan == pytest.approx(6.0)                    # without the term: one pass, as before


@pytest.mark.parametrize("method, kw", [("gpipe", {"microbatches": 4}), ("1f1b-flush", {"microbatches": 4}),
                                        ("pipedream", {})])
def test_each_worker_ends_at_the_factor_of_its_own_utilization(method: str, kw: dict[str, int]) -> None:
    sch = build(method, 3, minibatches=6, **kw)
    costs = UnitCosts(f=1.0, b=2.0, w=0.0, send_s=0.5)
    first = run(sch, costs)
    scaled, events, factors = settle(costs, sch.num_workers, first, lambda c: run(sch, c), linear)
    assert isinstance(scaled, Scaled) and scaled.factors == factors
    util = utilization(events, sch.num_workers)
    for w in range(sch.num_workers):
        assert factors[w] == pytest.approx(linear(util[w]), rel=1e-2)
        assert 1.0 < factors[w] < 2.0        # every stage of a pipeline waits some of the time
    # every compute event is the unit cost times its worker's factor
    for e in events:
        if e.kind == "F":
            assert e.end_s - e.start_s == pytest.approx(factors[e.worker])


def test_a_busy_worker_has_factor_one_and_nothing_runs_again() -> None:
    sch = build("gpipe", 1, microbatches=4)
    costs = UnitCosts(f=1.0, b=2.0, w=0.0)
    first = run(sch, costs)
    scaled, events, factors = settle(costs, 1, first, lambda c: pytest.fail("no second pass expected"),
                                     linear)
    assert scaled is costs and events is first and factors == {0: 1.0}


# ---------------------------------------------------------------------- the probe, here
def test_the_probe_reports_every_duty_of_every_round() -> None:
    rows = duty_cycle(2, duties=(0.5, 0.25), cycles=6, skip=2)
    assert sorted((r, d) for r, d, _ in rows) == [(0, 0.25), (0, 0.5), (1, 0.25), (1, 0.5)]
    assert all(x > 0 and math.isfinite(x) for _, _, x in rows)
