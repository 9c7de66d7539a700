"""Calibration: the fits against synthetic timings, the calibrated Cluster's JSON round trip and
provenance checks, the calibrated terms in the simulated time (closed forms), and one real run."""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _calibrations import CalibrationRun
from timing import holds_or_skip

import pipelab as pl
import pipelab.calibrate as calib
from pipelab.calibrate.fit import fit_alpha_beta, fit_ring, spread
from pipelab.cluster import Calibration, Cluster
from pipelab.costs import CostModel
from pipelab.hostload import HostLoadSampler
from pipelab.runtime import shm


def _cal(**kw: object) -> Calibration:
    base: dict[str, object] = dict(
        host=socket.gethostname(), backend="gloo", device="cpu:test", date="2026-11-25T00:00:00+00:00",
        torch="2.14.1", cores=2, workers=2, p2p_latency_s=50e-6, p2p_bandwidth=2e9,
        allreduce_latency_s=80e-6, allreduce_bandwidth=1e9,
        overhead_s={"F": 1e-4, "B": 2e-4, "W": 3e-5, "U": 4e-4},
        optimizer_s={"sgd-momentum": (5e-5, 1e-10), "sgd": (2e-5, 4e-11), "adam": (1e-4, 4e-10)},
        memory_bandwidth=1e10, spread={"p2p_latency_s": 0.1}, residual={"p2p": 0.02},
    )
    base.update(kw)
    return Calibration(**base)  # type: ignore[arg-type]


def _cluster(workers: int = 2, **kw: object) -> Cluster:
    c = _cal(**kw)
    return dataclasses.replace(Cluster.flat(workers, bandwidth=c.p2p_bandwidth, latency=c.p2p_latency_s),
                               calibration=c)


# ---------------------------------------------------------------------- fits
def test_alpha_beta_fit_recovers_known_latency_and_bandwidth() -> None:
    rng = np.random.default_rng(0)
    sizes = [4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20]
    alpha, beta = 70e-6, 2.5e9
    exact = [alpha + n / beta for n in sizes]
    a, b, res = fit_alpha_beta(sizes, exact)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9) and res < 1e-9
    noisy = [t * (1 + rng.normal(0, 0.02)) for t in exact]
    a, b, res = fit_alpha_beta(sizes, noisy)
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1) and 0 < res < 0.05
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_alpha_beta([1024, 1024], [1e-4, 1e-4])


def test_ring_fit_recovers_the_ring_model() -> None:
    alpha, beta = 40e-6, 1.5e9
    samples = [(n, p, 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta)
               for n in (1 << 12, 1 << 16, 1 << 20, 1 << 22) for p in (2, 3, 4)]
    a, b, res = fit_ring(samples)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9) and res < 1e-9
    assert spread([1.0, 1.2, 0.8]) == pytest.approx(0.4) and spread([1.0]) == 0.0


def test_the_in_run_all_reduce_gives_back_the_ring_models_latency() -> None:
    alpha, beta = 700e-6, 3e9
    for p, n in ((2, 1 << 20), (4, 1 << 22)):
        t = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta
        assert calib.ring_latency_of(t, n, beta, p) == pytest.approx(alpha, rel=1e-12)
    assert calib.ring_latency_of(1e-6, 1 << 20, 1e9) == 0.0       # faster than the bandwidth: 0, not < 0


# ---------------------------------------------------------------------- the record
def test_calibrated_cluster_round_trips_through_json(tmp_path: Path) -> None:
    cl = _cluster()
    path = cl.save(tmp_path / "cluster.json")
    back = Cluster.load(path)
    assert back == cl and back.calibration is not None
    assert back.calibration.optimizer_s["adam"] == (1e-4, 4e-10, 0.0)   # a two-term fit: 0 per tensor
    assert Cluster.parse(str(path)) == cl           # --cluster cluster.json in the CLI
    assert "calibrated on" in back.calibration.describe()
    assert not list(tmp_path.glob(".*tmp"))           # written atomically, nothing left behind


