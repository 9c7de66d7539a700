"""The partitioners' predictions against the discrete-event simulator: one cost model, two methods.

The partitioner predicts a plan's time per minibatch in closed form (:meth:`CostModel.steady_state`
for asynchronous plans, two flow shops for GPipe's fill-drain); the simulator executes the plan's
schedule event by event with the same costs (compute, per-port transfers, all-reduce). They must
agree within 10% (issue 4) on the plans the partitioners choose for PipeDream's shipped profiles
on clusters A (4x4), B (2x8) and C (4), and exactly on small hand-checkable cases.
"""

from __future__ import annotations

import math

import pytest

from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.partition import partition
from pipelab.partition.pipedream import block_workers, solve
from pipelab.partition.plan import Plan
from pipelab.partition.predict import build_plan
from pipelab.profile.records import Profile
from pipelab.sim import simulate

CLUSTERS = ("pipedream-a:4x4", "pipedream-b:2x8", "pipedream-c:4")
MODELS = ("vgg16", "resnet50", "gnmt8", "gnmt16", "alexnet")
PARTITIONERS = ("pipedream", "dp", "prefix-sum", "gpipe")

# Plans where the simulator is more than 10% slower than the closed form: (config, sim / predicted
# measured, why). The closed form takes the largest of four lower bounds (compute, busiest port,
# round trip over the minibatches in flight, and the 1F1B cycles through windows of adjacent
# unreplicated stages, which is what straight pipelines over slow links such as ResNet-50 on B 2x8
# and GNMT-16 on A 4x4 under prefix-sum settle into: both now agree within 1%); what these plans
# lose on top is a max-plus cycle of their schedule that only the simulator evaluates:
# - LOCKSTEP: a replicated stage's replicas all-reduce in lock-step (their k-th updates pair up, as
#   DDP's do) while their inputs arrive one at a time from a stage with a different replica count,
#   or their transfers share one port: the group waits for its last member every round and its
#   transfers leave in bursts that serialise on the port instead of overlapping compute.
LOCKSTEP = "lock-stepped replicas"
EXCEPTIONS: dict[tuple[str, str, str], tuple[str, float, str]] = {
    ("gnmt8", "pipedream-a:4x4", "pipedream"): ("1-1-2-1-1-2-2-2-3-1", 2.32, LOCKSTEP),
    ("gnmt16", "pipedream-c:4", "pipedream"): ("1-1-2", 1.26, LOCKSTEP),
}


@pytest.fixture(scope="module")
def profiles() -> dict[str, Profile]:
    return {m: Profile.from_pipedream(m) for m in MODELS}


def _case(profiles: dict[str, Profile], model: str, spec: str, partitioner: str) -> tuple[Plan, float] | None:
    prof, cl = profiles[model], Cluster.parse(spec)
    kw: dict[str, object] = {"microbatches": 8, "memory_limit": math.inf} if partitioner == "gpipe" else {}
    try:
        plan = partition(prof, cl, partitioner, **kw)
    except ValueError as exc:          # e.g. data parallelism of VGG-16 does not fit a 12 GB Titan X
        assert "memory" in str(exc)
        return None
    method = {"dp": "dp", "gpipe": "gpipe"}.get(partitioner, "pipedream")
    res = simulate(plan, prof, cl, method=method, microbatches=8 if partitioner == "gpipe" else None)
    return plan, res.time_per_minibatch


@pytest.mark.parametrize("partitioner", PARTITIONERS)
@pytest.mark.parametrize("spec", CLUSTERS)
@pytest.mark.parametrize("model", MODELS)
def test_simulator_agrees_with_prediction(profiles: dict[str, Profile], model: str, spec: str,
                                          partitioner: str) -> None:
    known = EXCEPTIONS.get((model, spec, partitioner))
    if known is not None:
        pytest.xfail(f"{known[2]}: {known[0]} measured sim/predicted {known[1]}")
    got = _case(profiles, model, spec, partitioner)
    if got is None:
        pytest.skip("no plan of this kind fits in memory")
    plan, sim_t = got
    assert sim_t == pytest.approx(plan.time_per_minibatch, rel=0.10), (
        plan.config,
        plan.notes.get("bottleneck"),
    )


