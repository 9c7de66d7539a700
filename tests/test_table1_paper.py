"""PipeDream's Table 1 as PipeDream ran it: transports, batch rescaling, PipeDream's own configurations,
and the committed simulated table against what the code writes now."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import pipelab as pl
from pipelab.cluster import NCCL_NCV3_PCIE_BUS_BANDWIDTH, V100_PCIE_OVER_SXM2
from pipelab.costs import CostModel
from pipelab.models import pipedream_profile
from pipelab.transports import GLOO_ALLREDUCE_BUS_BANDWIDTH, NCCL_TCP_BUS_BANDWIDTH, nccl_flat_ring
from reproductions.pipedream_table1 import paper as tp
from reproductions.pipedream_table1.paper import DDP_BUCKET_BYTES, nccl24_tree_threshold
from reproductions.pipedream_table1.pipedream_conf import (
    available,
    load_config,
    plan_from_pipedream,
    stage_bounds,
)
from reproductions.pipedream_table1.rows import TABLE1, simulate_plan

RESULTS = Path(__file__).resolve().parents[1] / "reproductions" / "pipedream_table1" / "results.csv"


def test_gloo_host_and_nccl_ring_rates_by_hand() -> None:
    base = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4)
    gloo = base.with_transport("gloo-host", "gloo-ring")
    nccl = base.with_transport("link", "nccl-ring")
    # gloo: device->host copy, TCP (loopback = a host copy inside a server; Ethernet across), host->device
    assert gloo.levels[0].transfer_bandwidth == pytest.approx(1 / (3 / 10e9))
    assert gloo.levels[1].transfer_bandwidth == pytest.approx(1 / (2 / 10e9 + 8 / 10e9))
    # gloo's all-reduce: the ring on the host at the slower of the path (loopback priced as a host copy
    # inside; the Ethernet across) and gloo's published host-side rate, 2 * 3/4 * 20 MB in 10,608 us
    assert GLOO_ALLREDUCE_BUS_BANDWIDTH == pytest.approx(2.828e9, rel=1e-3)
    assert gloo.levels[0].ring_bandwidth == pytest.approx(GLOO_ALLREDUCE_BUS_BANDWIDTH)
    assert gloo.levels[1].ring_bandwidth == pytest.approx(10e9 / 8)
    one_core = base.with_transport("gloo-host", "gloo-ring",
                                   gloo_allreduce_bandwidth=tp.GLOO_ALLREDUCE_ONE_CORE)
    assert [lv.ring_bandwidth for lv in one_core.levels] == [1.073e9, 1.073e9]
    assert one_core.levels[1].transfer_bandwidth == gloo.levels[1].transfer_bandwidth   # sends unchanged
    for bad in (0.0, math.inf, "fast"):
        with pytest.raises(ValueError, match="gloo_allreduce_bandwidth"):
            base.with_transport("gloo-host", "gloo-ring", gloo_allreduce_bandwidth=bad)  # type: ignore[arg-type]
    assert nccl.levels[1].ring_bandwidth == NCCL_TCP_BUS_BANDWIDTH["ethernet-10g"] == pytest.approx(0.75e9)
    assert nccl.levels[0].ring_bandwidth == 10e9
    assert nccl.levels[1].transfer_bandwidth == base.levels[1].bandwidth
    n = 100_000_000
    cm = CostModel(pl.Profile.synthetic([1.0, 1.0], out_bytes=[n, 0], param_bytes=[n, 0]), gloo)
    lat = base.levels[1].latency
    assert cm.transfer_s(n, 0, 4) == pytest.approx(lat + n / 1e9)      # across servers
    assert cm.transfer_s(n, 0, 1) == pytest.approx(base.levels[0].latency + 3 * n / 10e9)
    cmn = CostModel(pl.Profile.synthetic([1.0, 1.0], out_bytes=[n, 0], param_bytes=[n, 0]), nccl)
    ring = 2 * 3 / 4 * n / 10e9 + 2 * 3 / 4 * n / 0.75e9 + 2 * 3 * (base.levels[0].latency + lat)
    assert cmn.allreduce_s(n, range(16)) == pytest.approx(ring)
    assert base.with_transport() == base   # "link" changes nothing
    with pytest.raises(ValueError, match="pipeline="):
        base.with_transport("tcp")
    with pytest.raises(ValueError, match="allreduce="):
        base.with_transport(allreduce="mpi")
    with pytest.raises(ValueError, match="p2p_bandwidth"):
        pl.cluster.Level("x", 2, 1e9, p2p_bandwidth=0.0)


def test_nccl_flat_ring_is_the_bus_bandwidth_formula_over_every_rank() -> None:
    # nccl-tests' definition of bus bandwidth: t = S / B * 2 (n - 1) / n over all n ranks, B the slowest
    # link's (here NCCL's bus bandwidth over 25 Gbps TCP), latency one hop per step of the ring
    n = 100_000_000
    prof = pl.Profile.synthetic([1.0, 1.0], out_bytes=[n, 0], param_bytes=[n, 0])
    base = pl.Cluster.preset("pipedream-b", servers=2, gpus_per_server=8)
    nccl = base.with_transport("link", "nccl-ring")
    flat = tp.PaperSetting().clusters(TABLE1[1])[1]
    assert [lv.size for lv in flat.levels] == [16] and len(flat.devices) == 16
    assert flat.levels == nccl_flat_ring(nccl.levels)
    lat = base.levels[1].latency
    want = 2 * 15 / 16 * n / 1.7e9 + 2 * 15 * lat
    assert CostModel(prof, flat).allreduce_s(n, range(16)) == pytest.approx(want)
    # the hierarchical ring crosses the NIC with 2 (p - 1) / p = 1 of the bytes on two servers, the flat
    # one with 1.875: NCCL's ring is the slower
    hier = CostModel(prof, nccl).allreduce_s(n, range(16))
    assert hier == pytest.approx(2 * 7 / 8 * n / 50e9 + n / 1.7e9 + 2 * 7 * base.levels[0].latency + 2 * lat)
    assert hier < want
    # one server: the ring never leaves it, so the flat ring runs at the server's link, as before
    one = pl.Cluster.preset("pipedream-a", servers=1, gpus_per_server=4).with_transport("link", "nccl-ring")
    (lv,) = nccl_flat_ring(one.levels)
    assert lv.size == 4 and lv.ring_bandwidth == one.levels[0].bandwidth
    with pytest.raises(ValueError, match="nccl_ring="):
        tp.PaperSetting(nccl_ring="tree").clusters(TABLE1[0])


def test_choice_by_simulation_takes_the_fastest_candidate() -> None:
    # pipelab's choice is the fastest simulated of the partitioner's plan, its straight pipeline and DP,
    # each simulated on its own cluster: the chosen time is the minimum of the three, and it is DP's
    # exactly when DP is the fastest
    setting = tp.PaperSetting()
    for row in (TABLE1[3], TABLE1[9]):     # ResNet-50 B 2x8, GNMT-16 B 2x8
        prof = setting.profile(row.model)
        pipe_cl, dp_cl = setting.clusters(row)
        chosen, dp, is_dp, t, t_dp = tp.row_choice(prof, pipe_cl, dp_cl, setting, minibatches=16)
        opt = setting.optimizer_of(row.model)     # the row's own, as row_choice takes it
        times = [t_dp]
        for straight in (False, True):
            plan = pl.partition(prof, pipe_cl, method="pipedream", straight=straight, optimizer=opt)
            if plan.num_stages > 1:
                times.append(simulate_plan(plan, prof, pipe_cl, minibatches=16,
                                           optimizer=opt).time_per_minibatch)
        assert t == pytest.approx(min(times))
        assert is_dp == (t == t_dp) and (chosen is dp) == is_dp
    with pytest.raises(ValueError, match="choose="):
        tp.row_choice(prof, pipe_cl, dp_cl, tp.PaperSetting(choose="guess"))


def test_partitioner_and_simulator_price_a_transfer_alike() -> None:
    # one transfer-bound two-stage pipeline: the partitioner's prediction and the simulated steady state
    # both follow the transport (the one formula path), and gloo's path is slower than the link's
    prof = pl.Profile.synthetic([1e-3, 1e-3], out_bytes=[200_000_000, 0], param_bytes=[0, 0])
    times = {}
    for transport in ("link", "gloo-host"):
        cl = pl.Cluster.preset("pipedream-a", servers=2, gpus_per_server=1).with_transport(transport)
        plan = pl.partition(prof, cl, method="pipedream", straight=True, memory_limit=math.inf)
        sim = pl.simulate(plan, prof, cl, method="pipedream", minibatches=32)
        x = CostModel(prof, cl).transfer_s(200_000_000, 0, 1)
        assert plan.time_per_minibatch == pytest.approx(x, rel=0.05)   # full duplex: one transfer per port
        assert sim.time_per_minibatch == pytest.approx(plan.time_per_minibatch, rel=0.05)
        times[transport] = sim.time_per_minibatch
    assert times["gloo-host"] == pytest.approx(times["link"] * 1.25 / 1.0, rel=0.05)


def test_at_batch_size_affine_times_linear_bytes() -> None:
    prof = pl.models.pipedream_profile("vgg16")
    half = prof.at_batch_size(64)
    assert half.batch_size == 64 and "rescaled from batch 128 to 64" in half.source
    assert half.fwd_s == pytest.approx(prof.fwd_s / 2) and half.param_bytes == prof.param_bytes
    assert half.cut_bytes[5] == round(prof.cut_bytes[5] / 2)
    assert prof.at_batch_size(128) is prof
    fixed = pl.Profile(layers=(pl.Profile.synthetic([1.0]).layers[0].__class__(
        name="l", kind="Linear", fwd_s=1.0, bwd_s=2.0, out_bytes=8, param_bytes=4, fwd_fixed_s=0.2,
        bwd_fixed_s=0.5),), cut_bytes=(), batch_size=8)
    quarter = fixed.at_batch_size(2)
    assert quarter.layers[0].fwd_s == pytest.approx(0.2 + 0.8 / 4)
    assert quarter.layers[0].bwd_s == pytest.approx(0.5 + 1.5 / 4) and quarter.layers[0].out_bytes == 2
    with pytest.raises(ValueError, match="batch_size"):
        prof.at_batch_size(0)


def test_pipedream_configs_map_onto_the_profiles() -> None:
    assert set(tp.PAPER_CONFIGS.values()) - {"dp"} == set(available())
    vgg = load_config("vgg16/gpus=16/hybrid_conf")
    prof = pl.models.pipedream_profile("vgg16")
    assert vgg.replicas == (15, 1)
    # every convolution on the replicated stage, the three fully connected layers on the last worker
    (b,) = stage_bounds(prof, vgg)
    assert [layer.kind for layer in prof.layers[b:]].count("Linear") == 3
    assert "Linear" not in [layer.kind for layer in prof.layers[:b]]
    plan = plan_from_pipedream(prof, vgg)
    assert plan.config == "15-1" and plan.stages[1].ranks == (15,)
    g16 = plan_from_pipedream(pl.models.pipedream_profile("gnmt16"), "gnmt_large/gpus=16/mp_conf")
    assert g16.config == "straight" and g16.num_stages == 14 and g16.num_workers == 14
    g8 = plan_from_pipedream(pl.models.pipedream_profile("gnmt8"), "gnmt/gpus=12/mp_conf")
    assert g8.num_stages == 10
    with pytest.raises(ValueError, match="parameter-carrying"):
        plan_from_pipedream(pl.models.pipedream_profile("resnet50"), vgg)
    with pytest.raises(ValueError, match="no shipped"):
        load_config("nope")


def test_profiling_gpu_speed_from_the_cited_throughput() -> None:
    r = pl.models.pipedream_profile("resnet50")
    assert tp.profiling_gpu_speed() == pytest.approx(367.0 * (r.fwd_s + r.bwd_s) / r.batch_size)


def test_committed_simulated_table_matches_the_code() -> None:
    """results.csv (written by make reproduce) holds what simulate_row computes now, for every row:
    a change to the cost model, the simulator or the defaults that moves a number fails here until the
    table is regenerated."""
    committed = pd.read_csv(RESULTS)
    assert len(committed) == len(TABLE1)
    for row, (_, old) in zip(TABLE1, committed.iterrows()):
        new = tp.simulate_row(row)
        for key, value in new.items():
            assert key in old.index, f"results.csv lacks column {key}; regenerate it (make reproduce)"
            was = old[key]
            if isinstance(value, float) or isinstance(was, float):
                same = (value is None and math.isnan(float(was))) or float(was) == pytest.approx(float(value))
            else:
                same = str(was) == str(value)
            assert same, f"{row.key}: {key} is {value!r} now but results.csv says {was!r}; regenerate"


def test_transport_levels_round_trip_and_describe() -> None:
    cl = pl.Cluster.preset("pipedream-b", servers=2, gpus_per_server=8)
    cl = cl.with_transport("gloo-host", "nccl-ring")
    assert pl.Cluster.from_dict(cl.to_dict()) == cl
    assert "all-reduce bus 1.7 GB/s" in cl.describe() and "transfers at" in cl.describe()
    # a sub-cluster keeps the transport
    sub = cl.subset(range(8))
    assert sub.levels[0].p2p_bandwidth == cl.levels[0].p2p_bandwidth


def test_sensitivity_default_cell_is_the_table() -> None:
    """sensitivity.csv's cell at the cited defaults holds the same simulated rows as results.csv."""
    sens = pd.read_csv(RESULTS.with_name("sensitivity.csv"))
    table = pd.read_csv(RESULTS)
    speed = tp.profiling_gpu_speed()
    cell = sens[(abs(sens["device_speed"] - speed) < 1e-9) & (sens["nccl_scale"] == 1.0)]
    assert list(cell["config"]) == list(table["config"])
    assert list(cell["simulated_speedup"]) == pytest.approx(list(table["simulated_speedup"]))
    assert list(cell["paper_config_error"]) == pytest.approx(list(table["paper_config_error"]))
    # alternatives.csv: its "defaults" records are the table too, and every alternative covers every row
    alt = pd.read_csv(RESULTS.with_name("alternatives.csv"))
    assert set(alt["alternative"]) == set(tp.ALTERNATIVES)
    assert (alt.groupby("alternative")["key"].count() == len(TABLE1)).all()
    d = alt[alt["alternative"] == "defaults"]
    assert list(d["config"]) == list(table["config"])
    assert list(d["error"]) == pytest.approx(list(table["error"]))