def test_bad_calibration_files_and_provenance(tmp_path: Path) -> None:
    path = _cluster().save(tmp_path / "c.json")
    text = path.read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match="not valid JSON"):
        Cluster.load(tmp_path / "cut.json")
    doc = json.loads(text)
    del doc["calibration"]["p2p_bandwidth"]
    (tmp_path / "lack.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="calibration.*p2p_bandwidth"):
        Cluster.load(tmp_path / "lack.json")
    other = _cluster(host="some-other-host").save(tmp_path / "other.json")
    with pytest.warns(UserWarning, match="calibrated on 'some-other-host'"):
        calib.load(other)
    with pytest.warns(UserWarning, match="used for backend 'nccl'"):
        calib.load(path, backend="nccl")
    with pytest.raises(ValueError, match="p2p_bandwidth"):
        _cal(p2p_bandwidth=0.0)
    with pytest.raises(ValueError, match="overhead_s has kinds"):
        _cal(overhead_s={"X": 1.0})


def test_calibrating_a_missing_backend_or_too_few_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="calibrate one of"):
        calib.calibrate(backend="mpi", progress=False)
    with pytest.raises(ValueError, match="nccl"):
        calib.calibrate(backend="nccl", progress=False)
    with pytest.raises(ValueError, match="at least 2 worker"):
        calib.calibrate(workers=1, progress=False)


# ---------------------------------------------------------------------- the terms in the simulated time
def test_one_worker_gpipe_time_is_the_closed_form_with_overhead_and_optimizer() -> None:
    # one stage: K minibatches of M forwards, M backwards and one update, nothing overlaps
    prof = pl.Profile.synthetic([1e-3, 2e-3], param_bytes=[4000, 6000], batch_size=8)
    cl = _cluster(workers=1)
    cal = cl.calibration
    assert cal is not None
    M, K = 4, 3
    sim = pl.simulate(1, prof, cl, "gpipe", microbatches=M, minibatches=K, optimizer="sgd-momentum")
    f = 3e-3 / M + cal.overhead_s["F"]
    b = 6e-3 / M + cal.overhead_s["B"]
    u = 5e-5 + 1e-10 * 10000 + cal.overhead_s["U"]
    assert sim.makespan == pytest.approx(K * (M * (f + b) + u), rel=1e-12)
    # the optimizer priced by its calibrated step, per optimizer
    cm = CostModel(prof, cl, optimizer="adam")
    assert cm.update_s(0, 2, 0) == pytest.approx(1e-4 + 4e-10 * 10000 + cal.overhead_s["U"])


def test_two_stage_transfer_uses_the_calibrated_link_and_ring() -> None:
    prof = pl.Profile.synthetic([1e-3, 1e-3], out_bytes=[1 << 20, 0], param_bytes=[1000, 1000])
    cl = _cluster(workers=2)
    cm = CostModel(prof, cl)
    assert cm.transfer_s(1 << 20, 0, 1) == pytest.approx(50e-6 + (1 << 20) / 2e9)
    # ring all-reduce over p workers: 2 (p - 1) alpha + 2 (p - 1) / p * n / beta
    assert cm.allreduce_s(8000, [0, 1]) == pytest.approx(2 * 80e-6 + 8000 / 1e9)
    # zero bubble: stage 0's B computes no input gradient, W the whole backward (as the runtime runs it)
    bi, w = cm.backward_split_s(0, 1, 0)
    assert bi == pytest.approx(2e-4) and w == pytest.approx(2e-3 + 3e-5)
    bi1, w1 = cm.backward_split_s(1, 2, 1)        # no measured split: half each
    assert bi1 == pytest.approx(1e-3 + 2e-4) and w1 == pytest.approx(1e-3 + 3e-5)


def test_a_measured_weight_gradient_share_splits_backward() -> None:
    prof = pl.Profile.synthetic([1e-3, 1e-3, 1e-3], bwd_s=[2e-3, 2e-3, 2e-3])
    layers = tuple(dataclasses.replace(layer, wgrad_s=1.5e-3) for layer in prof.layers)
    prof = dataclasses.replace(prof, layers=layers)
    cm = CostModel(prof, Cluster.flat(2))
    bi, w = cm.backward_split_s(1, 3, 0)
    # B: both layers' input gradients (0.5 ms each); W: both weight gradients and the second layer's
    # input gradient again (autograd walks the chain down to the first layer's weights)
    assert bi == pytest.approx(1e-3) and w == pytest.approx(3e-3 + 0.5e-3)


