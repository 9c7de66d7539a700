# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Heterogeneous clusters: HetPipe's virtual workers and WSP
#
# HetPipe (Park et al., ATC'20) trains on a cluster of mixed GPUs by grouping them into **virtual workers**
# (VWs). Inside a VW the model runs as a PipeDream pipeline over that VW's GPUs, partitioned so the slowest
# stage is as fast as possible given each GPU's speed and memory. Across VWs, data parallelism goes through
# a parameter server under **Wave Synchronous Parallel** (WSP): a VW pushes its accumulated update once per
# *wave* (the minibatches it has in flight), and may run at most `D` waves ahead of the slowest VW — the
# staleness bound (`D = 0` is synchronous at wave granularity).

# %% tags=["parameters"]
model = "vgg16"                      # shipped PipeDream profile
batch_size = 32                      # minibatch per virtual worker (the profile is rescaled to it)
policies = ["ED", "NP", "HD"]        # HetPipe's virtual-worker policies
minibatches = 24                     # simulated minibatches
staleness_bounds = [0, 1, 2, 4]      # D values to compare
backend = "gloo"                     # the real run at the end: "gloo" processes or "local" reference executor
run_steps = 24                       # minibatches of the real run
slow_factor = 3.0                    # how much slower virtual worker 1's GPUs are in the real run

# %%
from dataclasses import replace

import pandas as pd

import pipelab as pl


def at_batch(prof, batch):
    """First-order rescaling of a profile to another minibatch: times and activation bytes scale with
    the batch, parameters do not. (Real GPUs are less efficient at small batches, so this flatters them.)"""
    f = batch / prof.batch_size
    layers = [replace(layer, fwd_s=layer.fwd_s * f, bwd_s=layer.bwd_s * f,
                      out_bytes=round(layer.out_bytes * f), saved_bytes=round(layer.saved_bytes * f))
              for layer in prof.layers]
    return replace(prof, layers=tuple(layers), cut_bytes=tuple(round(c * f) for c in prof.cut_bytes),
                   input_bytes=round(prof.input_bytes * f), batch_size=batch)

full = pl.Profile.from_pipedream(model)
prof = at_batch(full, batch_size)
print(f"{model}: profiled at batch {full.batch_size}, rescaled to {prof.batch_size}")
cluster = pl.Cluster.preset("hetpipe")
print(cluster.describe())

# %% [markdown]
# HetPipe's three ways of forming virtual workers (§6): **NP** — the GPUs of one node (one type) form a VW,
# so VWs differ in speed; **ED** — every VW gets one GPU of each type, so VWs are identical; **HD** — pairs of
# fast and slow nodes. Within each VW the layers are cut so the slowest stage on its device is as fast as
# possible. Below: each policy's plan, the partitioner's prediction, and the simulator's measurement,
# against data parallelism over the same 16 GPUs (held back by the slowest GPU at every step). The
# simulator hands minibatches to the VWs in turn, so in it the VWs advance in step whatever `D` is; the
# staleness bound is the subject of the next section.

# %%
dp_plan = pl.partition(prof, cluster, method="dp")
dp_sim = pl.simulate(dp_plan, prof, cluster, method="dp", minibatches=4)
plans, rows = {}, []
for policy in policies:
    plan = pl.partition(prof, cluster, method="hetpipe", policy=policy)
    sim = pl.simulate(plan, prof, cluster, method="hetpipe", minibatches=minibatches)
    plans[policy] = (plan, sim)
    vws = plan.notes["virtual_workers"]
    rows.append({"policy": policy, "VW 0 devices": [cluster.devices[r].name for r in vws[0]],
                 "predicted samples/s": prof.batch_size / plan.time_per_minibatch,
                 "simulated samples/s": sim.throughput,
                 "simulated speed-up over dp": sim.throughput / dp_sim.throughput})
pd.DataFrame(rows)

# %%
plan, sim = plans[policies[0]]
pl.views.gantt(sim.trace, title=f"hetpipe ({policies[0]}): simulated")

# %% [markdown]
# ## WSP's staleness bound, checked
#
# `param_server.WSPServer` is the parameter server's logic as a plain object (the runtime serves it
# from a separate process). Below, four virtual workers of different speeds run waves in simulated time:
# a VW that finishes a wave pushes its update, then pulls the global weights as soon as the rule lets it
# start the next wave (`local clock − global clock ≤ D`). `check_staleness` replays the server's log,
# recomputing the global clock from the pushes alone, and fails if any pull broke the bound. With VWs of
# different speeds (as under the NP policy), a larger `D` lets the fast ones keep working instead of
# waiting at every wave boundary — more waves in the same time — at the price of staler weights.

# %%
import heapq

import torch