def test_alternatives_change_only_their_term() -> None:
    # each cited alternative differs from the defaults in one term: the tree on two servers moves only the
    # two-server rows' DP baseline (to the ring per level, whose Ethernet hop carries each byte once), the
    # one-core gloo rate only plans with replicated stages, and the defaults' records are the table
    rows = [TABLE1[1], TABLE1[2], TABLE1[4]]      # VGG-16 B 2x8, ResNet-50 A 4x4, GNMT-8 A 1x4
    df = pd.DataFrame(tp.alternatives(["defaults", "nccl-tree-two-servers", "gloo-one-core"], rows=rows,
                                      minibatches=16))
    by = {(r.alternative, r.key): r for r in df.itertuples()}
    for row in rows:
        d = tp.simulate_row(row, tp.PaperSetting(), minibatches=16)
        assert by[("defaults", row.key)].error == d["error"]
        assert by[("defaults", row.key)].sim_dp_ms == d["sim_dp_ms"]
    vgg_b, rn_a, gnmt_a = (r.key for r in rows)
    hier = tp.simulate_row(rows[0], tp.PaperSetting(nccl_ring="hierarchical"), minibatches=16)
    assert by[("nccl-tree-two-servers", vgg_b)].sim_dp_ms == hier["sim_dp_ms"] \
        < by[("defaults", vgg_b)].sim_dp_ms
    for key in (rn_a, gnmt_a):      # four servers and one server: NCCL's flat ring as in the defaults
        assert by[("nccl-tree-two-servers", key)].sim_dp_ms == by[("defaults", key)].sim_dp_ms
    # GNMT-8's straight pipeline has no replicated stage: gloo's all-reduce rate does not touch it
    assert by[("gloo-one-core", gnmt_a)].sim_plan_ms == by[("defaults", gnmt_a)].sim_plan_ms
    md = tp.alternatives_markdown(df)
    assert "| defaults |" in md and "nccl-tree-two-servers" in md
    with pytest.raises(ValueError, match="unknown alternative"):
        tp.alternatives(["faster"])