# ---------------------------------------------------------------------- a real calibration
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_calibrate_command_measures_this_machine(calibration_run: CalibrationRun) -> None:
    # the session's one calibration (tests/conftest.py) is this command, run as a user runs it
    out, proc = calibration_run.path, calibration_run.proc
    holds_or_skip(proc is not None, calibration_run.load, "the calibration did not end within 300 s")
    assert proc is not None and proc.returncode == 0, proc.stderr if proc else ""
    assert "calibrated on" in proc.stdout and "wrote" in proc.stdout
    cl = calib.load(out, backend="gloo")
    cal = cl.calibration
    assert cal is not None and cal.host == socket.gethostname() and cal.workers == 2
    # the point-to-point sweep measures the path the runtime takes by default
    assert cal.transport == ("shared memory" if shm.available("gloo") else "gloo")
    assert f"p2p ({cal.transport})" in cal.describe()
    assert 0 < cal.p2p_latency_s < 0.1 and cal.p2p_bandwidth > 1e6 and cal.memory_bandwidth > 1e8
    assert set(cal.overhead_s) == {"F", "B", "W", "U"}
    assert set(cal.optimizer_s) == {"sgd", "sgd-momentum", "adam"}
    assert all(math.isfinite(v) for v in cal.spread.values())
    # every round's raw sweep is kept: five sizes of point to point per round, five rounds by default
    assert len(cal.samples["p2p"]) == 5 * 5
    # the all-reduce's latency is the one of the in-run U's (one figure per round)
    assert len(cal.samples["allreduce_latency_in_run"]) == 5
    in_run = cal.samples["allreduce_latency_in_run"]
    assert cal.allreduce_latency_s == pytest.approx(statistics.median(in_run))
    # and at a longer compute: two points, the compute before each all-reduce growing with the batch
    (c0, a0), (c1, a1) = cal.allreduce_after
    assert 0 < c0 < c1 and a0 >= 0 and a1 >= 0 and a0 == pytest.approx(cal.allreduce_latency_s)
    # the core's message terms and the host's are apart: message_s holds the runtime's send and recv
    assert set(cal.message_s) <= {"send", "recv"} and set(cal.host_effects.terms) <= {"busy_sender"}


def test_message_work_lands_on_the_actions_that_send_and_receive() -> None:
    prof = pl.Profile.synthetic([1e-3, 1e-3, 1e-3], out_bytes=[100, 100, 0])
    cl = _cluster(workers=3, message_s={"send": 7e-5, "recv": 3e-5})
    cm = CostModel(prof, cl)
    o = cl.calibration.overhead_s  # type: ignore[union-attr]
    # the first stage sends its output and receives its gradient; the middle both; the last the reverse
    assert cm.compute_s(0, 1, 0) == pytest.approx((1e-3 + o["F"] + 7e-5, 2e-3 + o["B"] + 3e-5))
    assert cm.compute_s(1, 2, 1) == pytest.approx((1e-3 + o["F"] + 1e-4, 2e-3 + o["B"] + 1e-4))
    assert cm.compute_s(2, 3, 2) == pytest.approx((1e-3 + o["F"] + 3e-5, 2e-3 + o["B"] + 7e-5))
    assert cm.compute_s(0, 3, 0) == pytest.approx((3e-3 + o["F"], 6e-3 + o["B"]))   # one stage: none
    # the DP's replica time carries the same terms (one forward and one backward per minibatch)
    assert cm.replica_time_s(1, 2, [1]) == pytest.approx(3e-3 + o["F"] + o["B"] + 2e-4)
    T = cm.replica_time_matrix(1.0, 0.0, 0.0)
    assert T[1, 2] == pytest.approx(cm.replica_time_s(1, 2, [1]))
    assert T[0, 3] == pytest.approx(cm.replica_time_s(0, 3, [0]))


@pytest.mark.timeout(120)
def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path: Path) -> None:
    """The probe's spawned workers re-import the script; the error says so instead of 'exit code 1'."""
    script = tmp_path / "cal.py"
    script.write_text("from pipelab.calibrate import calibrate\ncalibrate(workers=2, progress=False)\n",
                      encoding="utf-8")
    with HostLoadSampler() as load:
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=100)
        except subprocess.TimeoutExpired:
            proc = None
    holds_or_skip(proc is not None, load.result, "the script did not end within 100 s")
    assert proc is not None and proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: calibration probe: worker"), last
    assert 'if __name__ == "__main__":' in last, last
