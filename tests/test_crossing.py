"""Crossing sends (``pipelab.schedules.crossing``): which actions' messages cross the peer's, the
simulator's second pass that adds their stall, and the calibration's measure of it. Oracles: hand-made
events, GPipe (whose two directions never overlap: no crossing), the first pass's durations plus
exactly the stall, and the closed form of the weighted mean extra."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from pipelab.calibrate import _extra
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.schedules.crossing import Stalled, arrived_actions, crossed_actions
from pipelab.schedules.dataflow import UnitCosts, run
from pipelab.schedules.messages import sent_by
from pipelab.sim import simulate_schedule

STALL = 0.25


@dataclasses.dataclass(frozen=True)
class StallingUnitCosts(UnitCosts):
    """Unit costs on a backend whose crossing sends stall ``STALL`` seconds."""

    def crossing_s(self) -> float:
        return STALL


def _ev(worker: int, stage: int, kind: str, mb: int, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(worker=worker, stage=stage, kind=kind, microbatch=mb, start_s=start, end_s=end)


def test_who_an_action_sends_to_is_the_neighbour_stage_on_another_worker() -> None:
    sch = build("1f1b-flush", 2, microbatches=2)
    assert sent_by(sch, 0, Action(0, "F", 0)) is not None and sent_by(sch, 0, Action(0, "F", 0))[0] == 1
    assert sent_by(sch, 1, Action(1, "B", 0)) is not None and sent_by(sch, 1, Action(1, "B", 0))[0] == 0
    assert sent_by(sch, 1, Action(1, "F", 0)) is None       # the last stage sends no activation
    assert sent_by(sch, 0, Action(0, "B", 0)) is None       # the first stage sends no gradient
    inter = build("interleaved-1f1b", 2, microbatches=2, chunks=2)
    # stage 1 (worker 1) hands stage 2 (worker 0) its activation: another worker, a message
    assert sent_by(inter, 1, Action(1, "F", 0)) is not None and sent_by(inter, 1, Action(1, "F", 0))[0] == 0


def test_an_action_crosses_when_the_peers_message_leaves_during_it_bounds_included() -> None:
    sch = build("1f1b-flush", 2, microbatches=4)
    events = [
        _ev(0, 0, "F", 1, 1.0, 2.0),    # worker 0 sends an activation over [1, 2]
        _ev(1, 1, "B", 0, 1.5, 2.5),    # worker 1's gradient leaves at 2.5: outside worker 0's F
        _ev(0, 0, "F", 2, 2.5, 3.0),    # ... but inside this one (bound included)
        _ev(1, 1, "B", 1, 3.0, 4.0),    # worker 0's F 2 left at 3.0: crossed
        _ev(1, 1, "F", 2, 4.0, 5.0),    # sends nothing
    ]
    got = crossed_actions(sch, events)
    assert got == {(0, Action(0, "F", 2)), (1, Action(1, "B", 0)), (1, Action(1, "B", 1))}


@pytest.mark.parametrize("P", [2, 3, 4])
def test_gpipe_never_crosses_and_its_simulation_is_unchanged(P: int) -> None:
    sch = build("gpipe", P, microbatches=2 * P)
    plain = run(sch, UnitCosts())
    assert crossed_actions(sch, [e for e in plain if e.kind in "FBWU"]) == set()
    a = simulate_schedule(sch, UnitCosts())
    b = simulate_schedule(sch, StallingUnitCosts())
    assert a.time_per_minibatch == b.time_per_minibatch


def test_the_second_pass_adds_the_stall_to_exactly_the_crossed_actions() -> None:
    sch = build("1f1b-flush", 2, microbatches=8, minibatches=2)
    first = [e for e in run(sch, UnitCosts()) if e.kind in ("F", "B", "W", "U")]
    crossed = crossed_actions(sch, first)
    assert crossed, "1F1B's steady state has both workers send to each other at once"
    second = [e for e in simulate_schedule(sch, StallingUnitCosts()).trace.compute_events()]
    base = UnitCosts()
    for e in second:
        a = Action(e.stage, e.kind, e.microbatch)
        want = base.compute(e.worker, a, False) + (STALL if (e.worker, a) in crossed else 0.0)
        assert e.end_s - e.start_s == pytest.approx(want), (e.worker, a)
    assert simulate_schedule(sch, StallingUnitCosts()).time_per_minibatch > \
        simulate_schedule(sch, UnitCosts()).time_per_minibatch


def test_stalled_costs_apply_once_and_delegate_the_rest() -> None:
    base = StallingUnitCosts()
    st = Stalled(base, {(0, Action(0, "F", 0))}, STALL)
    assert st.compute(0, Action(0, "F", 0), False) == base.compute(0, Action(0, "F", 0), False) + STALL
    assert st.compute(1, Action(0, "F", 0), False) == base.compute(1, Action(0, "F", 0), False)
    assert st.crossing_s() == 0.0
    assert st.send(0, 1, Action(0, "F", 0)) == base.send(0, 1, Action(0, "F", 0))
    assert st.post_ahead() == base.post_ahead() and st.busy_sender_s(0) == base.busy_sender_s(0)


def test_the_calibrated_extras_are_each_class_mean_over_the_quiet_ones() -> None:
    durations = {
        (0, "F", "crossed"): [3.0, 5.0], (0, "F", "quiet"): [1.0, 1.0, 1.0],    # +3 twice
        (1, "B", "crossed"): [2.0], (1, "B", "quiet"): [1.5, 0.5],               # +1 once
        (1, "F", "crossed"): [9.0],                                              # no quiet one: not counted
        (0, "F", "arrived"): [1.5], (1, "B", "arrived"): [1.25, 1.75],           # +0.5 three times
    }
    assert _extra(durations, "crossed") == pytest.approx((2 * 3.0 + 1 * 1.0) / 3)
    assert _extra(durations, "arrived") == pytest.approx(0.5)
    assert _extra({(0, "F", "quiet"): [1.0]}, "crossed") == 0.0
    assert _extra({(0, "F", "arrived"): [0.5], (0, "F", "quiet"): [1.0]}, "arrived") == 0.0   # never negative


def test_an_action_has_an_arrival_when_a_message_to_its_worker_is_sent_during_it() -> None:
    sch = build("1f1b-flush", 2, microbatches=4)
    events = [
        _ev(0, 0, "F", 0, 0.0, 1.0),    # worker 0's activation leaves at 1.0
        _ev(1, 1, "F", 0, 0.5, 1.5),    # ... while worker 1 computes: an arrival
        _ev(1, 1, "B", 0, 1.5, 2.5),    # worker 1's gradient leaves at 2.5; activation 1 arrives at 2.0
        _ev(0, 0, "F", 1, 1.0, 2.0),    # nothing to worker 0 is sent in (1.0, 2.0]
        _ev(0, 0, "U", 0, 2.0, 3.0),    # any kind can have one: the gradient arrives at 2.5
        _ev(1, 1, "F", 1, 2.0, 3.0),    # activation 1 left at its start (2.0): not during it
    ]
    assert arrived_actions(sch, events) == {(1, Action(1, "F", 0)), (1, Action(1, "B", 0)),
                                            (0, Action(0, "U", 0))}


def test_the_second_pass_adds_the_arrivals_extra_where_no_crossing_is() -> None:
    @dataclasses.dataclass(frozen=True)
    class ArrivingUnitCosts(UnitCosts):
        def crossing_s(self) -> float:
            return STALL

        def arrival_s(self) -> float:
            return STALL / 5

    sch = build("1f1b-flush", 2, microbatches=8, minibatches=2)
    first = [e for e in run(sch, UnitCosts()) if e.kind in ("F", "B", "W", "U")]
    crossed = crossed_actions(sch, first)
    arrived = arrived_actions(sch, first) - crossed
    assert crossed and arrived
    base = UnitCosts()
    for e in simulate_schedule(sch, ArrivingUnitCosts()).trace.compute_events():
        a = Action(e.stage, e.kind, e.microbatch)
        extra = STALL if (e.worker, a) in crossed else STALL / 5 if (e.worker, a) in arrived else 0.0
        assert e.end_s - e.start_s == pytest.approx(base.compute(e.worker, a, False) + extra), (e.worker, a)
    st = Stalled(base, {(0, Action(0, "F", 0))}, STALL, {(0, Action(0, "F", 0)), (1, Action(1, "F", 0))}, 0.1)
    assert st.compute(0, Action(0, "F", 0), False) == base.compute(0, Action(0, "F", 0), False) + STALL
    assert st.compute(1, Action(1, "F", 0), False) == base.compute(1, Action(1, "F", 0), False) + 0.1
    assert st.arrival_s() == 0.0 and st.crossing_s() == 0.0


def test_the_replay_with_measured_durations_adds_no_stall() -> None:
    from reproductions.sim_accuracy.accuracy import MeasuredActions

    assert MeasuredActions.crossing_s(object.__new__(MeasuredActions)) == 0.0
    assert MeasuredActions.arrival_s(object.__new__(MeasuredActions)) == 0.0
    assert MeasuredActions.crossing_for(object.__new__(MeasuredActions), "interleaved-1f1b") == 0.0


def test_an_interleaved_schedule_takes_its_own_crossing_stall() -> None:
    """Oracle: costs whose stall is STALL but STALL / 4 for an interleaved schedule. The interleaved
    simulation adds exactly STALL / 4 to each action its first pass finds crossed; 1F1B keeps STALL;
    the Stalled second pass and the delegating costs pass the schedule's figure on, once."""
    @dataclasses.dataclass(frozen=True)
    class PerSchedule(UnitCosts):
        def crossing_s(self) -> float:
            return STALL

        def crossing_for(self, method: str) -> float:
            return STALL / 4 if method.startswith("interleaved") else STALL

    sch = build("interleaved-1f1b", 2, microbatches=4, minibatches=2, chunks=2)
    first = [e for e in run(sch, UnitCosts()) if e.kind in ("F", "B", "W", "U")]
    crossed = crossed_actions(sch, first)
    assert crossed, "interleaving crosses"
    base = UnitCosts()
    for e in simulate_schedule(sch, PerSchedule()).trace.compute_events():
        a = Action(e.stage, e.kind, e.microbatch)
        want = base.compute(e.worker, a, False) + (STALL / 4 if (e.worker, a) in crossed else 0.0)
        assert e.end_s - e.start_s == pytest.approx(want), (e.worker, a)
    flat = build("1f1b-flush", 2, microbatches=8, minibatches=2)
    assert simulate_schedule(flat, PerSchedule()).time_per_minibatch == \
        pytest.approx(simulate_schedule(flat, StallingUnitCosts()).time_per_minibatch)
    st = Stalled(PerSchedule(), crossed, STALL / 4)
    assert st.crossing_for("interleaved-1f1b") == 0.0 and st.crossing_for("1f1b-flush") == 0.0