def test_optimizer_is_pipedreams_per_model() -> None:
    # PipeDream trained the image models with momentum SGD and GNMT with Adam; Adam's two moments make
    # a stage's optimizer step stream 5 parameter bytes per byte where momentum streams 4
    s = tp.PaperSetting()
    assert [s.optimizer_of(m) for m in ("vgg16", "resnet50", "gnmt8", "gnmt16")] == \
        ["sgd-momentum", "sgd-momentum", "adam", "adam"]
    assert tp.PaperSetting(optimizer="sgd").optimizer_of("gnmt8") == "sgd"
    prof = pl.Profile.synthetic([1.0, 1.0], param_bytes=[10**9, 0])
    cl = pl.Cluster.preset("pipedream-a", servers=1, gpus_per_server=4)
    adam = CostModel(prof, cl, optimizer="adam").update_s(0, 2, 0)
    sgd = CostModel(prof, cl, optimizer="sgd-momentum").update_s(0, 2, 0)
    assert adam / sgd == pytest.approx(5 / 4)
    assert tp.simulate_row(TABLE1[4], s, minibatches=16)["optimizer"] == "adam"


def test_gnmt_profiles_record_one_batchs_sentence_length() -> None:
    # PipeDream's translation profiler reads activation sizes off one batch: the first embedding's output
    # is S x batch x 1024 floats, S = 48 tokens in GNMT-8's profile (batch 32), 25 in GNMT-16's (batch 128)
    assert tp.profiled_tokens("gnmt8") == 48 and tp.profiled_tokens("gnmt16") == 25
    with pytest.raises(ValueError, match="no embedding"):
        tp.profiled_tokens("vgg16")
    prof = tp.PaperSetting().profile("gnmt8")
    short = tp.PaperSetting(activation_tokens={"gnmt8": 24}).profile("gnmt8")
    assert [la.fwd_s for la in short.layers] == [la.fwd_s for la in prof.layers]          # times as profiled
    assert [la.param_bytes for la in short.layers] == [la.param_bytes for la in prof.layers]
    assert [la.out_bytes for la in short.layers] == [round(la.out_bytes / 2) for la in prof.layers]
    assert list(short.cut_bytes) == [round(c / 2) for c in prof.cut_bytes]
    assert short.input_bytes == round(prof.input_bytes / 2)
    assert "from 48 to 24 tokens" in short.source
    vgg = tp.PaperSetting(activation_tokens={"gnmt8": 24}).profile("vgg16")
    assert vgg == tp.PaperSetting().profile("vgg16")
    with pytest.raises(ValueError, match="factor="):
        tp.with_activation_scale(prof, 0.0, "none")


