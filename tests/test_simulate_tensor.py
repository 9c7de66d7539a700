"""pl.simulate prices tensor-parallel stages from the split rule the runtime cuts with.

Oracles: a closed form on a hand-built profile (Megatron's split, the ring all-reduce written out
here); the runtime's own shards of the model for memory per device; the same results at tensor=1 as a
profile that records no split; train's refusal of an asynchronous method on a tie across stages."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import tp_models as T
from torch import nn

import pipelab as pl
from pipelab.profile.records import Profile
from pipelab.runtime.tensor_parallel import Group, plan_of, shard
from pipelab.tensor_split import LayerSplit
from pipelab.ties import TieError

BW, LAT = 1e9, 5e-6     # the hand-built cluster's link


def ring(nbytes: float, p: int) -> float:
    """A ring all-reduce (Patarasuk & Yuan 2009): 2 (p - 1) steps, each a latency and nbytes / p."""
    return 2 * (p - 1) * (LAT + nbytes / p / BW)


def hand_profile() -> Profile:
    """Four layers: a whole norm, a column-parallel layer, a row-parallel one, a whole residual add."""
    splits = (LayerSplit(), LayerSplit(kind="colwise", split_param_bytes=4000, backward_allreduce_bytes=800,
                                       sizes=(("output features of fc", 8),)),
              LayerSplit(kind="rowwise", split_param_bytes=3000, forward_allreduce_bytes=800,
                         sizes=(("input features of proj", 8),)),
              LayerSplit())
    return Profile.synthetic([1e-3, 4e-3, 6e-3, 1e-3], [2e-3, 8e-3, 12e-3, 2e-3],
                             out_bytes=[800, 3200, 800, 800], param_bytes=[100, 4000, 3100, 0],
                             batch_size=4, tensor_splits=splits)


def with_tensor(plan: pl.Plan, *degrees: int) -> pl.Plan:
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, tensor=t)
                                                  for s, t in zip(plan.stages, degrees)))


@pytest.mark.parametrize("t", [2, 4])
def test_split_layers_divide_and_each_all_reduce_is_priced_on_the_group(t: int) -> None:
    prof, M = hand_profile(), 2
    cluster = pl.Cluster.flat(t, bandwidth=BW, latency=LAT)
    res = pl.simulate(with_tensor(pl.Plan.from_boundaries(4, []), t), prof, cluster, "gpipe", microbatches=M)
    f = [e.duration_s for e in res.trace.events if e.kind == "F"]
    b = [e.duration_s for e in res.trace.events if e.kind == "B"]
    # per microbatch: whole layers whole, split ones / t, one g (forward) and one f (backward) of 400 B
    want_f = (1e-3 + 1e-3 + (4e-3 + 6e-3) / t) / M + ring(800 / M, t)
    want_b = (2e-3 + 2e-3 + (8e-3 + 12e-3) / t) / M + ring(800 / M, t)
    assert f == pytest.approx([want_f] * M, rel=1e-12) and b == pytest.approx([want_b] * M, rel=1e-12)
    tensor = [e for e in res.trace.events if e.kind == "tensor"]
    assert len(tensor) == 2 * M and [e.duration_s for e in tensor] == pytest.approx([ring(400, t)] * 2 * M)
    # one member's weights: the whole ones plus 1/t of the cut ones (the row-parallel bias stays whole)
    assert res.memory_timeline[0][0][1] == 100 + 4000 // t + 3000 // t + 100
    assert res.trace.meta["tensor_groups"] == [[0, *range(1, t)]]
    assert len(res.member_events) == (t - 1) * sum(e.kind != "send" for e in res.trace.events)


def test_tensor_one_is_what_a_profile_without_a_split_gives() -> None:
    prof = hand_profile()
    bare = dataclasses.replace(prof, tensor_splits=())
    plan = pl.Plan.from_boundaries(4, [2])
    for method in ("gpipe", "1f1b-flush", "pipedream"):
        a = pl.simulate(plan, prof, "flat:2", method, microbatches=2)
        b = pl.simulate(plan, bare, "flat:2", method, microbatches=2)
        assert a.trace.events == b.trace.events and a.peak_memory == b.peak_memory
        assert a.time_per_minibatch == b.time_per_minibatch and a.member_events == ()


def test_what_cannot_be_priced_is_refused_by_name() -> None:
    prof = hand_profile()
    one = pl.Plan.from_boundaries(4, [])
    with pytest.raises(ValueError, match=r"tensor degree 3 does not divide output features of fc \(8\).*"
                                         r"valid degrees for its layers: \[1, 2, 4, 8\]"):
        pl.simulate(with_tensor(one, 3), prof, "flat:3", "gpipe", microbatches=2)
    with pytest.raises(ValueError, match=r"stage 0 \(tensor degree 2\) ends after layer 1 \('layer1'\), "
                                         r"whose output is a shard"):
        pl.simulate(with_tensor(pl.Plan.from_boundaries(4, [2]), 2, 2), prof, "flat:4", "gpipe",
                    microbatches=2)
    odd = dataclasses.replace(prof, tensor_splits=(*prof.tensor_splits[:3], LayerSplit(
        kind="unclassified", reason="add mixes shards and whole tensors")))
    with pytest.raises(ValueError, match=r"holds layer 3 \('layer3'\), which the split rule cannot classify: "
                                         "add mixes shards"):
        pl.simulate(with_tensor(one, 2), odd, "flat:2", "gpipe", microbatches=2)
    with pytest.raises(ValueError, match=r"need 4 devices .* has 2"):
        pl.simulate(with_tensor(one, 4), prof, "flat:2", "gpipe", microbatches=2)
    with pytest.raises(ValueError, match=r"runs 2 virtual stages per worker"):
        pl.simulate(with_tensor(one, 2), prof, "flat:2", "interleaved-1f1b", microbatches=2, chunks=2)


@pytest.fixture(scope="module")
def gpt_profiles() -> dict[str, Profile]:
    x, _ = next(T.data())
    return {name: pl.profile(fn(), x, progress=False, small_batch=None, repeats=1)
            for name, fn in (("untied", T.gpt), ("tied", T.tied_gpt))}


def shard_bytes(model: nn.Module, t: int) -> int:
    """Bytes of member 0's parameters after the runtime's own split (each shared tensor once)."""
    shard(model, plan_of(model), Group(0, t, None))
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("name", ["untied", "tied"])
def test_memory_per_member_is_the_runtimes_shard_exactly(gpt_profiles, name: str) -> None:
    prof = gpt_profiles[name]
    fn = T.tied_gpt if name == "tied" else T.gpt
    res = pl.simulate(with_tensor(pl.Plan.from_boundaries(len(prof), []), 2), prof, "flat:2", "gpipe",
                      microbatches=2)
    assert res.memory_timeline[0][0][1] == shard_bytes(fn(), 2) < prof.param_bytes
    assert pl.views.memory_breakdown(with_tensor(pl.Plan.from_boundaries(len(prof), []), 2), prof,
                                     microbatches=2)[0]["weights"] == shard_bytes(fn(), 2)


def test_the_profile_splits_exactly_the_modules_the_runtime_cuts(gpt_profiles) -> None:
    prof = gpt_profiles["untied"]
    model = T.gpt()
    dims = shard(model, plan_of(model), Group(0, 2, None))
    cut_modules = {k.rsplit(".", 1)[0] for k in dims} | {"wte"}
    styled = {ly.name for ly, sp in zip(prof.layers, prof.tensor_splits)
              if sp.kind not in ("whole", "sharded")}
    assert styled == cut_modules
    assert not [sp for sp in prof.tensor_splits if sp.kind == "unclassified"]
    # the collectives: per block g after each row-parallel layer, f before each column-parallel one
    fwd = sum(bool(sp.forward_allreduce_bytes) for sp in prof.tensor_splits)
    bwd = sum(bool(sp.backward_allreduce_bytes) for sp in prof.tensor_splits)
    assert (fwd, bwd) == (2 * T.LAYERS + 1, 2 * T.LAYERS + 1)
    assert Profile.from_dict(prof.to_dict()) == prof
    half = prof.at_batch_size(2)
    assert [s.forward_allreduce_bytes for s in half.tensor_splits] == \
        [s.forward_allreduce_bytes // 2 for s in prof.tensor_splits]


def test_two_by_two_draws_tensor_collectives_and_expands_groups(gpt_profiles) -> None:
    prof = gpt_profiles["untied"]
    plan = with_tensor(pl.Plan.from_boundaries(len(prof), [24]), 2, 2)
    cluster = pl.Cluster.flat(4, bandwidth=BW, latency=LAT)
    res = pl.simulate(plan, prof, cluster, "1f1b-flush", microbatches=2)
    assert res.trace.meta["tensor_devices"] == [[0, 1], [2, 3]]
    # the leader broadcasts what it receives: stage 1's F the cut's activations, stage 0's B their gradient
    cut = prof.cut_bytes[23] // 2
    splits = prof.tensor_splits
    g_bytes = [sum(s.forward_allreduce_bytes + s.forward_allgather_bytes for s in part) // 2
               for part in (splits[:24], splits[24:])]
    f_bytes = {e.stage: e.bytes for e in res.trace.events if e.kind == "tensor" and e.step == -1
               and any(a.kind == "F" and a.stage == e.stage and a.end_s == e.end_s for a in res.trace.events)}
    assert f_bytes == {0: g_bytes[0], 1: g_bytes[1] + cut}
    # stage 1's F: each g a ring of its own, the logits' all-gather half of one, the broadcast a transfer
    g = [-(-s.forward_allreduce_bytes // 2) for s in splits[24:] if s.forward_allreduce_bytes]
    gather = [-(-s.forward_allgather_bytes // 2) for s in splits[24:] if s.forward_allgather_bytes]
    want = sum(ring(n, 2) for n in g) + sum(ring(n, 2) / 2 for n in gather) + LAT + cut / BW
    f1_end = {e.end_s for e in res.trace.events if e.kind == "F" and e.stage == 1}
    comm = [e.duration_s for e in res.trace.events
            if e.kind == "tensor" and e.stage == 1 and e.end_s in f1_end]
    assert comm == pytest.approx([want] * 2, rel=1e-9)
    fig = pl.views.gantt_groups(res)
    drawn = [k for tr in fig.data if tr.name == "transfer" for k in tr.text]
    assert drawn.count("tensor") == 2 * 2 * 2       # 2 workers x 2 microbatches x (F, B)
    assert "tensor-group collectives" in {tr.name for tr in fig.data}
    assert len(pl.views.gantt_groups(res, expand=True).layout.yaxis.ticktext) == 4


def test_an_asynchronous_method_is_refused_on_a_tie_across_stages_as_train_does(gpt_profiles) -> None:
    prof = gpt_profiles["tied"]
    plan = pl.Plan.from_boundaries(len(prof), [24])
    for method in ("pipedream", "pipemare"):
        with pytest.raises(TieError, match=r"pl.simulate refuses what train refuses: parameter "
                                           r"head.weight=wte.weight .* is shared by stages \[0, 1\]"):
            pl.simulate(plan, prof, "flat:2", method, microbatches=1)
    assert pl.simulate(plan, prof, "flat:2", "gpipe", microbatches=2).time_per_minibatch > 0
    assert pl.simulate(pl.Plan.from_boundaries(len(prof), []), prof, "flat:1", "pipedream",
                       microbatches=1).time_per_minibatch > 0
    torch.manual_seed(0)


def test_a_leaf_layer_holding_split_modules_is_unclassified_and_refused() -> None:
    from pipelab.models.tp_gpt import Attention

    x, _ = next(T.data())
    prof = pl.profile(T.gpt(), x, progress=False, small_batch=None, repeats=1, leaf_modules=(Attention,))
    kinds = {ly.name: sp.kind for ly, sp in zip(prof.layers, prof.tensor_splits)}
    assert kinds["blocks.0.attn"] == "unclassified" and kinds["blocks.0.fc"] == "colwise"
    with pytest.raises(ValueError, match=r"layer \d+ \('blocks.0.attn'\), which the split rule cannot "
                                         r"classify: attention blocks.0.attn is one leaf layer"):
        pl.simulate(with_tensor(pl.Plan.from_boundaries(len(prof), []), 2), prof, "flat:2", "gpipe",
                    microbatches=2)
    # at tensor=1 the same profile simulates as ever
    assert pl.simulate(pl.Plan.from_boundaries(len(prof), []), prof, "flat:1", "gpipe",
                       microbatches=2).time_per_minibatch > 0


def test_replicated_tensor_groups_all_reduce_one_shard_over_the_leaders() -> None:
    prof = hand_profile()
    plan = pl.Plan.from_boundaries(4, [], replicas=[2], tensor=2)
    res = pl.simulate(plan, prof, pl.Cluster.flat(4, bandwidth=BW, latency=LAT), "gpipe", microbatches=2,
                      allreduce_overlap="none")
    assert res.trace.meta["tensor_devices"] == [[0, 1], [2, 3]]
    ar = [e for e in res.trace.events if e.kind == "allreduce"]
    shard_bytes = 100 + 4000 // 2 + 3000 // 2 + 100
    assert ar and {e.bytes for e in ar} == {shard_bytes}
    assert ar[0].duration_s == pytest.approx(ring(shard_bytes, 2))


def test_a_group_is_priced_over_the_links_it_sits_on() -> None:
    from pipelab.cluster import Cluster, Device, Level

    slow_bw, slow_lat = BW / 10, 20 * LAT
    cluster = Cluster("two nodes", (Level("node", 2, BW, LAT), Level("net", 2, slow_bw, slow_lat)),
                      (Device("cpu"),) * 4)
    prof = hand_profile()
    one = pl.Plan.from_boundaries(4, [])
    inside = pl.simulate(with_tensor(one, 2), prof, cluster, "gpipe", microbatches=1)
    drawn = [e.duration_s for e in inside.trace.events if e.kind == "tensor"]
    assert drawn == pytest.approx([ring(800, 2)] * 2)
    # a group of 4 spans both nodes: a ring inside each node, then one between them (hierarchical)
    across = pl.simulate(with_tensor(one, 4), prof, cluster, "gpipe", microbatches=1)
    between = 2 * (slow_lat + 800 / 2 / slow_bw)
    assert [e.duration_s for e in across.trace.events if e.kind == "tensor"] == \
        pytest.approx([ring(800, 2) + between] * 2)
