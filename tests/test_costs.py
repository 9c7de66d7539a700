"""The cost model against closed forms and a step-by-step event oracle."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelab.cluster import Cluster, Device, Level
from pipelab.costs import CostModel
from pipelab.profile.records import Profile


def _prof(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return Profile.synthetic(list(rng.uniform(1e-3, 1e-2, n)), list(rng.uniform(1e-3, 2e-2, n)),
                             out_bytes=[int(x) for x in rng.integers(1, 10**6, n)],
                             param_bytes=[int(x) for x in rng.integers(0, 10**7, n)], batch_size=8)


def test_compute_transfer_closed_forms():
    p = _prof()
    c = Cluster.flat(4, bandwidth=2e9, latency=1e-5, speed=2.0)
    cm = CostModel(p, c, compression_ratio=2.0)
    f, b = cm.compute_s(1, 4, 0, microbatches=4)
    assert f == pytest.approx(sum(layer.fwd_s for layer in p.layers[1:4]) / 2 / 4)
    assert b == pytest.approx(sum(layer.bwd_s for layer in p.layers[1:4]) / 2 / 4)
    assert cm.cut_bytes(2, 3) == math.ceil(p.cut_bytes[2] / 3)
    assert cm.transfer_s(10**9, 0, 3) == pytest.approx(1e-5 + 1e9 / 2 / 2e9)
    assert cm.transfer_s(10**9, 2, 2) == 0.0
    with pytest.raises(ValueError, match="compression_ratio"):
        CostModel(p, c, compression_ratio=0.5)
    with pytest.raises(ValueError, match="optimizer"):
        CostModel(p, c, optimizer="lion?")
    with pytest.raises(ValueError, match="empty or outside"):
        cm.compute_s(3, 3, 0)


def test_allreduce_ring_and_hierarchy():
    p = _prof()
    flat = CostModel(p, Cluster.flat(8, bandwidth=1e9, latency=0.0))
    assert flat.allreduce_s(8 * 10**6, range(8)) == pytest.approx(2 * 7 / 8 * 8e6 / 1e9)
    assert flat.allreduce_s(10**6, [3]) == 0.0
    a = CostModel(p, Cluster.preset("pipedream-a", servers=4, gpus_per_server=4))
    pcie, eth = a.cluster.levels
    nb = 10**8
    inside = 2 * 3 / 4 * nb / pcie.bandwidth + 2 * 3 * pcie.latency
    across = 2 * 3 / 4 * nb / eth.bandwidth + 2 * 3 * eth.latency
    assert a.allreduce_s(nb, range(4)) == pytest.approx(inside)
    assert a.allreduce_s(nb, [0, 4, 8, 12]) == pytest.approx(across)
    assert a.allreduce_s(nb, range(16)) == pytest.approx(inside + across)
    # DGX: the 8 GPUs of a server drive 8 adapters at once, each at NCCL's measured bus bandwidth
    h = CostModel(p, Cluster.preset("dgx-h100", servers=2))
    ib = h.cluster.levels[1]
    assert ib.ring_bandwidth < ib.bandwidth
    assert h.allreduce_s(nb, [0, 8]) == pytest.approx(nb / ib.ring_bandwidth + 2 * ib.latency)
    two_each = h.allreduce_s(nb, [0, 1, 8, 9]) - h.allreduce_s(nb, [0, 1])
    assert two_each == pytest.approx(nb / (2 * ib.ring_bandwidth) + 2 * ib.latency)


def _replica_oracle(p, a, b, kappa, fixed, speed):
    """Event-by-event: backward from layer b-1 to a, one all-reduce at a time in backward order."""
    t = sum(layer.fwd_s for layer in p.layers[a:b]) / speed
    comm_free = 0.0
    for layer in reversed(p.layers[a:b]):
        t += layer.bwd_s / speed
        comm_free = max(comm_free, t) + kappa * layer.param_bytes
    has = any(layer.param_bytes for layer in p.layers[a:b])
    return max(t, comm_free) + (fixed if has and kappa else 0.0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 7), bw=st.floats(1e8, 1e11))
def test_replica_time_matches_event_oracle(seed, n, bw):
    p = _prof(n, seed)
    c = Cluster("t", (Level("l", 4, bw, 1e-5),), (Device("g", 1.5),) * 4)
    cm = CostModel(p, c)
    kappa, fixed = cm.allreduce_coeffs(range(4))
    M = cm.replica_time_matrix(1.5, kappa, fixed)
    for a in range(n):
        for b in range(a + 1, n + 1):
            want = _replica_oracle(p, a, b, kappa, fixed, 1.5)
            assert cm.replica_time_s(a, b, range(4)) == pytest.approx(want, rel=1e-9)
            assert M[a, b] == pytest.approx(want, rel=1e-9)
    assert cm.replica_time_s(0, n, [0]) == pytest.approx((p.fwd_s + p.bwd_s) / 1.5)


def test_memory_parts():
    p = Profile.synthetic([1.0] * 3, param_bytes=[100, 0, 50], out_bytes=[10, 20, 30], input_bytes=7)
    cm = CostModel(p, Cluster.flat(2), optimizer="adam")
    m = cm.memory_bytes(0, 2, versions=3, in_flight=4, microbatches=2)
    assert m["weights"] == 100 and m["stashed_weights"] == 200 and m["gradients"] == 100
    assert m["optimizer"] == 200
    assert m["activations"] == 4 * math.ceil((10 + 20 + 7) / 2)
    assert m["total"] == sum(v for k, v in m.items() if k != "total")
    P, A = cm.memory_arrays(2)
    assert P[0, 2] == 100 and A[1, 3] == math.ceil((20 + 30 + 10) / 2)


def test_nan_or_negative_costs_rejected():
    with pytest.raises(ValueError, match="finite number"):
        Profile.synthetic([1.0, float("nan")])
    with pytest.raises(ValueError):
        Profile.synthetic([1.0, -2.0])


def _overlap_prof():
    # F = (1, 2, 3) ms, B = (2, 4, 6) ms, weights (0, 4, 2) MB: layer 0 has none
    return Profile.synthetic([1e-3, 2e-3, 3e-3], [2e-3, 4e-3, 6e-3], param_bytes=[0, 4 * 10**6, 2 * 10**6])


def test_allreduce_overlap_closed_forms():
    """2 workers at 1 GB/s, 0.1 ms latency: kappa = 2 (p-1)/p / bw = 1 ns/byte, fixed = 2 (p-1) lat = 0.2 ms.
    ddp: F + max_l [B(l..end) + kappa P(start..l]] + fixed = 6 + max(12 + 0, 10 + 4, 6 + 6) + 0.2 = 20.2 ms;
    none: F + B + kappa P + fixed = 6 + 12 + 6 + 0.2 = 24.2 ms (all-reduce after backward)."""
    p = _overlap_prof()
    cl = Cluster.flat(2, bandwidth=1e9, latency=1e-4)
    ddp, none = CostModel(p, cl), CostModel(p, cl, allreduce_overlap="none")
    assert ddp.allreduce_overlap == "ddp"
    assert ddp.allreduce_coeffs([0, 1]) == pytest.approx((1e-9, 2e-4))
    assert ddp.replica_time_s(0, 3, [0, 1]) == pytest.approx(20.2e-3)
    assert none.replica_time_s(0, 3, [0, 1]) == pytest.approx(24.2e-3)
    # [1, 3): ddp 3+2+... = F 5 + max(10 + 4, 6 + 6) + 0.2; none 5 + 10 + 6 + 0.2
    assert ddp.replica_time_s(1, 3, [0, 1]) == pytest.approx(19.2e-3)
    assert none.replica_time_s(1, 3, [0, 1]) == pytest.approx(21.2e-3)
    # no weights in [0, 1): nothing to reduce, no latency either; one worker: no all-reduce at all
    assert none.replica_time_s(0, 1, [0, 1]) == pytest.approx(3e-3)
    assert none.replica_time_s(0, 3, [1]) == pytest.approx(18e-3)
    # the partitioner's matrix form agrees on every range
    kappa, fixed = none.allreduce_coeffs([0, 1])
    for cm in (ddp, none):
        M = cm.replica_time_matrix(1.0, kappa, fixed)
        for a in range(3):
            for b in range(a + 1, 4):
                assert M[a, b] == pytest.approx(cm.replica_time_s(a, b, [0, 1]), rel=1e-12)
    with pytest.raises(ValueError, match="allreduce_overlap"):
        CostModel(p, cl, allreduce_overlap="async")


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 7), bw=st.floats(1e8, 1e11))
def test_no_overlap_is_never_faster(seed, n, bw):
    """With the all-reduce after backward a replica is never faster than with DDP's overlap, and
    the difference is at most the whole all-reduce (what DDP can hide)."""
    p = _prof(n, seed)
    cl = Cluster("t", (Level("l", 4, bw, 1e-5),), (Device("g", 1.0),) * 4)
    ddp, none = CostModel(p, cl), CostModel(p, cl, allreduce_overlap="none")
    for a in range(n):
        for b in range(a + 1, n + 1):
            t_ddp, t_none = ddp.replica_time_s(a, b, range(4)), none.replica_time_s(a, b, range(4))
            ar = ddp.allreduce_s(ddp.param_bytes(a, b), range(4))
            compute = sum(ddp.compute_s(a, b, 0))
            assert t_none == pytest.approx(compute + ar, rel=1e-12)
            assert t_ddp <= t_none * (1 + 1e-12) and t_none - t_ddp <= ar * (1 + 1e-9)


def test_partition_allreduce_overlap():
    """Two layers, F = 1 ms, B = 2 ms each, weights only in the last layer, whose 2 ms all-reduce DDP
    hides behind layer 0's backward: DP takes 6/2 = 3 ms per minibatch with overlap and 8/2 = 4 ms
    without; the straight pipeline takes 3 ms either way, so its speed-up over DP is 1 and 4/3."""
    from pipelab.partition import partition

    p = Profile.synthetic([1e-3, 1e-3], [2e-3, 2e-3], param_bytes=[0, 2 * 10**6], batch_size=8)
    cl = Cluster.flat(2, bandwidth=1e9)   # kappa = 1 ns/byte: 2 MB take 2 ms
    for overlap, dp_ms in (("ddp", 3e-3), ("none", 4e-3)):
        dp = partition(p, cl, method="dp", allreduce_overlap=overlap)
        assert dp.time_per_minibatch == pytest.approx(dp_ms)
        assert dp.notes["allreduce_overlap"] == overlap
        straight = partition(p, cl, method="pipedream", straight=True, allreduce_overlap=overlap)
        assert straight.time_per_minibatch == pytest.approx(3e-3)
        assert straight.speedup_over_dp == pytest.approx(dp_ms / 3e-3)
    with pytest.raises(ValueError, match="allreduce_overlap"):
        partition(p, cl, method="dp", allreduce_overlap="DDP!")


def test_allreduce_bandwidth_replaces_the_links_in_the_ring_only():
    """A measured all-reduce bandwidth (half the links' here) doubles the ring's per-byte term and
    leaves point-to-point transfers and the latency term as they are."""
    p = _overlap_prof()
    cl = Cluster.flat(4, bandwidth=1e9, latency=1e-4)
    base, slow = CostModel(p, cl), CostModel(p, cl, allreduce_bandwidth=0.5e9, allreduce_overlap="none")
    nb = 6 * 10**6
    assert base.allreduce_s(nb, range(4)) == pytest.approx(2 * 3 / 4 * nb / 1e9 + 6e-4)
    assert slow.allreduce_s(nb, range(4)) == pytest.approx(2 * 3 / 4 * nb / 0.5e9 + 6e-4)
    assert slow.transfer_s(10**6, 0, 1) == base.transfer_s(10**6, 0, 1)
    assert slow.replica_time_s(0, 3, range(4)) == pytest.approx(18e-3 + 2 * 3 / 4 * nb / 0.5e9 + 6e-4)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="allreduce_bandwidth"):
            CostModel(p, cl, allreduce_bandwidth=bad)


def test_microbatch_time_is_affine_in_the_cost_model_and_the_simulator():
    """With fixed parts, a microbatch of 1/M of the minibatch costs fixed + (t - fixed) / M in the
    cost model and in every simulated F and B (and so the GPipe makespan); without them
    (PipeDream's profiles) it is t / M as before."""
    from dataclasses import replace

    from pipelab import simulate
    from pipelab.partition.plan import Plan

    base = Profile.synthetic([4e-3, 4e-3], [8e-3, 8e-3], out_bytes=[0, 0], batch_size=8)
    prof = Profile(layers=tuple(replace(layer, fwd_fixed_s=2e-3, bwd_fixed_s=4e-3) for layer in base.layers),
                   cut_bytes=base.cut_bytes, batch_size=8)
    cl = Cluster.flat(2, bandwidth=1e12, latency=0.0)
    M = 4
    f, b = CostModel(prof, cl).compute_s(0, 1, 0, microbatches=M)
    assert (f, b) == pytest.approx((2e-3 + 2e-3 / M, 4e-3 + 4e-3 / M))
    assert CostModel(base, cl).compute_s(0, 1, 0, microbatches=M) == pytest.approx((1e-3, 2e-3))
    plan = Plan.from_boundaries(2, [1])
    sim = simulate(plan, prof, cl, method="gpipe", microbatches=M, minibatches=2)
    durations = {
        (e.kind, round(e.end_s - e.start_s, 9)) for e in sim.trace.compute_events() if e.kind in "FB"
    }
    assert durations == {("F", round(f, 9)), ("B", round(b, 9))}
    # GPipe, 2 equal stages, no transfers: (M + 1) forwards and (M + 1) backwards per minibatch
    assert sim.time_per_minibatch == pytest.approx((M + 1) * (f + b), rel=0.02)