def test_gloo_all_reduce_is_one_flat_ring_through_the_group() -> None:
    # gloo runs one ring through a replica group's ranks: every rank moves 2 (P - 1) / P of the bytes, the
    # ring at its slowest crossed link; the hierarchical ring per level stays the default elsewhere
    base = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4)
    gloo = base.with_transport("gloo-host", "gloo-ring")
    assert gloo.allreduce_ring == "flat" and base.allreduce_ring == "hierarchical"
    assert base.with_transport("link", "nccl-ring").allreduce_ring == "hierarchical"
    prof = pl.Profile.synthetic([1.0, 1.0], param_bytes=[10**8, 0])
    cm = CostModel(prof, gloo)
    lat = base.levels[1].latency
    kappa, fixed = cm.allreduce_coeffs(range(12))             # three servers of four
    assert kappa == pytest.approx(2 * 11 / 12 / (10e9 / 8)) and fixed == pytest.approx(2 * 11 * lat)
    inside = cm.allreduce_coeffs(range(4))                     # one server: the loopback at gloo's rate
    assert inside == pytest.approx((2 * 3 / 4 / GLOO_ALLREDUCE_BUS_BANDWIDTH, 2 * 3 * base.levels[0].latency))
    hier = CostModel(prof, replace(gloo, allreduce_ring="hierarchical")).allreduce_coeffs(range(12))
    assert hier[0] == pytest.approx(2 * 3 / 4 / GLOO_ALLREDUCE_BUS_BANDWIDTH + 2 * 2 / 3 / (10e9 / 8))
    assert kappa < hier[0]
    # kept by save/load and by sub-clusters (the partitioners' blocks), checked on construction
    assert pl.Cluster.from_dict(gloo.to_dict()) == gloo
    assert "allreduce_ring" not in base.to_dict()
    assert gloo.subset(range(8)).allreduce_ring == "flat"
    assert "flat ring" in gloo.describe()
    with pytest.raises(ValueError, match="allreduce_ring="):
        replace(base, allreduce_ring="tree")