def test_a_calibrated_cluster_prices_an_interleaved_crossing_with_its_own_figure() -> None:
    """``ProfileCosts.crossing_for``: ``message_s["cross_interleaved"]`` for an interleaved schedule
    where the calibration has it, ``message_s["cross"]`` otherwise and in older files."""
    from pipelab.calibration import Calibration
    from pipelab.cluster import Cluster
    from pipelab.costs import CostModel
    from pipelab.profile.records import Profile
    from pipelab.sim.simulate import ProfileCosts

    def costs(message_s: dict[str, float]) -> ProfileCosts:
        cal = Calibration(host="h", backend="gloo", device="cpu", date="d", torch="t", cores=2, workers=2,
                          p2p_latency_s=1e-5, p2p_bandwidth=1e9, allreduce_latency_s=1e-5,
                          allreduce_bandwidth=1e9, overhead_s={}, optimizer_s={}, memory_bandwidth=1e10,
                          message_s=message_s)
        cl = dataclasses.replace(Cluster.flat(2), calibration=cal)
        prof = Profile.synthetic([1e-3, 1e-3], out_bytes=[64, 64], batch_size=4)
        return ProfileCosts(CostModel(prof, cl), [(0, 1), (1, 2)], 1)

    both = costs({"cross": 1e-3, "cross_interleaved": 4e-4})
    assert both.crossing_for("interleaved-1f1b") == pytest.approx(4e-4)
    assert both.crossing_for("1f1b-flush") == pytest.approx(1e-3) == both.crossing_s()
    older = costs({"cross": 1e-3})
    assert older.crossing_for("interleaved-1f1b") == pytest.approx(1e-3)