from pipelab.runtime import param_server


def run_waves(D, speeds, horizon):
    """Event-driven WSP: VW v needs 1/speeds[v] s per wave; returns the server after `horizon` seconds."""
    server = param_server.WSPServer({"w": torch.zeros(1)}, num_virtual_workers=len(speeds), staleness=D)
    ends = []
    for v in range(len(speeds)):
        server.pull(v)
        heapq.heappush(ends, (1 / speeds[v], v))
    waiting = []
    while ends and ends[0][0] <= horizon:
        t, v = heapq.heappop(ends)
        server.push(v, {"w": torch.ones(1)})          # each wave adds 1 to the global weight
        waiting.append(v)
        for u in list(waiting):                       # whoever the new global clock releases starts now
            if server.try_pull(u) is not None:
                waiting.remove(u)
                heapq.heappush(ends, (t + 1 / speeds[u], u))
    return server

speeds = [4.0, 2.0, 1.0, 1.0]                       # relative speeds of the four virtual workers
rows = []
for D in staleness_bounds:
    server = run_waves(D, speeds, horizon=10.0)
    worst = param_server.check_staleness(server.log, len(speeds), D)   # raises if a pull broke the bound
    assert float(server.weights()["w"]) == sum(server.clocks), "every pushed update is in the weights"
    rows.append({"D": D, "waves per VW": list(server.clocks), "total waves": sum(server.clocks),
                 "largest lead at a pull": worst})
wsp_table = pd.DataFrame(rows)
assert list(wsp_table["total waves"]) == sorted(wsp_table["total waves"]), "more staleness, more waves"
wsp_table

# %% [markdown]
# **Exercise.** Predict the waves each VW completes in 10 s. The slow VWs (speed 1) finish 10 whatever `D` is,
# so the global clock ends at 10. A VW whose clock is `c` may start another wave only while `c − global ≤ D`;
# how many waves can the fastest VW (speed 4) have completed at the end? Check your formula against the table.
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
for D, waves in zip(wsp_table["D"], wsp_table["waves per VW"]):
    g = min(waves)
    # it finishes wave c and may start the next while c - g <= D: it runs up to g + D + 1 waves ahead, but
    # the last one started when the global clock reached 10, at the horizon, so it has completed g + D;
    # unless its own speed (4 waves per second) limits it first
    expected_fast = min(int(10.0 * speeds[0]), g + D)
    print(f"D={D}: fastest VW {waves[0]} waves, predicted {expected_fast}")
    assert waves[0] == expected_fast

# %% [markdown]
# ## A real HetPipe run
#
# Finally the runtime itself: the digits CNN on two virtual workers of two stages each (four worker
# processes and a parameter-server process), with virtual worker 1's GPUs emulated `slow_factor` times
# slower (each of its workers sleeps after every action). Each stage's shard of the weights lives on the
# server; the server's log of pushes and pulls comes back with the run. We check the bound on the real
# log and plot each virtual worker's clock over time: with `D = 0` the two advance in lockstep, with a
# larger `D` the fast one runs up to `D` waves ahead.

# %%
import functools

import plotly.express as px

from pipelab.graph import layer_nodes, trace
from pipelab.models import demo

images, labels = demo.digits_data("train")
n = len(labels) // 32 * 32
data = functools.partial(demo.batches, (images[:n], labels[:n]), 32)
layers = len(layer_nodes(trace(demo.small_cnn())))
vw_plan = pl.Plan.from_boundaries(layers, [layers // 3], replicas=[2, 2])   # replica v of each stage = VW v
slow = {s.ranks[1]: slow_factor for s in vw_plan.stages}                    # virtual worker 1's workers
clock_rows = []
for D in sorted({staleness_bounds[0], staleness_bounds[-1]}):
    r = pl.train(demo.small_cnn, vw_plan, method="hetpipe", D=D, slowdown=slow, data=data, steps=run_steps,
                 loss_fn=torch.nn.functional.cross_entropy, backend=backend, progress=False,
                 optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    worst = param_server.check_staleness(r.wsp_log, 2, D)         # raises if any pull broke the bound
    print(f"D={D}: {len(r.wsp_log)} server events, largest lead at a pull {worst} (bound {D}), "
          f"{r.throughput:.0f} samples/s, loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}")
    clock_rows += [{"D": D, "t (s)": e.t, "virtual worker": str(e.vw), "local clock": e.clock}
                   for e in r.wsp_log if e.kind == "push" and e.stage == 0]
px.line(pd.DataFrame(clock_rows), x="t (s)", y="local clock", color="virtual worker", facet_col="D",
        markers=True, line_shape="hv",
        title="virtual workers' clocks on the parameter server (stage 0 shard)")