def test_pipedream_partition_refines_from_the_straight_optimum_too() -> None:
    # GNMT-8 on one server of 4 with its activations at 40 tokens: the DP's bounds [10, 23, 41] tie on its
    # stage-additive objective with the prefix-sum optimum, and their one-boundary-at-a-time refinement
    # stopped at [14, 23, 41] (42.2 ms), while [9, 27, 40] fits and takes 39.4 ms by the same steady state
    # (the plan of the 48-token profile): the returned plan must be no slower than that witness
    setting = tp.PaperSetting(activation_tokens={"gnmt8": 40})
    prof = setting.profile("gnmt8")
    pipe, _ = setting.clusters(TABLE1[4])
    plan = pl.partition(prof, pipe, method="pipedream", optimizer="adam")
    cm = CostModel(prof, pipe, optimizer="adam")
    cuts = [0, 9, 27, 40, len(prof)]
    witness = cm.steady_state(list(zip(cuts[:-1], cuts[1:])), [[0], [1], [2], [3]], in_flight=[4, 3, 2, 1])
    assert plan.config == "straight"
    assert plan.time_per_minibatch <= witness.time_s * (1 + 1e-9)


def test_nccl24_picks_its_tree_on_cluster_b_and_its_ring_on_cluster_a() -> None:
    # NCCL 2.4's ncclTreeThreshold by hand: ring 6 us per step, tree 15 us per node level + 4 us per rank
    # in a node; tree bandwidth 2/3 of the ring's on PCIe, 3/4 with NVLink, doubled on two NVLink nodes
    assert nccl24_tree_threshold(2, 16, nvlink=True, channels=4) == math.inf     # cluster B: always the tree
    ring, tree = 5000.0, 5000.0 * 2 / 3
    assert nccl24_tree_threshold(4, 16, nvlink=False) == pytest.approx(
        ring * tree / (ring - tree) * (6 * 15 - (15 * 2 + 4 * 3)))                 # cluster A 4x4: 480 kB
    assert nccl24_tree_threshold(3, 12, nvlink=False) == pytest.approx(
        ring * tree / (ring - tree) * (6 * 11 - (15 * 1 + 4 * 3)))                 # A 3x4: 390 kB
    assert nccl24_tree_threshold(1, 4, nvlink=False) == 0.0                       # one server: the ring
    assert max(nccl24_tree_threshold(4, 16, False), nccl24_tree_threshold(3, 12, False)) < DDP_BUCKET_BYTES
    with pytest.raises(ValueError, match="nodes="):
        nccl24_tree_threshold(0, 4, nvlink=False)
    # the alternative applies the tree exactly where NCCL 2.4 would for DDP's 25 MiB buckets: cluster B
    tree = tp.PaperSetting(nccl_ring="two-server-tree")
    flat = tp.PaperSetting()
    for row in TABLE1:
        same = tree.clusters(row)[1].levels == flat.clusters(row)[1].levels
        assert same == (row.cluster != "pipedream-b"), row.key