@pytest.mark.parametrize("key", sorted(EXCEPTIONS))
def test_documented_exceptions_are_still_exceptions(
    profiles: dict[str, Profile], key: tuple[str, str, str]
) -> None:
    """The listed plans still disagree, the simulator being the slower, by the documented ratio
    (within 5%); if this fails the model or the plan changed: update or remove the entry."""
    model, spec, partitioner = key
    got = _case(profiles, model, spec, partitioner)
    assert got is not None
    plan, sim_t = got
    config, ratio, _ = EXCEPTIONS[key]
    assert plan.config == config
    assert sim_t / plan.time_per_minibatch == pytest.approx(ratio, rel=0.05)


def _chain(n: int, compute: float, cut: int, params: int = 0) -> Profile:
    return Profile.synthetic([compute / 3] * n, [2 * compute / 3] * n, out_bytes=[cut] * n,
                             param_bytes=[params] * n, batch_size=8, model="chain")


def test_middle_stage_port_carries_both_cuts_both_ways() -> None:
    """Straight pipeline, one GPU per server, transfers dominate: each middle stage's NIC sends its
    activations forward and its gradients back, so the period is 2 transfers (plus latencies), not
    one; the end stages' NICs carry one cut. The prediction and the simulator say the same."""
    prof = _chain(4, 1e-4, 10**8)
    cl = Cluster.parse("pipedream-c:4")
    cm = CostModel(prof, cl)
    x = cm.transfer_s(10**8, 0, 1)
    plan = partition(prof, cl, "prefix-sum")
    assert plan.config == "straight"
    assert plan.time_per_minibatch == pytest.approx(2 * x, rel=1e-9)
    assert plan.notes["bottleneck"].startswith("port")
    res = simulate(plan, prof, cl, method="pipedream", minibatches=40)
    assert res.time_per_minibatch == pytest.approx(2 * x, rel=0.02)
    # the DP's objective prices the same port term: the end stages take one cut, the middle ones two
    assert plan.notes["stage_port_terms_s"] == pytest.approx([x, 2 * x, 2 * x, x], rel=1e-9)


def test_round_robin_across_servers_shares_one_nic() -> None:
    """2-2-2 on three servers of two GPUs: both replicas of the middle stage send through their
    server's one NIC, activations forward and gradients back, so that NIC is busy 2 x per minibatch
    (not x / 2 per replica's link)."""
    prof = _chain(3, 1e-4, 5 * 10**7)
    cl = Cluster.preset("pipedream-a", servers=3, gpus_per_server=2)
    cm = CostModel(prof, cl)
    x = cm.transfer_s(5 * 10**7, 0, 2)
    ss = cm.steady_state([(0, 1), (1, 2), (2, 3)], [[0, 1], [2, 3], [4, 5]])
    assert max(ss.ports_s.values()) == pytest.approx(2 * x, rel=1e-9)
    assert ss.ports_s[("out", 1, 1)] == pytest.approx(2 * x, rel=1e-9)
    assert ss.ports_s[("out", 1, 0)] == pytest.approx(x, rel=1e-9)
    plan = Plan.from_boundaries(3, [1, 2], [2, 2, 2], batch_size=8)
    res = simulate(plan, prof, cl, method="pipedream", minibatches=40)
    assert res.time_per_minibatch == pytest.approx(2 * x, rel=0.03)


