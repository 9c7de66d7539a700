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
# # PipeDream Table 1 as PipeDream ran it: the configuration pipelab chooses, the paper's own, and the paper
#
# **Claim** (Narayanan et al., *PipeDream: Generalized Pipeline Parallelism for DNN Training*, SOSP'19,
# Table 1): for each model and cluster PipeDream's optimizer picks a configuration (e.g. VGG-16 on
# 4 servers × 4 V100 of cluster A: `15-1`, fifteen replicas of the convolutional front and one worker
# for the fully connected tail) whose epoch time is several times shorter than data parallelism (DP).
#
# This notebook does one row of that table the way PipeDream's runs were made (their driver configs in
# PipeDream's repository): minibatches of 64 per worker, the pipelined runs' activations, gradients and
# replica all-reduces through gloo (host memory and TCP), the DP baseline's all-reduce through NCCL's
# ring (one flat ring through every GPU, as NCCL builds it). It loads PipeDream's own profile (rescaled
# to the batch), partitions with PipeDream's dynamic program (§3.1), builds PipeDream's own
# configuration for the row from its files, **simulates** both against DP with the discrete-event
# simulator, and reports three figures: pipelab's choice, the paper's configuration in pipelab, and
# the paper.
#
# `mode="measure"` asks the question for real on this machine at reduced scale: a narrower,
# smaller-input model of the same layer structure, 2–4 CPU processes (gloo), several plans against
# data parallelism, measured speed-ups against the simulator's prediction for this machine.

# %% tags=["parameters"]
model = "vgg16"              # vgg16 | resnet50 | gnmt8 | gnmt16
cluster = "pipedream-a"      # a pl.Cluster preset
servers = 4
gpus_per_server = 4
batch_size = 64              # per-worker minibatch (every Table 1 driver config: batch_size 64)
transports = "pipedream"     # "pipedream": gloo pipelines, NCCL DP; "link": every transfer at the link rate
device_speed = 0.0           # V100 SXM2 speed / profiling GPU's (cluster A's PCIe cards: x 14/15.7); 0: cited
nccl_wire_fraction = 0.0     # NCCL bus bandwidth / Ethernet wire speed; 0: the cited defaults
profile_source = "pipedream" # "pipedream": PipeDream's shipped profiles; "measured": pl.profile on `device`
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

from reproductions._common.report import show_figure


def show(fig):
    """Show a figure live in JupyterLab; in a report, as HTML whose plotly.js the driver adds once."""
    show_figure(fig, report)


# %%
from pathlib import Path

import pandas as pd

import pipelab as pl
from reproductions.pipedream_table1 import measure as measure_mode
from reproductions.pipedream_table1 import paper as tp
from reproductions.pipedream_table1 import rows

paper = rows.paper_row(model, cluster, servers, gpus_per_server)
print("paper:", paper.describe() if paper else "this row is not in PipeDream's Table 1")
row_spec = paper or rows.PaperRow(model, cluster, servers, gpus_per_server, "", None)

# %% [markdown]
# ## Profile, clusters and transports
#
# PipeDream's profiles (shipped with pipelab, `pipelab/data/pipedream/`) were taken at other batch
# sizes (VGG-16 and ResNet-50 at 128, GNMT-8 at 32, GNMT-16 at 128); `Profile.at_batch_size` rescales
# them to the runs' 64 (times through the affine model, activation and cut bytes linearly; the profile's
# `source` records it). A device of speed 1.0 is the GPU that measured them; the V100's speed relative
# to it is a cited parameter (`tp.profiling_gpu_speed()`: a V100's published ResNet-50 training
# throughput over the one PipeDream's ResNet-50 profile implies; an SXM2 module's, and cluster A's PCIe
# cards run at `tp.V100_PCIE_OVER_SXM2` of it, NVIDIA's datasheet), and so is NCCL's bus bandwidth over
# TCP (`pipelab.transports.NCCL_TCP_BUS_BANDWIDTH`) and inside a cluster-A server, measured on its Azure NCv3
# instance family (`tp.PAPER_NCCL_BUS_BANDWIDTH`). The pipelined runs' cluster prices transfers and replica
# all-reduces as gloo does (transfers through host memory; a replicated stage's all-reduce as gloo's ring
# on the host), the DP baseline's all-reduce as NCCL's ring; each model trains with PipeDream's optimizer.

# %%
bus = None
if nccl_wire_fraction:
    bus = {**tp.PAPER_NCCL_BUS_BANDWIDTH, "ethernet-10g": nccl_wire_fraction * 10e9 / 8,
           "ethernet-25g": nccl_wire_fraction * 25e9 / 8}
setting = tp.PaperSetting(batch_size=batch_size, device_speed=device_speed or None, nccl_bus_bandwidth=bus,
                          transports=transports)
opt = setting.optimizer_of(model)   # PipeDream's: momentum SGD for the image models, Adam for GNMT
if profile_source == "pipedream":
    prof = setting.profile(model)
elif profile_source == "measured":
    net, sample = measure_mode.paper_model(model, batch=measured_batch, image_size=measured_image_size,
                                 seq_len=measured_seq_len)
    prof = pl.profile(net, sample, device=device, model_name=model)
else:
    raise ValueError(f"profile_source={profile_source!r} must be 'pipedream' or 'measured'")
