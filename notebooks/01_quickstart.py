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
# (Run ▸ Run All Cells): one to two minutes on a shared 2-core machine, most of it measuring the machine
# in step 2; the training cell starts two worker processes and takes a few seconds.

# %% tags=["parameters"]
# Parameters (papermill overrides these; change them and re-run everything)
backend = "gloo"         # "gloo": one OS process per worker; "local": the single-process reference executor
workers = 2              # pipeline stages (one worker each)
method = "1f1b-flush"    # try "gpipe", "pipedream", "2bw"
microbatches = 4         # per minibatch
batch_size = 64
steps = 600              # minibatches to train (a steady rate, and a live chart that fills in)
rounds = 5               # the measured rate is compared in this many consecutive parts of the run
cluster_file = None      # a calibrated cluster JSON (`pipelab calibrate -o me.json`); None: calibrate here

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
# loss_fn and target: the last stage computes the loss, so its time and what it saves for its backward
# (cross-entropy's log-softmax of the logits) are part of that stage's cost and memory.
prof = pl.profile(model, x, loss_fn=loss_fn, target=y, progress=False, small_batch=batch_size // microbatches)
prof.summary()

# %%
# 2. Calibrate this machine: message latency and bandwidth between worker processes, the runtime's own
# work per action, the optimizer step (40-70 s on a shared 2-core machine; `pipelab calibrate -o me.json`
# saves it for later, and `cluster_file` above reuses it).
# The result is a Cluster like PipeDream's presets, measured rather than taken from a data sheet.
cluster = pl.Cluster.load(cluster_file) if cluster_file else pl.calibrate(workers=workers)
cluster = cluster.with_workers(workers)
print(cluster.calibration.describe())

# %%
# 3. Partition the profile for that cluster into a pipeline plan.
plan = pl.partition(prof, cluster, method="pipedream", straight=True)
print(plan.describe())
pl.views.partition_graph(prof, plan)

# %%
# 4. Simulate: the schedule the runtime will execute, timed with the profile and the calibrated cluster
# (allreduce_overlap="none": replicas all-reduce after backward, as pipelab's runtime does). The model is
# compute, transfers, all-reduces and optimizer steps alone: docs/cost_model.md.
sim = pl.simulate(plan, prof, cluster, method=method, microbatches=microbatches, minibatches=steps,
                  allreduce_overlap="none")
print(sim)   # what the time assumes: M microbatches of batch_size / M, with the flush of every minibatch
pl.views.gantt(sim.trace, title=f"simulated {method}")

# %%
# 5. Train for real, one process per worker; the Gantt chart fills in while it runs. The sampler notes
# how much of the cores' time other processes take meanwhile (a steady load slows every round alike).
load = pl.hostload.HostLoadSampler().start()
handle = pl.launch(demo.small_cnn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=optimizer,
                   steps=steps, microbatches=microbatches, backend=backend)
pl.widgets.LiveGantt(handle, title=f"{method} on {workers} {backend} workers (live)")

# %%
# 6. The finished run beside the simulation, both measured the same way: samples/s between minibatch
# completions in steady state (the first minibatch, with the processes' start-up, and the last are left
# out of both). The measured rate moves while the machine does other work, so it is taken in `rounds`
# consecutive parts of the run and the error is given with its spread over them.
# reproductions/sim_accuracy measures this error for every method.
run = handle.wait()
load.stop()
rates = run.trace.steady_rounds(rounds, batch_size)
simulated = sim.trace.steady_throughput(batch_size)
print(f"steady state: measured {sorted(rates)[rounds // 2]:.0f} samples/s ({min(rates):.0f} .. "
      f"{max(rates):.0f} over {rounds} rounds), simulated {simulated:.0f}; error "
      f"{pl.metrics.error_spread(simulated, rates, load=load.result)}; "
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
# behind step 3), `04_schedules` (what the boxes above mean), `05_weight_versions`, `06_heterogeneous`,
# `07_beyond_dnns`, `08_planner` (which method and plan to run). Every notebook's first code cell holds
# its parameters.
