"""pipelab.llm's ring collectives against closed forms written here: the hierarchical ring per level,
and the cluster's ``allreduce_ring="flat"`` option (one ring of all members over the slowest link),
which must give the same terms as the 2019 cost model's all-reduce on the same cluster."""

from __future__ import annotations

import dataclasses

import pytest

from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.llm import Parallel, Transformer, stage_costs
from pipelab.llm.collectives import all_gather_s, allreduce_s, reduce_scatter_s, ring_terms
from pipelab.llm.devices import device_table
from pipelab.profile.records import Profile

A100 = device_table()["A100-SXM4-80GB"]


def _flat(cluster: Cluster) -> Cluster:
    return dataclasses.replace(cluster, allreduce_ring="flat")


def test_hierarchical_ring_is_one_term_per_level():
    cl = Cluster.preset("dgx-a100", nodes=4)
    group = list(range(32))
    per_byte, fixed = ring_terms(cl, group)
    inside, across = cl.levels[0], cl.levels[1]
    # 8 GPUs on NVSwitch, then 4 nodes over their 8 adapters at once
    want = 2 * 7 / 8 / inside.ring_bandwidth + 2 * 3 / 4 / (across.ring_bandwidth * 8)
    assert per_byte == pytest.approx(want, rel=1e-12)
    assert fixed == pytest.approx(2 * 7 * inside.latency + 2 * 3 * across.latency, rel=1e-12)


@pytest.mark.parametrize("group", [list(range(32)), [0, 8, 16, 24], list(range(8)), [3, 5]])
def test_flat_ring_is_one_ring_over_the_slowest_link(group):
    cl = _flat(Cluster.preset("dgx-a100", nodes=4))
    n = len(group)
    crossed = [lv for lv, _, _ in Cluster.preset("dgx-a100", nodes=4).ring_levels(group)]
    per_byte, fixed = ring_terms(cl, group)
    assert per_byte == pytest.approx(2 * (n - 1) / n / min(lv.ring_bandwidth for lv in crossed), rel=1e-12)
    assert fixed == pytest.approx(2 * (n - 1) * max(lv.latency for lv in crossed), rel=1e-12)
    nbytes = 3e8
    assert allreduce_s(cl, group, nbytes) == pytest.approx(fixed + per_byte * nbytes, rel=1e-12)
    assert reduce_scatter_s(cl, group, nbytes) == pytest.approx(allreduce_s(cl, group, nbytes) / 2)
    assert all_gather_s(cl, group, nbytes) == pytest.approx(allreduce_s(cl, group, nbytes) / 2)


@pytest.mark.parametrize("ring", ["hierarchical", "flat"])
@pytest.mark.parametrize("group", [list(range(16)), [0, 8], [1, 2, 9, 10]])
def test_ring_terms_agree_with_the_2019_cost_model(ring, group):
    cl = dataclasses.replace(Cluster.preset("dgx-a100", nodes=2), allreduce_ring=ring)
    prof = Profile.synthetic([1e-3] * 16, param_bytes=[10**6] * 16)
    assert ring_terms(cl, group) == pytest.approx(CostModel(prof, cl).allreduce_coeffs(group), rel=1e-12)


def test_flat_ring_across_nodes_slows_the_data_parallel_sync():
    """Across nodes a flat ring runs every step on one adapter: 8 x fewer links than the hierarchy,
    and the whole group's 2 (n - 1) / n on the slow level."""
    m = Transformer(name="gpt", layers=4, hidden=1024, heads=16, seq=512, vocab=1000)
    par = Parallel(tensor=1, pipeline=1, data=16, microbatch_size=1, microbatches=2)
    hier = Cluster.preset("dgx-a100", nodes=2)
    h = stage_costs(m, par, hier).dp_sync_s
    f = stage_costs(m, par, _flat(hier)).dp_sync_s
    across = hier.levels[1]
    grads = 4 * stage_costs(m, par, hier).stages[0].params     # fp32 gradients of the default recipe
    assert f == pytest.approx(2 * 15 / 16 * grads / across.ring_bandwidth
                              + 2 * 15 * max(lv.latency for lv in hier.levels),
                              rel=1e-9)
    assert f > h
