"""Partitioners against brute-force enumeration, memory limits, errors, plan contents."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelab.cluster import Cluster, Device, Level
from pipelab.costs import CostModel
from pipelab.partition import partition
from pipelab.partition.balance import balance_by_size, balance_by_time
from pipelab.partition.hetero import hetpipe_time_s, partition_virtual_worker, virtual_workers
from pipelab.partition.pipedream import solve
from pipelab.partition.predict import build_plan, search_objective
from pipelab.profile.records import Profile

FREE = float("inf")   # infinite bandwidth, zero latency: communication is free


def compositions(total, parts):
    """All ways to write ``total`` as ``parts`` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        b = [0, *cuts, total]
        yield [y - x for x, y in zip(b, b[1:])]


def free_cluster(workers, speeds=None):
    devs = tuple(Device(f"g{s}", s, 2**40) for s in (speeds or [1.0] * workers))
    return Cluster("free", (Level("free", workers, FREE, 0.0),), devs)


times = st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7)


@settings(max_examples=150, deadline=None)
@given(ts=times, workers=st.integers(1, 5), data=st.data())
def test_pipedream_matches_brute_force_with_free_communication(ts, workers, data):
    bw = data.draw(st.lists(st.floats(0.0, 10.0), min_size=len(ts), max_size=len(ts)))
    p = Profile.synthetic(ts, bw, param_bytes=[10**6] * len(ts), out_bytes=[10**6] * len(ts))
    c = free_cluster(workers)
    comp = [f + b for f, b in zip(ts, bw)]
    best = math.inf
    for S in range(1, min(len(ts), workers) + 1):
        for sizes in compositions(len(ts), S):
            for reps in compositions(workers, S):
                loads, a = [], 0
                for sz, r in zip(sizes, reps):
                    loads.append(sum(comp[a:a + sz]) / r)
                    a += sz
                best = min(best, max(loads))
    plan = partition(p, c, "pipedream")
    assert plan.time_per_minibatch == pytest.approx(best, rel=1e-9)
    assert plan.num_workers == workers
    straight_best = math.inf
    if len(ts) >= workers:
        for sizes in compositions(len(ts), workers):
            b = np.cumsum([0, *sizes])
            straight_best = min(straight_best, max(sum(comp[b[i]:b[i + 1]]) for i in range(workers)))
        sp = partition(p, c, "pipedream", straight=True)
        assert sp.time_per_minibatch == pytest.approx(straight_best, rel=1e-9)
        assert set(sp.replicas) == {1}
        # prefix-sum (Lv et al.) solves the straight problem too
        ps = partition(p, c, "prefix-sum", buffers=None)
        assert ps.time_per_minibatch == pytest.approx(straight_best, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5))
