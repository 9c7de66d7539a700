"""Crossing sends (``pipelab.schedules.crossing``): which actions' messages cross the peer's, the
simulator's second pass that adds their stall, and the calibration's measure of it. Oracles: hand-made
events, GPipe (whose two directions never overlap: no crossing), the first pass's durations plus
exactly the stall, and the closed form of the weighted mean extra."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from pipelab.calibrate import _cross_extra
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.schedules.crossing import Stalled, crossed_actions
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


def test_the_calibrated_extra_is_the_crossed_actions_mean_over_the_clear_ones() -> None:
    durations = {
        (0, "F", True): [3.0, 5.0], (0, "F", False): [1.0, 1.0, 1.0],    # +3 twice
        (1, "B", True): [2.0], (1, "B", False): [1.5, 0.5],               # +1 once
        (1, "F", True): [9.0],                                            # no clear one: not counted
    }
    assert _cross_extra(durations) == pytest.approx((2 * 3.0 + 1 * 1.0) / 3)
    assert _cross_extra({(0, "F", False): [1.0]}) == 0.0
    assert _cross_extra({(0, "F", True): [0.5], (0, "F", False): [1.0]}) == 0.0   # never negative


def test_the_replay_with_measured_durations_adds_no_stall() -> None:
    from pipelab.reproduce.accuracy import MeasuredActions

    assert MeasuredActions.crossing_s(object.__new__(MeasuredActions)) == 0.0
