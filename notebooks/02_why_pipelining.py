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
# # 02 · Why pipelining? Data parallelism stalls on communication
#
# In data-parallel training every worker holds the whole model and, after each minibatch, the workers
# all-reduce *every* weight gradient. The compute per worker stays fixed while the bytes to exchange
# do not shrink, so as workers are added (or as bandwidth lags compute) a growing fraction of time is
# spent waiting for communication. PipeDream (Narayanan et al., SOSP'19, §2.1) motivates pipelining with
# this overhead: it grows with the number of workers and is largest for models with many weights relative
# to their compute.
#
# We measure it with the simulator on PipeDream's own layer profiles of VGG-16, ResNet-50 and GNMT-8
# (shipped with pipelab: V100 times, minibatch sizes from the files) and then compare with a pipeline plan.

# %% tags=["parameters"]
models = ["vgg16", "resnet50", "gnmt8"]     # shipped PipeDream profiles
worker_counts = [1, 2, 4, 8, 16]            # data-parallel workers (flat cluster)
bandwidths_gbps = [10, 25, 100]             # link bandwidth between every pair of workers
minibatches = 4                             # simulated minibatches per run

# %%
import pandas as pd
import plotly.express as px

import pipelab as pl

profiles = {name: pl.Profile.from_pipedream(name) for name in models}
pd.DataFrame([{"model": n, "layers": len(p), "batch": p.batch_size, "params_MB": p.param_bytes / 1e6,
               "fwd+bwd_ms": (p.fwd_s + p.bwd_s) * 1e3} for n, p in profiles.items()])

# %% [markdown]
# The *communication fraction* of a run is the share of a worker's time not spent computing:
# `1 − utilization`, averaged over workers, where utilization is measured on the simulated trace.
# With one worker there is nothing to exchange, so it must be 0 — a first check.

# %%
rows = []
for name, prof in profiles.items():
    for gbps in bandwidths_gbps:
        for n in worker_counts:
            # memory is not the question here: give every device plenty so that no plan is refused
            cluster = pl.Cluster.flat(n, bandwidth=gbps * 1e9 / 8, memory=2**40)
            plan = pl.partition(prof, cluster, method="dp")
            sim = pl.simulate(plan, prof, cluster, method="dp", minibatches=minibatches)
            util = sum(sim.utilization) / len(sim.utilization)
            rows.append({"model": name, "Gbps": gbps, "workers": n, "comm_fraction": 1 - util,
                         "samples_per_s": sim.throughput})
dp = pd.DataFrame(rows)
assert (dp[dp.workers == 1].comm_fraction.abs() < 1e-9).all(), "one worker must never wait"
px.line(dp, x="workers", y="comm_fraction", color="model", facet_col="Gbps", markers=True, log_x=True,
        title="data parallel: fraction of time stalled on communication (simulated)")

# %% [markdown]
# **Why the curves look like this.** A ring all-reduce moves `2(n−1)/n · P` bytes per worker for `P`
# gradient bytes (Patarasuk & Yuan, JPDC 2009), so its time tends to `2P/B` as `n` grows while the compute
# per worker stays fixed; and it can hide only behind the backward pass, as each layer's gradient becomes
# ready. What matters is bytes per second of compute: GNMT-8 (≈775 MB of weights against ≈89 ms of
# compute per minibatch at its profiled batch of 32) stalls most, VGG-16 (≈553 MB, most of it in the fully
# connected layers, against ≈690 ms) stalls at 10 Gbps, and ResNet-50 (≈102 MB against ≈462 ms) hides its
# all-reduce behind its backward pass.

# %% [markdown]
# **Exercise.** Check the simulator against closed forms. For VGG-16 at 16 workers and 10 Gbps, compute the
# ring all-reduce time `2(n−1)/n · P / B` and the compute time of one minibatch. If the all-reduce overlapped
# the backward pass perfectly, the stall fraction would be
# `max(0, allreduce − bwd) / (fwd + max(bwd, allreduce))`; if it did not overlap at all,
# `allreduce / (compute + allreduce)`. Is the simulated fraction between the two (up to rounding: the
# simulator also charges latency and the optimizer step)?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
prof, n = profiles["vgg16"], 16
B = 10e9 / 8
ar = 2 * (n - 1) / n * prof.param_bytes / B
fwd, bwd = prof.fwd_s, prof.bwd_s
no_overlap = ar / (fwd + bwd + ar)
full_overlap = max(0.0, ar - bwd) / (fwd + max(bwd, ar))
sim_frac = dp[(dp.model == "vgg16") & (dp.workers == n) & (dp.Gbps == 10)].comm_fraction
print(f"all-reduce {ar * 1e3:.1f} ms, compute {(fwd + bwd) * 1e3:.1f} ms")
print(f"perfect overlap {full_overlap:.3f}, simulated {float(sim_frac.iloc[0]):.3f}, "
      f"no overlap {no_overlap:.3f}")
if n in worker_counts and 10 in bandwidths_gbps and "vgg16" in models:
    assert full_overlap - 0.02 <= float(sim_frac.iloc[0]) <= no_overlap + 0.02

# %% [markdown]
# ## Pipelining instead
#
# A pipeline gives each worker a contiguous range of layers: only activations and their gradients
# cross stage boundaries, point to point, and weights need synchronizing only among the replicas of a
# stage. PipeDream's partitioner replicates the compute-heavy convolutional front of VGG-16 and keeps the
# large fully connected layers on few workers. Below: PipeDream's plan against data parallelism on
# cluster A of the paper (4 servers × 4 V100, PCIe inside a server, 10 Gbps Ethernet across; §5.1).

# %%
# Time is the question here, not memory: pipelab's memory model finds that ResNet-50's profiled
# minibatch (128 images) does not fit a 16 GB V100 without pipelining, so we lift the limit.
cluster = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4, memory=2**40)
rows = []
for name, prof in profiles.items():
    results = {}
    for method in ("dp", "pipedream"):
        plan = pl.partition(prof, cluster, method=method)
        sim = pl.simulate(plan, prof, cluster, method=method)   # default length: a few waves in flight
        results[method] = (plan, sim)
    plan, sim = results["pipedream"]
    rows.append({"model": name, "pipedream config": plan.config,
                 "dp samples/s": results["dp"][1].throughput, "pipedream samples/s": sim.throughput,
                 "simulated speed-up": sim.throughput / results["dp"][1].throughput,
                 "dp comm fraction": 1 - sum(results["dp"][1].utilization) / cluster.num_workers})
compare = pd.DataFrame(rows)
compare

# %% [markdown]
# PipeDream's Table 1 reports, on this cluster, 15-1 with 5.28× over data parallel for VGG-16 and plain
# data parallelism (1×) for ResNet-50 (Narayanan et al., SOSP'19, §5.2). The simulator runs the plan's
# real schedule under pipelab's cost model, whose figures differ from the paper's;
# `reproductions/pipedream_table1/` compares every row of that table and says which terms differ.

# %% [markdown]
# **Exercise.** The pipeline wins where data parallelism stalls. Plot, for each model, the simulated speed-up
# of the pipedream plan against the data-parallel communication fraction on cluster A. Which model gains
# least, and why?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
fig = px.scatter(compare, x="dp comm fraction", y="simulated speed-up", text="model",
                 title="speed-up of pipelining grows with the data-parallel stall")
# A pipeline can always fall back to data parallelism (config "16"), so it is never much slower.
assert (compare["simulated speed-up"] > 0.9).all()
fig
