"""HetPipe's first claim (Park et al., USENIX ATC'20, §1/§6): a model that a weak GPU of a heterogeneous
cluster cannot hold alone trains in a virtual worker that includes that GPU.

On pipelab's ``hetpipe`` preset (4 nodes x 4 GPUs: TITAN V 12 GB, TITAN RTX 24 GB, RTX 2060 6 GB,
Quadro P4000 8 GB), VGG-16 at PipeDream's profiled minibatch of 128 needs about 8.9 GB to train on one
GPU (weights, gradients, momentum and activations): more than the RTX 2060 or the P4000 has. With
the ED policy (each virtual worker one GPU of each type) the HetPipe partitioner gives every GPU
layers that fit its own memory, the simulated run executes the virtual workers' pipelines, and the
memory view shows each worker under its device's line while the one-GPU plan is over it.
"""

from __future__ import annotations

import pipelab as pl
from pipelab.costs import CostModel
from pipelab.models import pipedream_profile
from pipelab.views.memory import memory as memory_view


def test_a_model_too_big_for_a_weak_gpu_trains_in_a_virtual_worker() -> None:
    cl = pl.Cluster.preset("hetpipe")
    prof = pipedream_profile("vgg16")
    L = len(prof.layers)
    whole = CostModel(prof, cl).memory_bytes(0, L, versions=1, in_flight=1)["total"]
    weak = {w: d for w, d in enumerate(cl.devices) if d.memory_bytes < whole}
    assert {d.name for d in weak.values()} == {"RTX-2060", "Quadro-P4000"}   # neither holds it alone

    plan = pl.partition(prof, cl, method="hetpipe", policy="ED")
    assert plan.num_stages > 1 and len(plan.stages[0].ranks) == 4             # 4 VWs, each a pipeline
    device = plan.notes["workers"]            # plan rank -> cluster GPU (each VW orders its own GPUs)
    sim = pl.simulate(plan, prof, cl, "hetpipe")
    assert sim.throughput > 0
    # every GPU, the weak ones included, holds layers, and its simulated peak fits its own memory
    layers_of = {device[w]: (s.end - s.start) for s in plan.stages for w in s.ranks}
    assert all(layers_of[g] > 0 for g in weak)
    for w, peak in enumerate(sim.peak_memory):
        gpu = cl.devices[device[w]]
        assert 0 < peak <= gpu.memory_bytes, (w, gpu.name, peak)
        # the partitioner's count (every version and activation at once) bounds the simulated peak
        assert peak <= plan.stage_of_rank(w).memory_bytes

    # the memory view: the weak GPUs' workers under their line; the one-GPU plan over it
    g_weak = min(weak, key=lambda g: weak[g].memory_bytes)
    lim = cl.devices[g_weak].memory_bytes
    on_weak = [w for w in range(plan.num_workers) if cl.devices[device[w]].memory_bytes == lim]
    fig = memory_view(sim, unit="B", limit=lim)
    assert fig.layout.meta["totals"] == list(sim.peak_memory)
    assert on_weak and not set(fig.layout.meta["over_limit"]) & {f"w{w}" for w in on_weak}
    alone = {0: CostModel(prof, cl.subset([g_weak])).memory_bytes(0, L, versions=1, in_flight=1)}
    assert memory_view(alone, unit="B", limit=lim).layout.meta["over_limit"] == ["w0"]
