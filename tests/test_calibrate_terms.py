"""The calibration terms of issue 14's accuracy work: the optimizer's per-tensor cost and the model's
compute factor inside a run. Oracles: fits on synthetic timings, closed forms of the cost model and of
a simulated run, JSON round-trips (old files without the terms included)."""

from __future__ import annotations

import dataclasses
import json
import socket

import numpy as np
import pytest
from torch import nn

from pipelab.calibrate.fit import fit_step
from pipelab.calibrate.model import factors
from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.measured import Calibration
from pipelab.partition.plan import Plan
from pipelab.profile.measure import profile as measure_profile
from pipelab.profile.records import Layer, Profile
from pipelab.sim.simulate import simulate
from pipelab.trace import Event, Trace


def _cal(**kw: object) -> Calibration:
    base: dict[str, object] = dict(
        host=socket.gethostname(), backend="gloo", device="cpu:test", date="2026-11-25T00:00:00+00:00",
        torch="2.14.1", cores=2, workers=2, p2p_latency_s=50e-6, p2p_bandwidth=2e9,
        allreduce_latency_s=80e-6, allreduce_bandwidth=1e9,
        overhead_s={"F": 1e-4, "B": 2e-4, "W": 3e-5, "U": 4e-4},
        optimizer_s={"sgd-momentum": (5e-5, 1e-10, 6e-6)},
        memory_bandwidth=1e10,
    )
    base.update(kw)
    return Calibration(**base)  # type: ignore[arg-type]


def _cluster(workers: int = 1, **kw: object) -> Cluster:
    c = _cal(**kw)
    return dataclasses.replace(Cluster.flat(workers, bandwidth=c.p2p_bandwidth, latency=c.p2p_latency_s),
                               calibration=c)


def _profile(tensors: tuple[int | None, ...] = (2, 0, 2)) -> Profile:
    layers = tuple(
        Layer(name=f"l{i}", kind="Linear", fwd_s=1e-3 * (i + 1), bwd_s=2e-3 * (i + 1), out_bytes=4096,
              param_bytes=40_000 * (i + 1), fwd_fixed_s=1e-4, bwd_fixed_s=2e-4, wgrad_s=1e-3 * (i + 1),
              param_tensors=t)
        for i, t in enumerate(tensors)
    )
    return Profile(layers=layers, cut_bytes=(4096,) * (len(layers) - 1), batch_size=32)


# ---------------------------------------------------------------------- the optimizer's per-tensor term
def test_fit_step_recovers_fixed_per_byte_and_per_tensor_seconds() -> None:
    rng = np.random.default_rng(1)
    a, b, c = 20e-6, 90e-12, 5.5e-6
    rows = [(n, k, (a + b * n + c * k) * (1 + 0.01 * rng.standard_normal()))
            for n in (1 << 16, 1 << 20, 1 << 23) for k in (4, 32)]
    fa, fb, fc, res = fit_step(rows)
    assert fa == pytest.approx(a, rel=0.15)
    assert fb == pytest.approx(b, rel=0.05)
    assert fc == pytest.approx(c, rel=0.05)
    assert res < 0.03


def test_fit_step_refuses_rows_that_cannot_separate_the_terms() -> None:
    with pytest.raises(ValueError, match="two tensor counts"):
        fit_step([(1 << 16, 4, 1e-4), (1 << 20, 4, 2e-4), (1 << 23, 4, 9e-4)])


def test_update_prices_every_parameter_tensor() -> None:
    prof = _profile((2, 0, 2))
    cm = CostModel(prof, _cluster(), optimizer="sgd-momentum")
    nbytes = 40_000 + 80_000 + 120_000
    assert cm.param_tensors(0, 3) == 4
    assert cm.update_s(0, 3, 0) == pytest.approx(5e-5 + 1e-10 * nbytes + 6e-6 * 4 + 4e-4)
    # a profile that did not count tensors (PipeDream's, older files): no per-tensor seconds
    cm_old = CostModel(_profile((None, None, None)), _cluster(), optimizer="sgd-momentum")
    assert cm_old.update_s(0, 3, 0) == pytest.approx(5e-5 + 1e-10 * nbytes + 4e-4)


def test_the_profiler_counts_parameter_tensors_per_layer() -> None:
    import torch

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2, bias=False))
    prof = measure_profile(model, torch.randn(8, 4), progress=False, repeats=1, small_batch=None)
    assert [layer.param_tensors for layer in prof.layers] == [2, 0, 1]
    again = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert [layer.param_tensors for layer in again.layers] == [2, 0, 1]


def test_layer_rejects_a_negative_tensor_count() -> None:
    with pytest.raises(ValueError, match="param_tensors"):
        Layer(name="x", kind="Linear", fwd_s=1.0, bwd_s=1.0, out_bytes=1, param_bytes=1, param_tensors=-1)


