"""The cost model prices CUDA stages over gloo: a message pays a device-to-host copy, the host
transfer and a host-to-device copy (closed form), and the simulator's run gets slower by exactly the
copies on the critical path of a straight two-stage pipeline."""

from __future__ import annotations

import pytest

from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.profile.records import Profile
from pipelab.sim import simulate


def _setup() -> tuple[Profile, Cluster]:
    prof = Profile.synthetic([1e-3] * 4, [2e-3] * 4, out_bytes=[4_000_000] * 4, param_bytes=[1000] * 4)
    return prof, Cluster.flat(2, bandwidth=1e9, latency=0.0)


def test_staged_transfer_is_two_copies_plus_the_host_transfer() -> None:
    prof, cl = _setup()
    plain = CostModel(prof, cl)
    staged = CostModel(prof, cl, host_staging_bandwidth=8e9)
    n = 4_000_000
    assert plain.transfer_s(n, 0, 1) == pytest.approx(n / 1e9)
    assert staged.transfer_s(n, 0, 1) == pytest.approx(n / 1e9 + 2 * n / 8e9)
    assert staged.staging_s(n) == pytest.approx(1e-3)
    assert staged.transfer_s(n, 1, 1) == 0.0          # a hand-off on one worker copies nothing
    fp16 = CostModel(prof, cl, compression_ratio=2.0, host_staging_bandwidth=8e9)
    assert fp16.staging_s(n) == pytest.approx(0.5e-3)  # the copies move the compressed bytes
    assert staged.allreduce_s(n, [0, 1]) == pytest.approx(plain.allreduce_s(n, [0, 1]) + 2 * n / 8e9)
    with pytest.raises(ValueError, match="host_staging_bandwidth=0"):
        CostModel(prof, cl, host_staging_bandwidth=0)


def test_simulated_gpipe_slows_by_the_copies() -> None:
    prof, cl = _setup()
    a = simulate(2, prof, cl, method="gpipe", microbatches=1, minibatches=1)
    b = simulate(2, prof, cl, method="gpipe", microbatches=1, minibatches=1, host_staging_bandwidth=8e9)
    # one microbatch: one activation forward and one gradient back on the critical path, 2 copies each
    n = prof.cut_bytes[1]
    assert b.time_per_minibatch - a.time_per_minibatch == pytest.approx(2 * 2 * n / 8e9, rel=1e-9)