def test_dp_inside_a_cluster_a_server_runs_at_nccls_rate_measured_on_ncv3() -> None:
    # NCCL's ring inside an Azure NCv3 server (cluster A): the measured 6.88 GB/s bus bandwidth, not the PCIe
    # link's 10 GB/s; the Ethernet levels keep NCCL's TCP rates, cluster B's NVLink its link rate
    assert NCCL_NCV3_PCIE_BUS_BANDWIDTH == 6.88e9 < pl.Cluster.preset("pipedream-a").levels[0].bandwidth
    assert tp.PAPER_NCCL_BUS_BANDWIDTH == {**NCCL_TCP_BUS_BANDWIDTH, "pcie": 6.88e9}
    one = next(r for r in TABLE1 if r.key == "gnmt8/pipedream-a/1x4")
    dp = tp.PaperSetting().clusters(one)[1]
    (lv,) = dp.levels
    assert lv.size == 4 and lv.ring_bandwidth == 6.88e9
    n = 775_000_000
    prof = pl.Profile.synthetic([1.0, 1.0], out_bytes=[n, 0], param_bytes=[n, 0])
    want_s = 2 * 3 / 4 * n / 6.88e9 + 2 * 3 * lv.latency
    assert CostModel(prof, dp).allreduce_s(n, range(4)) == pytest.approx(want_s)
    # the replaced default, kept as a cited alternative: the link's rate
    (old,) = tp.ALTERNATIVES["pcie-link-rate"][2].clusters(one)[1].levels
    assert old.ring_bandwidth == 10e9
    # it moves only one-server rows: across servers the flat ring runs at the Ethernet's slower rate
    link_rate = tp.ALTERNATIVES["pcie-link-rate"][2]
    for row in TABLE1:
        same = link_rate.clusters(row)[1].levels == tp.PaperSetting().clusters(row)[1].levels
        assert same == (row.servers > 1 or row.cluster != "pipedream-a"), row.key
    # the sensitivity grid scales NCCL's TCP rates only
    grid = tp.sensitivity([tp.profiling_gpu_speed()], [0.5], rows=[one], minibatches=16)
    half = {k: v / 2 for k, v in NCCL_TCP_BUS_BANDWIDTH.items()}
    want = tp.simulate_row(one, tp.PaperSetting(nccl_bus_bandwidth={**tp.PAPER_NCCL_BUS_BANDWIDTH, **half}),
                           minibatches=16)
    default = tp.simulate_row(one, minibatches=16)
    assert grid[0]["simulated_speedup"] == want["simulated_speedup"] == default["simulated_speedup"]


