"""PipeMare's LR rescheduling and discrepancy correction against hand computations."""

import math

import pytest
import torch

from pipelab.runtime import pipemare_math as pm
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.worker_view import stage_delays


def test_lr_scale_by_hand() -> None:
    # tau = 4, K = 10: step 0 -> 4**-1, step 5 -> 4**-0.5, step >= 10 -> 1
    assert pm.lr_scale(4, 0, 10) == pytest.approx(0.25)
    assert pm.lr_scale(4, 5, 10) == pytest.approx(0.5)
    assert pm.lr_scale(4, 10, 10) == 1.0
    assert pm.lr_scale(4, 99, 10) == 1.0
    assert pm.lr_scale(0, 0, 10) == 1.0       # no delay, no rescaling
    assert pm.lr_scale(4, 0, 0) == 1.0        # warmup 0 = off
    assert [0.1 * pm.lr_scale(t, 0, 4) for t in (3, 2, 1, 0)] == pytest.approx([0.1 / 3, 0.05, 0.1, 0.1])
    # monotone in step
    vals = [pm.lr_scale(8, k, 16) for k in range(20)]
    assert all(a <= b for a, b in zip(vals, vals[1:]))
    with pytest.raises(ValueError, match="warmup_steps"):
        pm.lr_scale(2, 0, -1)


def test_ema_and_correction_by_hand() -> None:
    d = torch.tensor([0.0, 0.0])
    d = pm.ema_delta(d, torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]), 0.5)
    assert d.tolist() == [0.5, 1.0]
    d = pm.ema_delta(d, torch.tensor([2.0, 2.0]), torch.tensor([1.0, 2.0]), 0.5)
    assert d.tolist() == [0.75, 0.5]
    u = pm.corrected_weights(torch.tensor([10.0, 10.0]), d, tau_fwd=3, tau_bwd=1)
    assert u.tolist() == [10 - 2 * 0.75, 10 - 2 * 0.5]
    assert pm.decay_for_delay(0.25, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pm.ema_delta(d, d, d, 1.0)


def test_correction_recovers_forward_weights_under_constant_drift() -> None:
    # Weights move by a constant c per step; after enough steps delta == c, and the corrected
    # weights equal exactly the weights tau_fwd - tau_bwd steps back (what the forward used).
    c = torch.tensor([0.3, -0.1])
    w = [torch.zeros(2)]
    st = pm.PipeMareState([w[0]], tau_fwd=3, tau_bwd=0, config=pm.PipeMareConfig(decay=0.0))
    hist = [w[0].clone()]
    for _ in range(5):
        before = [w[0].clone()]
        w[0] = w[0] + c
        st.observe(before, [w[0]])
        hist.append(w[0].clone())
    (u,) = st.backward_params(w)
    assert torch.allclose(u, hist[-1 - 3])


def test_state_switches_and_roundtrip() -> None:
    p = [torch.ones(3)]
    off = pm.PipeMareState(p, 2, 0, pm.PipeMareConfig(lr_reschedule=False, discrepancy_correction=False))
    assert off.lr_factor(0) == 1.0
    off.observe([torch.zeros(3)], [torch.ones(3)])
    assert torch.equal(off.backward_params(p)[0], p[0])
    on = pm.PipeMareState(p, 2, 0, pm.PipeMareConfig(warmup_steps=4, decay=0.5))
    assert on.lr_factor(0) == pytest.approx(0.5) and on.lr_factor(2) == pytest.approx(1 / math.sqrt(2))
    on.observe([torch.zeros(3)], [torch.ones(3)])
    sd = on.state_dict()
    other = pm.PipeMareState(p, 0, 0)
    other.load_state_dict(sd)
    assert other.tau_fwd == 2 and torch.equal(other.delta[0], on.delta[0])
    with pytest.raises(ValueError, match="tau_fwd"):
        pm.PipeMareState(p, 0, 1)


def test_delays_from_schedule_versions() -> None:
    # Two-stage no-stash 1F1B with M=1 (one microbatch per minibatch), written by hand:
    # worker 0: F0 F1 B0 U0 F2 B1 U1 B2 U2 ; worker 1: F0 B0 U0 F1 B1 U1 F2 B2 U2
    w0 = ["0F0", "0F1", "0B0", "0U0", "0F2", "0B1", "0U1", "0B2", "0U2"]
    v0 = [0, 0, 0, 1, 1, 1, 2, 2, 3]          # F1 read version 0 but is updated at version 1 -> delay 1
    w1 = ["1F0", "1B0", "1U0", "1F1", "1B1", "1U1", "1F2", "1B2", "1U2"]
    v1 = [0, 0, 1, 1, 1, 2, 2, 2, 3]
    s = Schedule(
        "naive-async",
        2,
        ((0,), (1,)),
        1,
        3,
        (tuple(map(Action.parse, w0)), tuple(map(Action.parse, w1))),
        versions=(tuple(v0), tuple(v1)),
    )
    assert stage_delays(s) == {0: (1, 0), 1: (0, 0)}
    with pytest.raises(ValueError, match="no per-action weight versions"):
        stage_delays(Schedule("x", 1, ((0,),), 1, 1, ((Action.parse("0F0"),),)))
