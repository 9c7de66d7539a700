"""Crossing sends (``pipelab.schedules.crossing``): which actions' messages cross the peer's, the
host-effects layer's second pass that adds their stall (``pipelab.sim.host_effects``), and the
calibration's measure of it. Oracles: hand-made
events, GPipe (whose two directions never overlap: no crossing), the first pass's durations plus
exactly the stall, and the closed form of the weighted mean extra."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from pipelab.calibrate.crossings import _extra
from pipelab.measured import HostEffects
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.schedules.crossing import Stalled, arrived_actions, crossed_actions
from pipelab.schedules.dataflow import UnitCosts, run
from pipelab.schedules.messages import sent_by
from pipelab.sim import simulate_schedule

STALL = 0.25
#: a host whose crossing sends stall ``STALL`` seconds
STALLING = HostEffects(cross_s=STALL)


def _stalled(sch, host: HostEffects = STALLING):  # type: ignore[no-untyped-def]
    return simulate_schedule(sch, UnitCosts(), host_effects=host)


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
    b = _stalled(sch)
    assert a.time_per_minibatch == b.time_per_minibatch


def test_the_second_pass_adds_the_stall_to_exactly_the_crossed_actions() -> None:
    sch = build("1f1b-flush", 2, microbatches=8, minibatches=2)
    first = [e for e in run(sch, UnitCosts()) if e.kind in ("F", "B", "W", "U")]
    crossed = crossed_actions(sch, first)
    assert crossed, "1F1B's steady state has both workers send to each other at once"
    second = [e for e in _stalled(sch).trace.compute_events()]
    base = UnitCosts()
    for e in second:
        a = Action(e.stage, e.kind, e.microbatch)
        want = base.compute(e.worker, a, False) + (STALL if (e.worker, a) in crossed else 0.0)
        assert e.end_s - e.start_s == pytest.approx(want), (e.worker, a)
    assert _stalled(sch).time_per_minibatch > \
        simulate_schedule(sch, UnitCosts()).time_per_minibatch


def test_stalled_costs_apply_once_and_delegate_the_rest() -> None:
    base = UnitCosts()
    st = Stalled(base, {(0, Action(0, "F", 0))}, STALL)
    assert st.compute(0, Action(0, "F", 0), False) == base.compute(0, Action(0, "F", 0), False) + STALL
    assert st.compute(1, Action(0, "F", 0), False) == base.compute(1, Action(0, "F", 0), False)
    assert st.send(0, 1, Action(0, "F", 0)) == base.send(0, 1, Action(0, "F", 0))
    assert st.busy_sender_s(0) == base.busy_sender_s(0) and st.channels(0, 1) == base.channels(0, 1)


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


def test_an_interleaved_schedule_takes_its_own_crossing_stall() -> None:
    """Oracle: a host whose stall is STALL but STALL / 4 in a schedule with virtual stages. The
    interleaved simulation adds exactly STALL / 4 to each action its first pass finds crossed; 1F1B
    keeps STALL; a host without the interleaved figure gives both STALL."""
    host = HostEffects(cross_s=STALL, cross_interleaved_s=STALL / 4)
    sch = build("interleaved-1f1b", 2, microbatches=4, minibatches=2, chunks=2)
    first = [e for e in run(sch, UnitCosts()) if e.kind in ("F", "B", "W", "U")]
    crossed = crossed_actions(sch, first)
    assert crossed, "interleaving crosses"
    base = UnitCosts()
    for e in _stalled(sch, host).trace.compute_events():
        a = Action(e.stage, e.kind, e.microbatch)
        want = base.compute(e.worker, a, False) + (STALL / 4 if (e.worker, a) in crossed else 0.0)
        assert e.end_s - e.start_s == pytest.approx(want), (e.worker, a)
    flat = build("1f1b-flush", 2, microbatches=8, minibatches=2)
    assert _stalled(flat, host).time_per_minibatch == pytest.approx(_stalled(flat).time_per_minibatch)
    assert host.crossing_s(interleaved=True) == STALL / 4 and host.crossing_s() == STALL
    assert STALLING.crossing_s(interleaved=True) == STALL


def test_the_core_simulation_has_no_host_effect_unless_asked() -> None:
    """A calibrated cluster's host effects apply only with host_effects=True (or a record): the
    default simulation is the core model's, and a neutral record gives exactly the same result."""
    from pipelab.cluster import Cluster
    from pipelab.measured import Calibration
    from pipelab.profile.records import Profile
    from pipelab.sim import simulate

    host = HostEffects(cross_s=1e-3, busy_sender_s=3e-4)
    cal = Calibration(host="h", backend="gloo", device="cpu", date="d", torch="t", cores=2, workers=2,
                      p2p_latency_s=1e-5, p2p_bandwidth=1e9, allreduce_latency_s=1e-5,
                      allreduce_bandwidth=1e9, overhead_s={}, optimizer_s={}, memory_bandwidth=1e10,
                      host_effects=host)
    cl = dataclasses.replace(Cluster.flat(2), calibration=cal)
    prof = Profile.synthetic([1e-3] * 4, out_bytes=[4096] * 4, batch_size=8)
    core = simulate(2, prof, cl, "1f1b-flush", microbatches=4, minibatches=3)
    neutral = simulate(2, prof, cl, "1f1b-flush", microbatches=4, minibatches=3, host_effects=HostEffects())
    assert neutral.time_per_minibatch == core.time_per_minibatch
    with_host = simulate(2, prof, cl, "1f1b-flush", microbatches=4, minibatches=3, host_effects=True)
    assert with_host.time_per_minibatch > core.time_per_minibatch
    assert host.without(*host.terms).terms == () and set(host.terms) == {"cross", "busy_sender"}
    assert host.without("busy_sender") == HostEffects(cross_s=1e-3)
    with pytest.raises(ValueError, match="not calibrated"):
        simulate(2, prof, Cluster.flat(2), "1f1b-flush", microbatches=4, host_effects=True)
    with pytest.raises(ValueError, match="unknown host terms"):
        host.without("crossing")