pipe_cl, dp_cl = setting.clusters(row_spec)
print(f"{model}: {len(prof)} layers, batch {prof.batch_size} ({prof.source}), "
      f"fwd+bwd {(prof.fwd_s + prof.bwd_s) * 1e3:.1f} ms/minibatch at speed 1, "
      f"{prof.param_bytes / 1e6:.1f} MB of weights")
print("pipelined runs:", pipe_cl.describe())
print("data-parallel baseline:", dp_cl.describe())

# %% [markdown]
# ## Partition (PipeDream §3.1), the paper's configuration, and simulation
#
# `tp.row_choice` runs PipeDream's dynamic program on the pipelined runs' cluster (and its best straight
# pipeline) and keeps, of those and data parallelism (on its NCCL cluster), the one the simulator finds
# fastest, as pipelab's planner ranks its candidates. `tp.paper_plan` maps the
# configuration file PipeDream's run named (`module_to_stage_map`, `stage_to_rank_map` and the stage
# modules' layers) onto the profile. `pl.simulate` then runs each plan's schedule event by event
# (transfers serialized per port, replicas' all-reduces paired, warm-up excluded), the numbers compared
# with the paper.

# %%
if profile_source == "pipedream":
    row = tp.simulate_row(row_spec, setting, minibatches=minibatches)
    plan, dp_plan, is_dp, _, _ = tp.row_choice(prof, pipe_cl, dp_cl, setting, minibatches=minibatches,
                                               optimizer=opt)
else:   # a measured profile: no paper configuration to map; pipelab's choice only
    plan, dp_plan, is_dp = tp.choose_plan(prof, pipe_cl, dp_cl, optimizer=opt)
    t_dp = rows.simulate_plan(dp_plan, prof, dp_cl, minibatches=minibatches, optimizer=opt).time_per_minibatch
    t_plan = (t_dp if is_dp else
              rows.simulate_plan(plan, prof, pipe_cl, minibatches=minibatches,
                               optimizer=opt).time_per_minibatch)
    row = {"model": model, "cluster": cluster, "servers_x_gpus": f"{servers}x{gpus_per_server}",
           "config": plan.config, "simulated_speedup": round(t_dp / t_plan, 3)}
row["profile"] = profile_source
print(plan.describe())
print(dp_plan.describe())
pd.DataFrame([row]).T.rename(columns={0: ""})

# %% [markdown]
# ## Why this plan: the cost-model terms
#
# Per stage, milliseconds per minibatch of one replica: compute (forward + backward), the all-reduce
# of the stage's weights over its replicas, the replica's time with that all-reduce overlapped with
# backward (what is left over is *exposed* communication), the activation transfer into the stage, and
# the stage's share of the steady-state time (replica time / replicas). Data parallelism is one stage
# on every worker (NCCL's ring): its exposed all-reduce is what a pipeline can save.

# %%
terms = rows.cost_terms(prof, pipe_cl, plan) if not is_dp else None
dp_terms = rows.cost_terms(prof, dp_cl, dp_plan)
if terms is not None:
    display(terms)
display(dp_terms)
t = dp_terms.iloc[0]
row["dp_exposed_comm_share"] = round(float(t["exposed_comm_ms"] / t["replica_ms"]), 3)

# %% [markdown]
# ## Gantt chart of the chosen plan
#
# The first minibatches of the simulated run: one row per worker, one box per forward (solid) and
# backward (hatched) pass, coloured by minibatch; thin grey bars are transfers.

# %%
short = rows.simulate_plan(plan, prof, dp_cl if is_dp else pipe_cl, minibatches=gantt_minibatches,
                         optimizer=opt)
show(pl.views.gantt(short.trace, title=f"{model} on {cluster} {servers}x{gpus_per_server}: "
                                         f"{plan.config} (simulated)"))

# %% [markdown]
# ## Measure mode: real processes at reduced scale on this machine
#
# Runs only with `mode="measure"`. The reduced model keeps the paper model's layer structure with a
# smaller input and width. The simulated side profiles *that* model on this CPU and models this machine
# as a flat cluster whose bandwidth is the measured gloo loopback bandwidth; pipelab's chosen plan, the
# best straight pipeline, PipeDream's VGG-16 split (classifier on the last worker) and data parallelism
# then run for real with `pl.train`, every distinct plan in every round, and their measured speed-ups
# over DP (paired per round) are compared with the simulated ones.

# %%
measure = None
if mode == "measure":
    measure = measure_mode.measure_row(model, workers=measure_workers, steps=measure_steps,
                                       warmup=measure_warmup, batch=measure_batch, width=measure_width,
                                       image_size=measure_image_size, seq_len=measure_seq_len,
                                       backend=backend, rounds=measure_rounds,
                                       bandwidth=measure_bandwidth or None, seed=seed)
    row.update({f"measure_{k}": v for k, v in measure.items() if not isinstance(v, (list, dict))})
    if out_dir:   # every run of every plan, for measure_runs.csv
        rows.write_row(Path(out_dir) / "measure_runs.json", {"runs": measure["runs"]})
    display(pd.DataFrame([measure]).T.rename(columns={0: ""}))
elif mode != "simulate":
    raise ValueError(f"mode={mode!r} must be 'simulate' or 'measure'")

# %%
if out_dir:
    print("wrote", rows.write_row(Path(out_dir) / "row.json", row))
