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
# # 01 · Quickstart: profile → partition → simulate → train → Gantt
#
# Ten cells through pipelab's whole data flow on a small CNN for scikit-learn's bundled 8×8 digits
# (no download): **profile** the layers, **partition** them into a 2-stage pipeline, **simulate** the
# schedule, **train** it for real in 2 processes, and draw both runs as Gantt charts. Run all cells
# (Run ▸ Run All Cells); the training cell starts two worker processes and takes a few seconds.

# %% tags=["parameters"]
# Parameters (papermill overrides these; change them and re-run everything)
backend = "gloo"         # "gloo": one OS process per worker; "local": the single-process reference executor
workers = 2              # pipeline stages (one worker each)
method = "1f1b-flush"    # try "gpipe", "pipedream", "2bw"
microbatches = 4         # per minibatch
batch_size = 64
steps = 30               # minibatches to train

# %%
import functools

import torch

import pipelab as pl
from pipelab.models import demo

# The model and data: plain PyTorch. Worker processes import these by name, hence functools.partial
# of library functions rather than lambdas defined here.
images, labels = demo.digits_data("train")
n = len(labels) // batch_size * batch_size                          # whole minibatches only
data = functools.partial(demo.batches, (images[:n], labels[:n]), batch_size)
loss_fn = torch.nn.functional.cross_entropy
optimizer = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
model = demo.small_cnn()
x, y = data()[0]
print(model, "\nminibatch:", tuple(x.shape), "labels:", tuple(y.shape))

# %%
# 1. Profile: forward/backward time, output/cut bytes and parameters of every layer, on this CPU.
# small_batch: also time each layer on one microbatch, so that the simulator knows how much of a
# layer's time a smaller batch still pays (tiny CPU kernels cost nearly as much at 16 rows as at 64).
prof = pl.profile(model, x, progress=False, small_batch=batch_size // microbatches)
prof.summary()

# %%
# 2. Partition: a cluster model of this machine (processes on one host), then the pipeline plan.
cluster = pl.Cluster.flat(workers, bandwidth=1e9)          # ~1 GB/s between local processes
plan = pl.partition(prof, cluster, method="pipedream", straight=True)
print(plan.describe())
pl.views.partition_graph(prof, plan)

# %%
# 3. Simulate: the schedule the runtime will execute, timed with the profile and the cluster model.
sim = pl.simulate(plan, prof, cluster, method=method, microbatches=microbatches, minibatches=steps)
print(f"simulated: {sim.throughput:.0f} samples/s, {sim.time_per_minibatch * 1e3:.2f} ms per minibatch")
pl.views.gantt(sim.trace, title=f"simulated {method}")

# %%
# 4. Train for real, one process per worker; the Gantt chart fills in while it runs.
handle = pl.launch(demo.small_cnn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=optimizer,
                   steps=steps, microbatches=microbatches, backend=backend)
pl.widgets.LiveGantt(handle, title=f"{method} on {workers} {backend} workers (live)")

# %%
# 5. The finished run: measured throughput and losses; its trace is the same type as the simulator's.
# (Expect the measured rate below the simulated one, about 2x on a 2-core CPU: backward actions take what
# the profile says, but each forward also pays the runtime's own work (~0.4 ms: slicing the input,
# sending the activation), every message between the processes waits ~1 ms on a shared CPU, and the
# optimizer step (~0.5 ms) is not free; without small_batch above the gap is 4x. The measure mode of
# reproductions/pipedream_table1 runs a larger model, where simulation and measurement agree within 15%.)
run = handle.wait()
print(f"measured: {run.throughput:.0f} samples/s (simulated {sim.throughput:.0f}); "
      f"loss {run.losses[0]:.3f} -> {run.losses[-1]:.3f}")
# one schedule, three uses: the runtime and the simulator ran exactly its per-worker action lists
assert run.trace.actions_by_worker() == sim.trace.actions_by_worker()
pl.views.gantt(run.trace, title=f"measured {method} ({backend})")

# %%
import plotly.express as px

px.line(x=range(1, len(run.losses) + 1), y=run.losses, labels={"x": "minibatch", "y": "training loss"},
        title="training loss")

# %% [markdown]
# **Next.** `02_why_pipelining` (why data parallelism stalls), `03_partitioning` (the dynamic program
# behind step 2), `04_schedules` (what the boxes above mean), `05_weight_versions`, `06_heterogeneous`,
# `07_beyond_dnns`. Every notebook's first code cell holds its parameters.
