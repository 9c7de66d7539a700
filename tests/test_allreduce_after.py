"""The all-reduce's latency against the compute before it (``Calibration.allreduce_after``).

Oracles: the interpolation at its points, between them and beyond them; JSON round trips (old files
without the term); closed forms of the cost model's all-reduce and a replica's minibatch, and the
simulator's data-parallel all-reduce event, each at the latency of the replica's own compute."""

from __future__ import annotations

import dataclasses

import pytest
from _calibrations import bare_calibration

import pipelab as pl
from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.measured import Calibration


def _cal(**kw: object) -> Calibration:
    return bare_calibration(**{"allreduce_latency_s": 1e-3, **kw})


def test_latency_interpolates_in_the_compute_and_holds_its_end_points() -> None:
    cal = _cal(allreduce_after=((5e-3, 2e-3), (1e-3, 1e-3)))     # given out of order: sorted
    assert cal.allreduce_after == ((1e-3, 1e-3), (5e-3, 2e-3))
    assert cal.allreduce_latency(1e-3) == pytest.approx(1e-3)
    assert cal.allreduce_latency(3e-3) == pytest.approx(1.5e-3)   # halfway
    assert cal.allreduce_latency(0.0) == pytest.approx(1e-3)      # below: the first point's
    assert cal.allreduce_latency(20e-3) == pytest.approx(2e-3)    # above: the last point's, no extrapolation
    assert cal.allreduce_latency(None) == cal.allreduce_latency_s == 1e-3
    assert _cal().allreduce_latency(20e-3) == 1e-3                # not measured: the one latency
    for bad in (((1e-3,),), ((1e-3, -1.0),), ((float("nan"), 1e-3),)):
        with pytest.raises(ValueError, match="allreduce_after"):
            _cal(allreduce_after=bad)


def test_json_round_trip_and_older_files() -> None:
    cal = _cal(allreduce_after=((1e-3, 1e-3), (5e-3, 2e-3)))
    again = Calibration.from_dict(cal.to_dict())
    assert again == cal and again.allreduce_after == cal.allreduce_after
    old = cal.to_dict()
    del old["allreduce_after"]
    assert Calibration.from_dict(old).allreduce_after == ()
    assert "after 5.0 ms of compute 2000 us/step" in cal.describe()


def _cluster(cal: Calibration) -> Cluster:
    return dataclasses.replace(Cluster.flat(2, bandwidth=1e9, latency=50e-6), calibration=cal)


def test_the_cost_model_prices_the_all_reduce_at_the_replicas_compute() -> None:
    # two layers of 1 ms forward and 2 ms backward, 1 MB of weights each: a replica of both computes
    # 6 ms a minibatch (no runtime work in this calibration), so its ring latency is the 5 ms point's
    prof = pl.Profile.synthetic([1e-3, 1e-3], param_bytes=[10**6, 10**6])
    cal = _cal(allreduce_after=((1e-3, 1e-3), (5e-3, 2e-3)))
    cm = CostModel(prof, _cluster(cal), allreduce_overlap="none")
    # 2 (p - 1) alpha + 2 (p - 1) / p n / beta with p = 2: 2 alpha + n / beta
    assert cm.allreduce_s(2 * 10**6, [0, 1], 6e-3) == pytest.approx(2 * 2e-3 + 2e6 / 1e9)
    assert cm.allreduce_s(2 * 10**6, [0, 1], 3e-3) == pytest.approx(2 * 1.5e-3 + 2e6 / 1e9)
    assert cm.allreduce_s(2 * 10**6, [0, 1]) == pytest.approx(2 * 1e-3 + 2e6 / 1e9)
    assert cm.replica_time_s(0, 2, [0, 1]) == pytest.approx(6e-3 + 2 * 2e-3 + 2e6 / 1e9)
    # one layer: 3 ms of compute, halfway up the curve
    assert cm.replica_time_s(0, 1, [0, 1]) == pytest.approx(3e-3 + 2 * 1.5e-3 + 1e6 / 1e9)
    # without the points the same model gives the one latency
    flat = CostModel(prof, _cluster(_cal()), allreduce_overlap="none")
    assert flat.replica_time_s(0, 2, [0, 1]) == pytest.approx(6e-3 + 2 * 1e-3 + 2e6 / 1e9)


