# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # PipeDream Table 1: the configuration pipelab chooses, and its speed-up over data parallelism
#
# **Claim** (Narayanan et al., *PipeDream: Generalized Pipeline Parallelism for DNN Training*, SOSP'19,
# Table 1): for each model and cluster PipeDream's optimizer picks a configuration (e.g. VGG-16 on
# 4 servers × 4 V100 of cluster A: `15-1`, fifteen replicas of the convolutional front and one worker
# for the fully connected tail) whose epoch time is several times shorter than data parallelism (DP).
#
# This notebook does one row of that table with pipelab: it loads the model's profile (PipeDream's own
# measured profile by default), builds the cluster model, partitions with PipeDream's hierarchical
# dynamic program (§3.1), then **simulates** the chosen plan and the data-parallel plan on the same
# cluster with the discrete-event simulator (`pl.simulate`) and reports the simulated speed-up beside
# the partitioner's prediction and the paper's number.
#
# `mode="measure"` runs the same question for real on this machine at reduced scale: a narrower,
# smaller-input model of the same layer structure, 2–4 CPU processes (gloo), the chosen plan against
# data parallelism, measured speed-up against the simulator's prediction for this machine.

# %% tags=["parameters"]
model = "vgg16"              # vgg16 | resnet50 | gnmt8 | gnmt16
cluster = "pipedream-a"      # a pl.Cluster preset
servers = 4
gpus_per_server = 4
profile_source = "pipedream" # "pipedream": PipeDream's shipped profiles; "measured": pl.profile on `device`
device_speed = 1.0           # the cluster GPU's speed relative to the GPU the profile was measured on
enforce_memory = True        # False: partition without pipelab's (strict) memory limit
mode = "simulate"            # "simulate" | "measure" (real runtime at reduced scale on this machine)
minibatches = 64             # simulated minibatches (steady state is measured after warm-up)
gantt_minibatches = 6        # minibatches drawn in the Gantt chart (keeps the report small)
device = "cpu"               # device to profile on, with the measured profile source
measured_batch = 8           # batch and input size of the measured profile source
measured_image_size = 64
measured_seq_len = 16
# mode="measure": the reduced model and the local run
measure_workers = 2          # processes (2-4 on a laptop; one thread each)
measure_steps = 12           # minibatches timed per run (after measure_warmup)
measure_warmup = 3
measure_batch = 32
measure_width = 0.125        # channel / hidden width multiplier of the reduced model
measure_image_size = 32      # image side (images) of the reduced model
measure_seq_len = 8          # sequence length (GNMT) of the reduced model
measure_rounds = 2           # runs per plan, alternating; the median is kept
measure_bandwidth = 0.0      # bytes/s of the machine model; 0: measure the gloo loopback
backend = "gloo"
seed = 0
out_dir = ""                 # if set, row.json (this row's numbers, for the driver) is written there
report = False               # True under the driver: figures as HTML, plotly.js added once by the report

# %%
from IPython.display import display

from pipelab.reproduce import show_figure


def show(fig):
    """Show a figure live in JupyterLab; in a report, as HTML whose plotly.js the driver adds once."""
    show_figure(fig, report)


# %%
import math
from pathlib import Path

import pandas as pd

import pipelab as pl
from pipelab import reproduce as rp

paper = rp.paper_row(model, cluster, servers, gpus_per_server)
print("paper:", paper.describe() if paper else "this row is not in PipeDream's Table 1")

# %% [markdown]
# ## Profile and cluster
#
# PipeDream's profiles (shipped with pipelab, `pipelab/data/pipedream/`) were measured on the paper's
# GPUs, so a device of relative speed 1.0 in the cluster model *is* that GPU. With
# `profile_source="measured"` the profile comes from `pl.profile` on this device instead (at a small
# input size on a CPU; expect different shapes, since compute is then slow relative to the network).

# %%
if profile_source == "pipedream":
    prof = pl.models.pipedream_profile(model)
elif profile_source == "measured":
    net, sample = rp.paper_model(model, batch=measured_batch, image_size=measured_image_size,
                                 seq_len=measured_seq_len)
    prof = pl.profile(net, sample, device=device, model_name=model)
else:
    raise ValueError(f"profile_source={profile_source!r} must be 'pipedream' or 'measured'")
cl = pl.Cluster.preset(cluster, servers=servers, gpus_per_server=gpus_per_server, speed=device_speed)
print(f"{model}: {len(prof)} layers, batch {prof.batch_size}, "
      f"fwd+bwd {(prof.fwd_s + prof.bwd_s) * 1e3:.1f} ms/minibatch, "
      f"{prof.param_bytes / 1e6:.1f} MB of weights")
print(cl.describe())

# %% [markdown]
# ## Partition (PipeDream §3.1) and simulate
#
# `pl.partition(..., method="pipedream")` returns the plan with the cost model's *prediction*;
# `pl.simulate` then runs the plan's schedule event by event (transfers serialized per link,
# all-reduce overlapped with backward, warm-up excluded), which is the number compared with the paper.
# A plan of one stage is data parallelism, simulated with method `dp`; it is also simulated with its
# all-reduce *after* backward (`allreduce_overlap="none"`), a second baseline for the speed-up.
#
# pipelab's memory model is strict (every layer output of every in-flight minibatch is kept, a stashed
# weight copy per in-flight minibatch, gradients and momentum); where no plan fits the device, or the
# best plan does not, the plan without a memory limit is shown beside it. The data-parallel baseline
# is always taken without a memory limit: the paper ran it on these GPUs.

