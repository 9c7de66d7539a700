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
# # HetPipe: virtual workers of heterogeneous GPUs, synchronised with Wave Synchronous Parallel
#
# **Claim** (Park et al., *HetPipe*, USENIX ATC'20): on a cluster of mixed GPUs, grouping devices into
# *virtual workers* (VWs) that each run a PipeDream-style pipeline, and synchronising the VWs through a
# parameter server with Wave Synchronous Parallel (WSP: a VW pushes once per wave of in-flight
# minibatches and may run at most `D` waves ahead of the slowest), trains faster than data parallelism
# over the same devices, whose every step waits for the slowest GPU. A larger staleness bound `D` lets
# fast VWs wait less, at some cost in convergence.
#
# Two parts: (1) simulated on a heterogeneous cluster model, (2) emulated here with real processes, in
# which slow devices are emulated by per-worker slowdowns.

# %% tags=["parameters"]
profile_name = "vgg16"        # shipped PipeDream profile used in the simulated part
cluster = "hetpipe"           # a heterogeneous pl.Cluster preset (HetPipe's 4 nodes x 4 GPUs of 4 types)
batch_size = 32               # HetPipe's minibatch; the batch-128 profile is rescaled linearly
policies = ["ED", "NP", "HD"] # HetPipe's ways to group GPUs into virtual workers
staleness = [0, 1, 2, 4]      # WSP bounds D to compare
minibatches = 48              # simulated minibatches per pipeline
waves = 50                    # waves in the WSP timeline
# emulated part (real processes)
emulate = True
emu_stages = 2                # stages per virtual worker
emu_virtual_workers = 2
emu_slowdown = 2.0            # the slow worker's slowdown factor
emu_staleness = [0, 1, 4]     # WSP bounds D of the real runs
emu_epochs = 2
emu_batch = 32
emu_lr = 0.2                  # plain SGD, as in the weight-stashing reproduction
emu_train_limit = 0
backend = "gloo"
seed = 0
out_dir = "."
report = False

# %%
from reproductions._common.report import show_figure


def show(fig):
    """Show a figure live in JupyterLab; in a report, as HTML whose plotly.js the driver adds once."""
    show_figure(fig, report)


# %%
from pathlib import Path

from reproductions._common import report as output
from reproductions.hetpipe import virtual_workers

# %% [markdown]
# ## Simulated: HetPipe's cluster, data parallelism vs virtual workers
#
# Data parallelism (`pl.simulate(..., method="dp")`) runs every GPU as a replica: each step waits for
# the slowest device, then all-reduces. HetPipe groups the 16 GPUs into 4 virtual workers by one of its
# policies (§6: `NP` one node per VW, `ED` one GPU of each type per VW, `HD` two types per VW),
# partitions the layers over each VW's devices (`pl.partition(..., method="hetpipe")`) and runs
# PipeDream inside each VW (`pl.simulate(..., method="hetpipe")`: the seconds per minibatch of every
# VW come from that simulation).
#
# The simulator runs the pipelines; the wave synchronisation *across* VWs is the WSP timeline of
# `virtual_workers.wsp_makespan`: a VW pushes its update after each wave of NOAM minibatches (a
# transfer of its stage's weights to the parameter-server shard over the inter-node link) and may go on
# at once while it is at most `D` waves ahead of the slowest VW; otherwise it waits and pulls the global
# weights.
# With `D = 0` every wave waits for every push and a pull; with `D >= 1` synchronisation leaves the
# critical path, and VWs of unequal speed run at the pace of the slowest plus `D` waves of slack.

# %%
sim_table = virtual_workers.hetpipe_simulated(profile_name, cluster, staleness=staleness,
                                              minibatches=minibatches, batch_size=batch_size,
                                              policies=policies, waves=waves)
output.write_table(sim_table, Path(out_dir) / "simulated.csv")
sim_table

# %%
show(output.bar_figure(sim_table.dropna(subset=["samples_per_s"]), x="config", y="samples_per_s",
                       title=f"{profile_name} (batch {batch_size}) on {cluster}: simulated samples/s"))

# %% [markdown]
# ## Emulated with real processes
#
# Each virtual worker is a pipeline of `emu_stages` processes; one worker in one VW sleeps so that it runs
# `emu_slowdown` times slower. Data parallelism over the same processes waits for that worker at every
# step; HetPipe lets the other VW run ahead by up to `D` waves.

# %%
from pipelab.runtime import supported_methods

emu = None
if emulate and "hetpipe" not in supported_methods():
    print("the runtime cannot run method 'hetpipe' yet (supported: " + ", ".join(supported_methods()) + "); "
          "the emulated part is skipped")
elif emulate:
    emu = virtual_workers.hetpipe_emulated(stages=emu_stages, virtual_workers=emu_virtual_workers,
                                           slowdown=emu_slowdown, staleness=emu_staleness, epochs=emu_epochs,
                                           batch_size=emu_batch, lr=emu_lr, train_limit=emu_train_limit,
                                           backend=backend, seed=seed)
    output.write_table(emu, Path(out_dir) / "emulated.csv")
emu

# %%
text = f"# HetPipe: results\n\n## Simulated\n\n{output.markdown_table(sim_table)}\n"
if emu is not None:
    text += f"\n## Emulated (real processes, one slowed worker)\n\n{output.markdown_table(emu)}\n"
output.write_text(Path(out_dir) / "results.md", text)
