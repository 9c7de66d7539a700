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
# # 07 · Beyond DNNs: which ideas carry over to other pipelines?
#
# A discussion question made runnable: pipeline parallelism is older than deep learning (instruction
# pipelines, Unix pipes, stream processing, MapReduce-style data pipelines). Which of this course's ideas
# still apply to a pipeline that has **no backward pass and no weights**?
#
# We describe a data pipeline — read → parse → map → shuffle → reduce → write — as a `Profile.synthetic`:
# each operator is a "layer" with a forward cost for the job's whole input, zero backward cost, the bytes
# it hands to the next operator, and no parameters; streaming the input as `M` batches splits every cost
# into `M` parts. Then we reuse the partitioner, the schedules and the
# simulator unchanged.

# %% tags=["parameters"]
op_names = ["read", "parse", "map", "shuffle", "reduce", "write"]
op_ms = [3.0, 6.0, 9.0, 4.0, 5.0, 2.0]          # compute for the whole input
op_out_mb = [64.0, 48.0, 48.0, 48.0, 8.0, 0.0]  # MB each operator hands on, for the whole input
workers = 3
batches = 16                                     # batches of records streamed through
bandwidth_gbps = 10.0

# %%
import pipelab as pl

ops = pl.Profile.synthetic([ms / 1e3 for ms in op_ms], bwd_s=[0.0] * len(op_ms),
                           out_bytes=[int(mb * 1e6) for mb in op_out_mb], names=op_names,
                           model="map-shuffle-reduce")
ops.summary()

# %% [markdown]
# **Partitioning carries over.** Grouping consecutive operators onto workers so the slowest group is as
# fast as possible is exactly the layer partitioning problem; here the cuts are priced by the bytes the
# operators hand on. Without weights, replicating an operator costs nothing to synchronize, so when
# replication is allowed the partitioner runs the whole pipeline on every worker (plain data parallelism:
# each worker streams its own share of the records), as MapReduce does for its map tasks.

# %%
cluster = pl.Cluster.flat(workers, bandwidth=bandwidth_gbps * 1e9 / 8)
straight = pl.partition(ops, cluster, method="pipedream", straight=True)
replicated = pl.partition(ops, cluster, method="pipedream")
for p in (straight, replicated):
    print(p.describe(), "\n")
pl.views.partition_graph(ops, straight)

# %% [markdown]
# **Overlap and bubbles carry over.** A schedule is data, so the data pipeline's schedule is simply the
# forward half of GPipe's: every worker runs its stage for batch 0, 1, 2, ... as soon as the batch arrives.
# Streaming overlaps the stages; the fill and the drain leave the same bubble `(P−1)/(M+P−1)` with equal
# stage costs, and in steady state the slowest stage (or link) sets the pace.

# %%
from pipelab.schedules.actions import Schedule

gpipe = pl.schedules.build("gpipe", straight, microbatches=batches, minibatches=1)
stream = Schedule(method="forward-only", num_stages=gpipe.num_stages, stage_ranks=gpipe.stage_ranks,
                  microbatches=batches, minibatches=1,
                  actions=tuple(tuple(a for a in acts if a.kind == "F") for acts in gpipe.actions))
print(stream)
sim = pl.simulate(straight, ops, cluster, method="gpipe", microbatches=batches, minibatches=1,
                  schedule=stream)
print(f"simulated: {batches} batches in {sim.trace.makespan * 1e3:.2f} ms")
pl.views.gantt(sim.trace, title="the data pipeline, streamed (forward-only schedule)")

# %% [markdown]
# **Exercise.** Check the simulator with a closed form. The profile's costs are for the whole job; streamed as
# `M` batches, each batch costs `1/M` of every operator and of every transfer. With per-stage compute `c_s`
# and send time `x_s` (the stage's outgoing bytes over the link), a pipeline in which each stage sends while
# it computes the next batch finishes after the first batch has crossed every stage and link, plus `M − 1`
# times the slowest of all those steps: `Σ_s (c_s + x_s) + (M − 1) · max_s max(c_s, x_s)`.
# Then compare the bubble of the forward-only schedule (unit costs) with `(P−1)/(M+P−1)`.
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
bw = bandwidth_gbps * 1e9 / 8
c = [ops[s.start:s.end].fwd_s / batches for s in straight.stages]
x = [ops[s.start:s.end].out_bytes / batches / bw if s.index < straight.num_stages - 1 else 0.0
     for s in straight.stages]
closed = sum(ci + xi for ci, xi in zip(c, x)) + (batches - 1) * max(max(ci, xi) for ci, xi in zip(c, x))
print(f"closed form {closed * 1e3:.3f} ms, simulated {sim.trace.makespan * 1e3:.3f} ms")
assert abs(closed - sim.trace.makespan) <= 1e-9 + 1e-6 * closed

P = straight.num_stages
bubble = pl.views.bubble_fraction(pl.views.schedule_trace(stream))
print(f"unit-cost bubble {bubble:.4f}, closed form {(P - 1) / (batches + P - 1):.4f}")
assert abs(bubble - (P - 1) / (batches + P - 1)) < 1e-9

# %% [markdown]
# **What does not carry over.** There is no backward pass, so 1F1B's reason to exist — starting backwards
# early to free stashed activations — is gone; its data-pipeline cousin is *backpressure*: bounded queues
# between operators so a fast producer cannot flood a slow consumer's memory. There are no weights, so
# weight versions, stashing, 2BW and PipeMare have nothing to act on; every policy computes the same thing.
# What takes the place of weights is *state* (a reduce's running aggregate, a join's hash table): a stateful
# operator cannot be replicated freely, and the shuffle is an all-to-all exchange that no contiguous cut
# avoids — the data pipeline's analogue of the all-reduce, which the simple chain model above leaves out.
# The training-shaped costs also do not carry over: `pl.partition` and the built-in methods price a
# backward pass and a gradient sent back across every cut, which is why we used the forward-only schedule.

# %% [markdown]
# **Exercise.** Make the reduce stateful: give the `reduce` operator 200 MB of "parameters" (its aggregate)
# and re-partition with replication allowed. What happens to the replica count of the stage holding `reduce`,
# and why?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
state = [0, 0, 0, 0, 200_000_000, 0]
stateful = pl.Profile.synthetic([ms / 1e3 for ms in op_ms], bwd_s=[0.0] * len(op_ms),
                                out_bytes=[int(mb * 1e6) for mb in op_out_mb], param_bytes=state,
                                names=op_names, model="stateful")
p = pl.partition(stateful, cluster, method="pipedream")
print(p.describe())
reduce_stage = p.stage_of_layer(op_names.index("reduce"))
print("replicas of the stage with reduce:", reduce_stage.replicas)
# Replicas of a stateful operator must keep their states consistent, which the cost model prices like
# a weight all-reduce of 200 MB: far dearer than computing `reduce` on one worker, so it is not replicated.
assert reduce_stage.replicas == 1