# ---------------------------------------------------------------------- the compute factor
def test_compute_factor_scales_the_layers_in_every_formula() -> None:
    prof = _profile()
    plain = CostModel(prof, _cluster(2))
    scaled = CostModel(prof, _cluster(2, compute_factor={"F": 1.5, "B": 0.8}))
    for start, end in ((0, 1), (1, 3), (0, 3)):
        f0, b0 = plain.layers_s(start, end, 0, microbatches=4)
        f1, b1 = scaled.layers_s(start, end, 0, microbatches=4)
        assert (f1, b1) == pytest.approx((1.5 * f0, 0.8 * b0))
        # the zero-bubble split keeps its shares: B and W both scale with the backward's factor
        bi0, w0 = plain.backward_split_s(start, end, 0, microbatches=4)
        bi1, w1 = scaled.backward_split_s(start, end, 0, microbatches=4)
        work_b = plain.runtime_work_s(start, end)[1]
        assert bi1 - work_b == pytest.approx(0.8 * (bi0 - work_b))
        assert w1 - 3e-5 == pytest.approx(0.8 * (w0 - 3e-5))
        # the replica time (the DP partitioner's) is the same formula: F + B of the whole minibatch
        one0, one1 = plain.replica_time_s(start, end, [0]), scaled.replica_time_s(start, end, [0])
        lf0, lb0 = plain.layers_s(start, end, 0)
        assert one1 - one0 == pytest.approx(0.5 * lf0 - 0.2 * lb0)


def test_simulated_minibatch_of_one_stage_is_the_closed_form_with_factor_and_tensors() -> None:
    prof = _profile()
    kf, kb, M, K = 1.25, 1.1, 4, 3
    cl = _cluster(1, compute_factor={"F": kf, "B": kb})
    plan = Plan.from_boundaries(len(prof), [], batch_size=prof.batch_size)
    res = simulate(plan, prof, cl, "gpipe", microbatches=M, minibatches=K, optimizer="sgd-momentum")
    fwd = sum(la.fwd_fixed_s + (la.fwd_s - la.fwd_fixed_s) / M for la in prof.layers)
    bwd = sum(la.bwd_fixed_s + (la.bwd_s - la.bwd_fixed_s) / M for la in prof.layers)
    nbytes = sum(la.param_bytes for la in prof.layers)
    u = 5e-5 + 1e-10 * nbytes + 6e-6 * 4 + 4e-4
    want = M * (kf * fwd + 1e-4 + kb * bwd + 2e-4) + u
    assert res.time_per_minibatch == pytest.approx(want, rel=1e-9)


def test_factors_recover_a_known_factor_from_a_synthetic_trace() -> None:
    prof = _profile()
    cl = _cluster(2)
    cm = CostModel(prof, cl)
    ranges, M = [(0, 1), (1, 3)], 2
    kf, kb = 1.3, 0.9
    events, t = [], 0.0
    for m in range(3 * M):
        for s, (a, b) in enumerate(ranges):
            for kind, k in (("F", kf), ("B", kb)):
                i = "FB".index(kind)
                dur = cm.runtime_work_s(a, b)[i] + k * cm.layers_s(a, b, s, M)[i]
                if m < M:
                    dur *= 5           # the first minibatch warms up: left out
                events.append(Event(s, s, kind, m, t, t + dur))
                t += dur
    got = factors(Trace.from_events(events), ranges, cm, M)
    assert got == pytest.approx({"F": kf, "B": kb})


# ---------------------------------------------------------------------- JSON, old files
def test_calibration_round_trips_with_the_new_terms() -> None:
    cal = _cal(compute_factor={"F": 1.2, "B": 1.05}, compute_model="cnn")
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal
    assert again.factor("W") == 1.05 and again.optimizer_s["sgd-momentum"] == (5e-5, 1e-10, 6e-6)
    assert "1.20x" in again.describe() and "us/tensor" in again.describe()


def test_a_calibration_file_without_the_new_terms_loads_neutral(tmp_path: object) -> None:
    d = _cal().to_dict()
    d["optimizer_s"] = {"sgd-momentum": [5e-5, 1e-10]}      # the two-term fit of older files
    del d["compute_factor"], d["compute_model"]
    cal = Calibration.from_dict(d)
    assert cal.optimizer_s["sgd-momentum"] == (5e-5, 1e-10, 0.0)
    assert cal.factor("F") == cal.factor("B") == 1.0
    assert cal.optimizer_step_s("sgd-momentum", 1000, tensors=7) == pytest.approx(5e-5 + 1e-7)


@pytest.mark.parametrize("bad", [{"U": 1.1}, {"F": 0.0}, {"B": float("nan")}])
def test_a_bad_compute_factor_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="compute_factor"):
        _cal(compute_factor=bad)


def test_calibrate_model_needs_a_calibrated_cluster() -> None:
    from pipelab.calibrate.model import calibrate_model

    with pytest.raises(ValueError, match="calibrated cluster"):
        calibrate_model(Cluster.flat(2), nn.Identity, list, nn.functional.mse_loss, _profile(),
                        optimizer=lambda ps: None)  # type: ignore[arg-type, return-value]


def test_model_runs_refuse_too_few_rounds_or_steps() -> None:
    from pipelab.calibrate import ModelRuns

    with pytest.raises(ValueError, match="repeats=1"):
        ModelRuns(repeats=1)
    with pytest.raises(ValueError, match="steps=2"):
        ModelRuns(steps=2)
    assert ModelRuns().repeats == 3