# %%
limit = {} if enforce_memory else {"memory_limit": math.inf}
try:
    plan = pl.partition(prof, cl, method="pipedream", **limit)
    fits = True
except ValueError as exc:   # nothing fits pipelab's memory model: show the unconstrained plan
    print(f"no plan fits the device memory in pipelab's model ({exc}); using the plan without a limit")
    plan, fits = pl.partition(prof, cl, method="pipedream", memory_limit=math.inf), False
free = pl.partition(prof, cl, method="pipedream", memory_limit=math.inf)
dp_plan = pl.partition(prof, cl, method="dp", memory_limit=math.inf)
print(plan.describe())
print(dp_plan.describe())

sim = rp.simulate_plan(plan, prof, cl, minibatches=minibatches)
sim_dp = rp.simulate_plan(dp_plan, prof, cl, minibatches=minibatches)
# the same baseline with its all-reduce after backward instead of overlapped DDP-style (how much of
# the gap to the paper that one assumption accounts for; pipelab's own runtime works this way)
sim_dp_none = rp.simulate_plan(dp_plan, prof, cl, minibatches=minibatches, allreduce_overlap="none")
sim_free = sim if free.config == plan.config else rp.simulate_plan(free, prof, cl, minibatches=minibatches)
sim_speedup = sim.throughput / sim_dp.throughput
print(f"simulated: plan {sim.throughput:.1f} samples/s, dp {sim_dp.throughput:.1f} samples/s "
      f"-> {sim_speedup:.2f}x (partitioner predicted {plan.speedup_over_dp:.2f}x); over DP without "
      f"all-reduce overlap ({sim_dp_none.throughput:.1f} samples/s): "
      f"{sim.throughput / sim_dp_none.throughput:.2f}x")
if free.config != plan.config:
    print(f"without a memory limit: {free.config}, simulated {sim_free.throughput / sim_dp.throughput:.2f}x")

# %% [markdown]
# ## Why this plan: the cost-model terms
#
# Per stage, milliseconds per minibatch of one replica: compute (forward + backward), the all-reduce
# of the stage's weights over its replicas, the replica's time with that all-reduce overlapped with
# backward (what is left over is *exposed* communication), the activation transfer into the stage, and
# the stage's share of the steady-state time (replica time / replicas). Data parallelism is one stage
# on every worker: its exposed all-reduce is what a pipeline can save.

# %%
terms = rp.cost_terms(prof, cl, plan)
dp_terms = rp.cost_terms(prof, cl, dp_plan)
display(terms)
display(dp_terms)

# %%
row = rp.table1_row(model=model, cluster=cluster, servers=servers, gpus_per_server=gpus_per_server,
                    plan=plan, predicted_speedup=plan.speedup_over_dp, simulated_speedup=sim_speedup,
                    profile_source=profile_source, dp_terms=dp_terms,
                    sim_ms=(sim.time_per_minibatch, sim_dp.time_per_minibatch),
                    sim_dp_no_overlap_s=sim_dp_none.time_per_minibatch)
row.update(fits_memory=fits, config_no_memory_limit=free.config,
           simulated_speedup_no_memory_limit=round(sim_free.throughput / sim_dp.throughput, 3),
           device_speed=device_speed)
# the paper's own configuration in this simulator (where pipelab can build it), to separate "chose
# another plan" from "the same plan is faster or slower here"
paper_plan = rp.paper_config_plan(prof, cl, paper.config, candidates=(plan, free)) if paper else None
if paper_plan is not None:
    sim_paper = rp.simulate_plan(paper_plan, prof, cl, minibatches=minibatches)
    row["paper_config_simulated_speedup"] = round(sim_paper.throughput / sim_dp.throughput, 3)
pd.DataFrame([row]).T.rename(columns={0: ""})

# %% [markdown]
# ## Gantt chart of the chosen plan
#
# The first minibatches of the simulated run: one row per worker, one box per forward (solid) and
# backward (hatched) pass, coloured by minibatch; thin grey bars are transfers.

# %%
short = rp.simulate_plan(plan, prof, cl, minibatches=gantt_minibatches)
show(pl.views.gantt(short.trace, title=f"{model} on {cluster} {servers}x{gpus_per_server}: "
                                         f"{plan.config} (simulated)"))

# %% [markdown]
# ## Measure mode: real processes at reduced scale on this machine
#
# Runs only with `mode="measure"`. The reduced model keeps the paper model's layer structure with a
# smaller input and width. The simulated side profiles *that* model on this CPU and models this machine
# as a flat cluster whose bandwidth is the measured gloo loopback bandwidth; the chosen plan and data
# parallelism then run for real with `pl.train` and their measured throughputs are compared.

# %%
measure = None
if mode == "measure":
    measure = rp.measure_row(model, workers=measure_workers, steps=measure_steps, warmup=measure_warmup,
                             batch=measure_batch, width=measure_width, image_size=measure_image_size,
                             seq_len=measure_seq_len, backend=backend, rounds=measure_rounds,
                             bandwidth=measure_bandwidth or None, seed=seed)
    row.update({f"measure_{k}": v for k, v in measure.items() if not isinstance(v, (list, dict))})
    display(pd.DataFrame([measure]).T.rename(columns={0: ""}))
elif mode != "simulate":
    raise ValueError(f"mode={mode!r} must be 'simulate' or 'measure'")

# %%
if out_dir:
    print("wrote", rp.write_row(Path(out_dir) / "row.json", row))