def test_hierarchical_plan_keeps_each_minibatch_inside_one_server() -> None:
    """A pipeline replicated per server (PipeDream's hierarchical plans): round-robin sends
    minibatch t through server t % servers on every stage, so no transfer crosses the slow network
    and the prediction (cuts on PCIe, each server's copy carrying half the minibatches) holds."""
    prof = _chain(6, 2e-2, 4 * 10**7, params=4 * 10**7)
    cl = Cluster.preset("pipedream-a", servers=2, gpus_per_server=2)
    cm = CostModel(prof, cl)
    t, bounds, reps = solve(cm, block=2)
    ranks, w = [], 0
    for m in reps:
        ranks += block_workers(cm, 2, w, m)
        w += m
    plan = build_plan(cm, bounds, [2 * m for m in reps], method="pipedream", ranks_of=ranks, block=2)
    assert plan.notes["search_objective_s"] == pytest.approx(t, rel=1e-9)
    res = simulate(plan, prof, cl, method="pipedream", minibatches=24)
    sends = [e for e in res.trace.events if e.kind == "send"]
    assert sends and all(ranks[e.worker] // 2 == ranks[e.peer] // 2 for e in sends)   # ranks -> workers
    assert res.time_per_minibatch == pytest.approx(plan.time_per_minibatch, rel=0.10)


def test_gpipe_fill_drain_with_transfers_is_two_flow_shops() -> None:
    """GPipe with unequal stages and slow links: forward phase sum(f) + sum(x) + (M-1) max(f, x),
    backward phase likewise; the simulator gives the same to float precision."""
    prof = Profile.synthetic([1e-3, 4e-3, 2e-3], [2e-3, 8e-3, 4e-3], out_bytes=[4 * 10**6] * 3,
                             batch_size=8, model="toy")
    cl = Cluster.parse("pipedream-c:3")
    M = 8
    plan = partition(prof, cl, "gpipe", microbatches=M)
    cm = CostModel(prof, cl)
    x = cm.transfer_s(4 * 10**6 // M, 0, 1)
    f, b = [1e-3 / M, 4e-3 / M, 2e-3 / M], [2e-3 / M, 8e-3 / M, 4e-3 / M]
    want = sum(f) + 2 * x + (M - 1) * max(*f, x) + sum(b) + 2 * x + (M - 1) * max(*b, x)
    assert plan.time_per_minibatch == pytest.approx(want, rel=1e-9)
    res = simulate(plan, prof, cl, method="gpipe", microbatches=M)
    assert res.time_per_minibatch == pytest.approx(want, rel=1e-6)


def test_one_f_one_b_cycle_of_two_slow_stages_over_a_slow_link() -> None:
    """Straight 3-stage pipeline (NOAM in flight 3, 2, 1), two equal slow stages joined by a slow
    link and a fast last stage: in 1F1B order stages 0 and 1 finish N_0 - N_1 + 1 = 2 minibatches per
    (their compute + the cut both ways), so the period is (2c + 2x) / 2, above compute, every port and
    the round trip; the closed form names that cycle and the simulator runs at it."""
    c = 1e-2
    cl = Cluster.parse("pipedream-c:3")
    lv = cl.link(0, 1)
    x = c / 2
    big = int((x - lv.latency) * lv.bandwidth)
    prof = Profile.synthetic([c / 3, c / 3, c / 300], [2 * c / 3, 2 * c / 3, 2 * c / 300],
                             out_bytes=[big, 1000, 1000], batch_size=8, model="toy")
    cm = CostModel(prof, cl)
    assert cm.transfer_s(big, 0, 1) == pytest.approx(x, rel=1e-9)
    ss = cm.steady_state([(0, 1), (1, 2), (2, 3)], [[0], [1], [2]], in_flight=[3, 2, 1])
    want = (2 * c + 2 * x) / 2
    assert ss.time_s == pytest.approx(want, rel=1e-9)
    assert ss.bottleneck == "1F1B cycle 0-1"
    assert max([*ss.compute_s, *ss.ports_s.values(), *ss.round_trip_s]) < 0.8 * want
    plan = Plan.from_boundaries(3, [1, 2], [1, 1, 1], batch_size=8)
    res = simulate(plan, prof, cl, method="pipedream", minibatches=40)
    assert res.time_per_minibatch == pytest.approx(want, rel=0.03)
