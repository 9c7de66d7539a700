"""Megatron-LM's asynchronous tensor all-reduce (Parallel.tensor_overlap) against closed forms written
here: in a backward that computes its weight gradients, each column-parallel linear's input-gradient
collective hides behind that linear's weight-gradient GEMM; a recomputed forward's collectives and a
backward whose weight gradients are split off (zero bubble's W) hide nothing."""

from __future__ import annotations

import pytest

from pipelab.cluster import Cluster
from pipelab.llm import Parallel, ParallelError, Transformer, stage_costs
from pipelab.llm.collectives import allreduce_s, reduce_scatter_s
from pipelab.llm.costs import block_costs
from pipelab.llm.devices import device_table
from pipelab.sim.llm import simulate_llm

A100 = device_table()["A100-SXM4-80GB"]
MODEL = Transformer(name="gpt", layers=8, hidden=2048, heads=16, seq=1024, vocab=1024)
CLUSTER = Cluster.preset("dgx-a100", nodes=1)


def _wgrad_s(name: str, par: Parallel) -> float:
    """The weight-gradient GEMM of one linear by the roofline, written out: 2 tokens x in x out / t."""
    tokens, h, f, t = par.microbatch_size * MODEL.seq, MODEL.hidden, MODEL.ffn, par.tensor
    inner, outer = {"qkv": (h, 3 * h), "mlp_up": (h, f)}[name]
    flops = 2 * tokens * inner * outer / t
    nbytes = 2 * (tokens * inner + inner * outer / t + tokens * outer / t)
    return max(flops / (A100.peak_flops_bf16 * A100.gemm_efficiency), nbytes / A100.hbm_bytes_per_s)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("b", [1, 8])
def test_hidden_part_is_the_collective_up_to_each_column_parallel_wgrad(sp, b):
    par = Parallel(tensor=8, microbatch_size=b, sequence_parallel=sp, tensor_overlap=True)
    blk = block_costs(MODEL, par, A100, CLUSTER)
    act = 2 * b * MODEL.seq * MODEL.hidden
    group = list(range(8))
    reduced = reduce_scatter_s(CLUSTER, group, act) if sp else allreduce_s(CLUSTER, group, act)
    want = sum(min(reduced, _wgrad_s(n, par)) for n in ("qkv", "mlp_up"))
    assert blk.tensor_comm_backward_hidden_s == pytest.approx(want, rel=1e-12)
    assert 0 < blk.tensor_comm_backward_hidden_s <= blk.tensor_comm_backward_s
    off = block_costs(MODEL, Parallel(tensor=8, microbatch_size=b, sequence_parallel=sp), A100, CLUSTER)
    assert off.tensor_comm_backward_hidden_s == 0.0
    assert off.tensor_comm_backward_s == blk.tensor_comm_backward_s


def test_no_tensor_group_hides_nothing():
    blk = block_costs(MODEL, Parallel(tensor_overlap=True), A100, CLUSTER)
    assert blk.tensor_comm_backward_s == blk.tensor_comm_backward_hidden_s == 0.0


def test_recomputed_forward_collectives_stay_exposed():
    kw = dict(tensor=8, microbatch_size=2, tensor_overlap=True)
    base = stage_costs(MODEL, Parallel(**kw), CLUSTER).stages[0]
    full = stage_costs(MODEL, Parallel(**kw, recompute="full"), CLUSTER).stages[0]
    assert full.tensor_comm_backward_hidden_s == pytest.approx(base.tensor_comm_backward_hidden_s)
    # every block's forward collectives again (the embedding's all-reduce is not recomputed)
    blocks_f = MODEL.layers * block_costs(MODEL, Parallel(**kw), A100, CLUSTER).tensor_comm_forward_s
    assert full.tensor_comm_backward_s == pytest.approx(base.tensor_comm_backward_s + blocks_f, rel=1e-12)
    exposed = full.backward_total_s - base.backward_total_s
    assert exposed == pytest.approx(full.recompute_s + blocks_f, rel=1e-12)


def test_one_stage_iteration_saves_the_hidden_part_per_microbatch():
    """With one stage and no data parallelism, 1F1B's iteration is m (F + B + W) plus the step's end:
    the overlap saves exactly m times the hidden seconds."""
    m = 4
    kw = dict(tensor=8, microbatch_size=1, microbatches=m)
    off = simulate_llm(MODEL, CLUSTER, Parallel(**kw))
    on = simulate_llm(MODEL, CLUSTER, Parallel(**kw, tensor_overlap=True))
    hidden = stage_costs(MODEL, Parallel(**kw, tensor_overlap=True), CLUSTER).stages[0]
    assert off.time_per_iteration_s - on.time_per_iteration_s == pytest.approx(
        m * hidden.tensor_comm_backward_hidden_s, rel=1e-9)


def test_split_weight_gradients_hide_nothing():
    """Zero bubble's W runs apart from B, so the collective waits in B: the overlap changes nothing."""
    kw = dict(tensor=8, pipeline=1, microbatch_size=1, microbatches=4, schedule="zb-h1")
    off = simulate_llm(MODEL, CLUSTER, Parallel(**kw))
    on = simulate_llm(MODEL, CLUSTER, Parallel(**kw, tensor_overlap=True))
    assert on.time_per_iteration_s == pytest.approx(off.time_per_iteration_s, rel=1e-12)


@pytest.mark.parametrize("label", ["tensor_overlap", "dp_overlap", "sequence_parallel"])
def test_switches_must_be_booleans(label):
    with pytest.raises(ParallelError, match=f"{label}='yes' must be True or False"):
        Parallel(tensor=2, **{label: "yes"})


def test_round_trip_keeps_the_overlap():
    par = Parallel(tensor=8, tensor_overlap=True, dp_overlap=False)
    assert Parallel.from_dict(par.to_dict()) == par


def test_the_generic_profile_refuses_the_overlap_it_cannot_express():
    """transformer_profile folds the collectives into each block's times; hiding part of them depends on
    whether the schedule splits W off, which a Profile does not know: refused, not silently exposed."""
    from pipelab.llm import transformer_profile

    with pytest.raises(ParallelError, match="simulate_llm"):
        transformer_profile(MODEL, Parallel(tensor=8, tensor_overlap=True), "a100", cluster=CLUSTER)
    assert transformer_profile(MODEL, Parallel(tensor=8), "a100", cluster=CLUSTER).layers