def test_cluster_a_runs_v100_pcie_cards_at_the_datasheets_ratio() -> None:
    # the cited speed is a DGX-1's (SXM2) V100; cluster A's PCIe cards run at 14 / 15.7 of it, cluster B's
    # SXM2 modules at it
    assert tp.V100_PCIE_OVER_SXM2 == pytest.approx(14 / 15.7)
    sxm2 = tp.profiling_gpu_speed()
    a = next(r for r in TABLE1 if r.key == "resnet50/pipedream-a/4x4")
    b = next(r for r in TABLE1 if r.key == "resnet50/pipedream-b/2x8")
    s = tp.PaperSetting()
    assert s.speed_of(a) == pytest.approx(sxm2 * 14 / 15.7) and s.speed_of(b) == sxm2
    for cl in s.clusters(a):
        assert cl.speed(0) == pytest.approx(sxm2 * 14 / 15.7)
    assert s.clusters(b)[0].speed(0) == pytest.approx(sxm2)
    # per model, 1 for a model the dict does not name; the earlier default is a cited alternative
    per = tp.PaperSetting(pcie_v100_factor={"resnet50": 0.85})
    assert per.speed_of(a) == pytest.approx(0.85 * sxm2)
    assert per.speed_of(next(r for r in TABLE1 if r.key == "gnmt8/pipedream-a/1x4")) == sxm2
    assert tp.ALTERNATIVES["v100-sxm2-on-a"][2].speed_of(a) == sxm2
    for bad in (0.0, -1.0, math.inf, True, {"vgg16": 0.0}):
        with pytest.raises(ValueError, match="pcie_v100_factor"):
            tp.PaperSetting(pcie_v100_factor=bad).speed_of(b)  # type: ignore[arg-type]


def test_plain_partition_and_simulate_on_the_preset_give_the_reproductions_row() -> None:
    """VGG-16 on cluster A, 4 x 4: the preset with PipeDream's transports (gloo for the pipeline, NCCL for
    the DP baseline) and V100 PCIe cards gives Table 1's row as the reproduction computes it (4.85x)."""
    row = next(r for r in TABLE1 if r.key == "vgg16/pipedream-a/4x4")
    speed = tp.profiling_gpu_speed() * V100_PCIE_OVER_SXM2   # PipeDream's profiling GPU -> V100 PCIe
    pipe = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4, speed=speed, transport="pipedream")
    dp_cl = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4, speed=speed, transport="nccl")
    assert (pipe, dp_cl) == tp.PaperSetting().clusters(row)
    prof = pipedream_profile("vgg16").at_batch_size(64)
    plan = pl.partition(prof, pipe, method="pipedream", optimizer="sgd-momentum")
    dp = pl.partition(prof, dp_cl, method="dp", memory_limit=math.inf, optimizer="sgd-momentum")
    t = {}
    for name, p, cl, method, mb in (("plan", plan, pipe, "pipedream", 64), ("dp", dp, dp_cl, "dp", 64)):
        mb = -(-mb // math.lcm(*p.replicas)) * math.lcm(*p.replicas)
        t[name] = pl.simulate(p, prof, cl, method=method, minibatches=mb, allreduce_overlap="ddp",
                              optimizer="sgd-momentum").time_per_minibatch
    committed = pd.read_csv(RESULTS).set_index(["model", "cluster", "servers_x_gpus"])
    want = committed.loc[("vgg16", "pipedream-a", "4x4")]
    assert plan.config == want["config"] == "15-1"
    assert round(t["dp"] / t["plan"], 3) == want["simulated_speedup"] == 4.849
    with pytest.raises(ValueError, match="transport="):
        pl.Cluster.preset("pipedream-a", transport="gloo")