def test_the_simulated_all_reduce_of_data_parallelism_takes_the_replicas_latency() -> None:
    prof = pl.Profile.synthetic([1e-3, 1e-3], param_bytes=[10**6, 10**6], batch_size=8)
    cal = _cal(allreduce_after=((1e-3, 1e-3), (5e-3, 2e-3)))
    cl = _cluster(cal)
    plan = pl.partition(prof, cl, method="dp")
    res = pl.simulate(plan, prof, cl, "dp", microbatches=2, minibatches=3, allreduce_overlap="none",
                      optimizer="sgd")
    # each replica computes a forward (2 ms) and a backward (4 ms) of its microbatch between two
    # all-reduces: 6 ms, past the last point, so the ring's latency is that point's 2 ms
    work = {(e.worker, e.microbatch // 2): 0.0 for e in res.trace.compute_events() if e.kind in "FB"}
    for e in res.trace.compute_events():
        if e.kind in "FB":
            work[(e.worker, e.microbatch // 2)] += e.end_s - e.start_s
    assert set(round(w, 9) for w in work.values()) == {0.006}
    ars = [e for e in res.trace.events if e.kind == "allreduce"]
    assert ars
    want = 2 * 2e-3 + 2e6 / 1e9
    assert all(e.end_s - e.start_s == pytest.approx(want, rel=1e-6) for e in ars), \
        [e.end_s - e.start_s for e in ars]
    # and at a quarter of the batch (0.5 + 1 ms a step): an eighth of the way from 1 to 2 ms
    small = prof.at_batch_size(2)
    res = pl.simulate(plan, small, cl, "dp", microbatches=2, minibatches=3, allreduce_overlap="none",
                      optimizer="sgd")
    ars = [e for e in res.trace.events if e.kind == "allreduce"]
    assert all(e.end_s - e.start_s == pytest.approx(2 * 1.125e-3 + 2e6 / 1e9, rel=1e-6) for e in ars), \
        [e.end_s - e.start_s for e in ars]


@pytest.mark.parametrize("overlap", ["none", "ddp"])
def test_the_partitioners_matrix_takes_each_ranges_own_latency(overlap: str) -> None:
    # four layers of different weights and times, runtime work per action and per message: every
    # range's entry of the matrix is replica_time_s of that range, whose all-reduce latency is read
    # at the range's own compute
    prof = pl.Profile.synthetic([1e-3, 3e-3, 0.5e-3, 2e-3], param_bytes=[10**6, 0, 3 * 10**5, 2 * 10**6],
                                out_bytes=[100, 100, 100, 100])
    cal = _cal(allreduce_after=((1e-3, 1e-3), (8e-3, 3e-3)), overhead_s={"F": 1e-4, "B": 2e-4},
               message_s={"send": 5e-5, "recv": 3e-5})
    cm = CostModel(prof, _cluster(cal), allreduce_overlap=overlap)
    ws = [0, 1]
    steps = cm.allreduce_latency_steps(ws)
    assert steps == 2.0 and CostModel(prof, _cluster(_cal())).allreduce_latency_steps(ws) == 0.0
    M = cm.replica_time_matrix(1.0, *cm.allreduce_coeffs(ws), steps)
    for a in range(4):
        for b in range(a + 1, 5):
            assert M[a, b] == pytest.approx(cm.replica_time_s(a, b, ws), rel=1e-12), (a, b)
    # the latency does move: the whole model (about 20 ms of compute) pays the last point's 3 ms a step,
    # the one-latency matrix the calibration's 1 ms
    flat = cm.replica_time_matrix(1.0, *cm.allreduce_coeffs(ws))
    assert M[0, 4] - flat[0, 4] == pytest.approx(2 * (3e-3 - 1e-3), rel=1e-9)