def test_pipedream_is_optimal_over_its_plan_space_with_real_communication(seed, n):
    """With links, all-reduce and ports priced, the DP equals exhaustive evaluation of every plan
    under the same objective (search_objective: compute and each stage's port load, both cuts,
    both directions), and the plan's prediction is the full steady state of the one cost model."""
    rng = np.random.default_rng(seed)
    p = Profile.synthetic(list(rng.uniform(1e-3, 2e-2, n)), list(rng.uniform(1e-3, 4e-2, n)),
                          out_bytes=[int(x) for x in rng.integers(1, 5 * 10**7, n)],
                          param_bytes=[int(x) for x in rng.integers(0, 5 * 10**7, n)])
    c = Cluster.preset("pipedream-a", servers=2, gpus_per_server=2)
    cm = CostModel(p, c)
    best, exact_best = math.inf, math.inf
    for S in range(1, min(n, 4) + 1):
        for sizes in compositions(n, S):
            bounds = [int(b) for b in np.cumsum(sizes)[:-1]]
            for reps in compositions(4, S):
                exact_best = min(
                    exact_best, build_plan(cm, bounds, reps, method="x").time_per_minibatch
                )
                comp, port = search_objective(cm, bounds, reps)
                # the oracle's own arithmetic: stage-by-stage transfers on the stage's own ports
                cuts, w, mine = [0, *bounds, n], 0, []
                for s_, m in enumerate(reps):
                    x = [0.0, 0.0]
                    lv = [None, None]
                    for d, (a, b, bd) in enumerate(
                        ((w - 1, w, cuts[s_] - 1), (w + m - 1, w + m, cuts[s_ + 1] - 1))
                    ):
                        if 0 <= a and b < 4 and a // 2 != b // 2:   # crosses servers: server NIC
                            lv[d] = 1
                            srv = max(sum(1 for r in range(w, w + m) if r // 2 == k) for k in (0, 1))
                            x[d] = (25e-6 + p.cut_bytes[bd] / c.levels[1].bandwidth) * srv / m
                        elif 0 <= a and b < 4:                       # inside a server: each GPU's port
                            lv[d] = 0
                            x[d] = (5e-6 + p.cut_bytes[bd] / c.levels[0].bandwidth) / m
                    mine.append(x[0] + x[1] if lv[0] == lv[1] else max(x))
                    w += m
                assert port == pytest.approx(mine, rel=1e-9, abs=1e-15)
                best = min(best, max(*comp, *port))
    flat_t, flat_bounds, flat_reps = solve(cm)
    assert flat_t == pytest.approx(best, rel=1e-9)
    flat = build_plan(cm, flat_bounds, flat_reps, method="x")
    assert flat.notes["search_objective_s"] == pytest.approx(best, rel=1e-9)
    ws = [list(st_.ranks) for st_ in flat.stages]
    ss = cm.steady_state(
        [(st_.start, st_.end) for st_ in flat.stages], ws, in_flight=[st_.in_flight for st_ in flat.stages]
    )
    assert flat.time_per_minibatch == pytest.approx(ss.time_s, rel=1e-12)
    assert flat.time_per_minibatch >= max(ss.compute_s) * (1 - 1e-12)
    # hierarchical layouts: a pipeline over the 2 GPUs of a server, replicated in both servers
    best_h, plan_h = math.inf, None
    for S in range(1, min(n, 2) + 1):
        for sizes in compositions(n, S):
            bounds = [int(b) for b in np.cumsum(sizes)[:-1]]
            for reps in compositions(2, S):
                comp, port = search_objective(cm, bounds, reps, block=2)
                if max(*comp, *port) < best_h:
                    best_h = max(*comp, *port)
                    ranks, w = [], 0
                    for m in reps:
                        ranks += [x + srv * 2 for x in range(w, w + m) for srv in range(2)]
                        w += m
                    plan_h = build_plan(cm, bounds, [2 * m for m in reps], method="x",
                                        ranks_of=ranks, block=2)
    hier_t, hier_bounds, hier_reps = solve(cm, block=2)
    assert hier_t == pytest.approx(best_h, rel=1e-9)
    # the partitioner returns the candidate with the best full steady state: flat and per-server
    # DP optima (boundaries then refined on the steady state), the best straight pipeline, data
    # parallelism
    cands = [flat.time_per_minibatch, plan_h.time_per_minibatch,
             build_plan(cm, [], [4], method="x").time_per_minibatch]
    if n >= 4:
        st_bounds = solve(cm, straight=True)[1]
        cands.append(build_plan(cm, st_bounds, [1] * 4, method="x").time_per_minibatch)
    got = partition(p, c, "pipedream")
    # refine_bounds only moves boundaries to better steady states; nothing beats exhaustive search
    assert got.time_per_minibatch <= min(cands) * (1 + 1e-9)
    assert got.time_per_minibatch >= min(exact_best, plan_h.time_per_minibatch) * (1 - 1e-9)
    if "layout" in got.notes:   # each server holds a replica of every stage; cuts stay inside servers
        ws = got.notes["workers"]
        assert all({ws[r] // 2 for r in st_.ranks} == {0, 1} for st_ in got.stages)
        # round-robin keeps minibatch t inside server t % 2 on every stage
        assert all(ws[st_.ranks[t % st_.replicas]] // 2 == t % 2 for st_ in got.stages for t in range(8))


@settings(max_examples=100, deadline=None)
@given(ts=times, data=st.data())
def test_prefix_sum_heterogeneous_speeds_matches_brute_force(ts, data):
    S = data.draw(st.integers(1, len(ts)))
    speeds = data.draw(st.lists(st.floats(0.25, 4.0), min_size=S, max_size=S))
    p = Profile.synthetic(ts)
    c = free_cluster(S, speeds)
    comp = [3 * t for t in ts]
    best = min(max(sum(comp[b[i]:b[i + 1]]) / speeds[i] for i in range(S))
               for sizes in compositions(len(ts), S) for b in [np.cumsum([0, *sizes])])
    plan = partition(p, c, "prefix-sum")
    assert plan.time_per_minibatch == pytest.approx(best, rel=1e-9)
    assert plan.num_stages == S


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=8), data=st.data())
def test_balance_matches_brute_force(costs, data):
    k = data.draw(st.integers(1, len(costs)))
    best = min(max(sum(costs[b[i]:b[i + 1]]) for i in range(k))
               for sizes in compositions(len(costs), k) for b in [np.cumsum([0, *sizes])])
    for fn in (balance_by_time, balance_by_size):
        sizes = fn(k, costs)
        assert len(sizes) == k and sum(sizes) == len(costs) and min(sizes) >= 1
        b = np.cumsum([0, *sizes])
        assert max(sum(costs[b[i]:b[i + 1]]) for i in range(k)) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_hetpipe_virtual_worker_matches_brute_force():
    rng = np.random.default_rng(3)
    ts = list(rng.uniform(0.1, 1.0, 6))
    p = Profile.synthetic(ts)
    speeds = [1.0, 2.0, 0.5]
    c = free_cluster(3, speeds)
    cm = CostModel(p, c)
    t, bounds, order = partition_virtual_worker(cm, [0, 1, 2])
    comp = [3 * x for x in ts]
    best = min(max(sum(comp[b[i]:b[i + 1]]) / speeds[o[i]] for i in range(3))
               for o in itertools.permutations(range(3))
               for sizes in compositions(6, 3) for b in [np.cumsum([0, *sizes])])
    assert t == pytest.approx(best, rel=1e-9)


def _hetpipe_brute_force(cm, vws, memory_limit=None):
    """min over every shared split and every device order of every VW (independently) of hetpipe_time_s."""
    n, k = cm.num_layers, len(vws[0])
    best = math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        c = [0, *cuts, n]
        need = [cm.memory_bytes(c[s], c[s + 1], versions=k - s, in_flight=k - s)["total"] for s in range(k)]
        for orders in itertools.product(*[list(itertools.permutations(v)) for v in vws]):
            lims = [[memory_limit or cm.cluster.memory(o[s]) for s in range(k)] for o in orders]
            if all(need[s] <= lim[s] for lim in lims for s in range(k)):
                best = min(best, hetpipe_time_s(cm, list(cuts), orders).time_s)
    return best


@pytest.mark.parametrize("seed,policy,servers,types,tight", [
    (0, "ED", 3, "VRG", False), (1, "HD", 4, "VRGQ", False), (2, "ED", 3, "VRG", True),
    (3, "HD", 4, "VRGQ", True), (4, "HD", 4, "VRGQ", False)])
def test_hetpipe_shared_split_matches_brute_force(seed, policy, servers, types, tight):
    """VWs of different GPUs share one split: the plan is the best split and orders, and its prediction
    is the objective it minimised (HD: two kinds of VW, so the best split for the slowest VW alone
    can be far from the best shared one)."""
    rng = np.random.default_rng(seed)
    n = 7
    c = Cluster.hetpipe(servers=servers, gpus_per_server=2, types=types)
    p = Profile.synthetic(list(rng.uniform(1e-3, 2e-2, n)), list(rng.uniform(1e-3, 4e-2, n)),
                          out_bytes=[int(x) for x in rng.uniform(1e6, 1e8, n)], param_bytes=[10**8] * n)
    cm = CostModel(p, c)
    vws = virtual_workers(c, policy)
    limit = None
    if tight:   # just too little memory for the unconstrained plan
        free = partition(p, c, "hetpipe", policy=policy, memory_limit=2**50)
        limit = max(free.memory_per_worker) - 1
    plan = partition(p, c, "hetpipe", policy=policy, memory_limit=limit)
    best = _hetpipe_brute_force(cm, vws, limit)
    assert math.isfinite(best)
    assert plan.time_per_minibatch == pytest.approx(best, rel=1e-9)
    bounds = [st.start for st in plan.stages[1:]]
    assert hetpipe_time_s(cm, bounds, plan.notes["vw_orders"]).time_s == pytest.approx(
        plan.time_per_minibatch
    )
    if limit is not None:
        assert max(plan.memory_per_worker) <= limit
        assert plan.time_per_minibatch >= free.time_per_minibatch * (1 - 1e-12)


def test_hetpipe_policies_and_plan():
    c = Cluster.preset("hetpipe")
    ed = virtual_workers(c, "ED")
    assert len(ed) == 4 and all(len({c.devices[w].name for w in vw}) == 4 for vw in ed)
    np_ = virtual_workers(c, "NP")
    assert all(len({c.devices[w].name for w in vw}) == 1 for vw in np_)
    hd = virtual_workers(c, "HD")
    assert sorted(w for vw in hd for w in vw) == list(range(16))
    with pytest.raises(ValueError, match="policy"):
        virtual_workers(c, "XX")
    rng = np.random.default_rng(0)
    p = Profile.synthetic(list(rng.uniform(1e-3, 1e-2, 12)), param_bytes=[10**6] * 12, out_bytes=[10**5] * 12)
    plan = partition(p, c, "hetpipe")
    assert plan.replicas == (4, 4, 4, 4) and plan.num_workers == 16
    assert plan.time_per_minibatch > 0 and plan.speedup_over_dp > 0


def _vgg_like():
    # big early activations, big late weights: the shape that makes PipeDream pick "15-1"
    n = 8
    return Profile.synthetic([0.01] * n, [0.02] * n, out_bytes=[4 * 10**8] * 4 + [10**6] * 4,
                             param_bytes=[10**6] * 6 + [4 * 10**8] * 2, batch_size=64, model="toy")


def test_memory_limit_changes_plan_or_raises():
    p = _vgg_like()
    c = Cluster.preset("pipedream-a", servers=2, gpus_per_server=2)
    free = partition(p, c, "pipedream", memory_limit=1e15)
    need = max(free.memory_per_worker)
    tight = partition(p, c, "pipedream", memory_limit=need - 1)
    assert max(tight.memory_per_worker) <= need - 1
    assert tight.time_per_minibatch >= free.time_per_minibatch
    with pytest.raises(ValueError, match="fits in memory"):
        partition(p, c, "pipedream", memory_limit=10**6)
    with pytest.raises(ValueError, match="fits in memory"):
        partition(p, c, "prefix-sum", memory_limit=10**6)
    with pytest.raises(ValueError, match="fits in memory|memory"):
        partition(p, c, "dp", memory_limit=10**6)


def test_plan_contents_and_dp_consistency():
    p = _vgg_like()
    c = Cluster.preset("pipedream-a", servers=2, gpus_per_server=2)
    plan = partition(p, c, "pipedream", memory_limit=1e15)
    dp = partition(p, c, "dp", memory_limit=1e15)
    assert dp.config == "4" and dp.speedup_over_dp == pytest.approx(1.0)
    assert plan.speedup_over_dp == pytest.approx(dp.time_per_minibatch / plan.time_per_minibatch)
    assert plan.time_per_minibatch <= dp.time_per_minibatch * (1 + 1e-12)   # DP is in the search space
    assert plan.stages[0].in_flight == math.ceil(4 / plan.stages[0].replicas)
    assert all(s.versions == s.in_flight for s in plan.stages)
    assert plan.profile_fingerprint == p.fingerprint() and plan.batch_size == 64 and plan.cluster == c.name
    assert len(plan.memory_per_worker) == 4
    g = partition(p, c, "gpipe", microbatches=8)
    assert g.config == "straight" and all(s.versions == 1 for s in g.stages)
    assert g.notes["bubble_fraction"] == pytest.approx(3 / 11)


def test_bad_input_errors():
    p = Profile.synthetic([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown partition method"):
        partition(p, Cluster.flat(2), "magic")
    with pytest.raises(ValueError, match="unknown cluster preset"):
        partition(p, "nowhere:2x2")
    with pytest.raises(ValueError, match="at least 4 layers"):
        partition(p, Cluster.flat(4), "pipedream", straight=True)
    with pytest.raises(ValueError, match="at most 2"):
        partition(p, Cluster.flat(4), "prefix-sum")
    with pytest.raises(TypeError, match="does not take"):
        partition(p, Cluster.flat(2), "dp", straight=True)
    with pytest.raises(ValueError, match="partitions"):
        balance_by_time(3, [1.0, 2.0])


def test_compression_lowers_cut_cost():
    p = _vgg_like()
    c = Cluster.preset("pipedream-a", servers=1, gpus_per_server=4)
    a = partition(p, c, "prefix-sum", memory_limit=1e15)
    b = partition(p, c, "prefix-sum", memory_limit=1e15, compression=4.0)
    assert b.time_per_minibatch <= a.time_per_minibatch
    with pytest.raises(TypeError, match="compression_ratio"):   # the old keyword is gone
        partition(p, c, "prefix-sum", memory_limit=1e15, compression_ratio=4.0)
    assert max(b.notes["cut_terms_s"]) < max(a.notes["cut_terms_s"]) or not a.notes["cut_terms_s"]


def test_workers_subset():
    p = _vgg_like()
    c = Cluster.preset("pipedream-a", servers=4, gpus_per_server=4)
    plan = partition(p, c, "pipedream", workers=[4, 5, 6, 7], memory_limit=1e15)
    assert plan.num_workers == 4 and plan.notes["workers"] == [4, 5, 6, 7]
