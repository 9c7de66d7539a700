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
# # 05 · Weight versions: stashing, vertical sync, 2BW, PipeMare
#
# Without flushes, a pipeline keeps several minibatches in flight: by the time minibatch `k`'s backward
# reaches stage 0, that stage has already applied updates from later minibatches. Using the *current*
# weights in the backward pass (**naive-async**) computes a gradient of a function nobody evaluated.
# PipeDream **stashes** the version each forward used and reuses it in the backward (SOSP'19, §3.3);
# **vertical sync** makes every stage use the input stage's version; **2BW** keeps only two versions and
# applies `W(t+1) = W(t) − ν∇f(W(t−1))` (Narayanan et al., ICML'21, §3); **PipeMare** keeps one version and
# corrects with learning-rate rescheduling and discrepancy correction (Yang et al., MLSys'21).
#
# First a live 4-process run, coloured by weight version: every backward box has its forward's colour.

# %% tags=["parameters"]
backend = "gloo"          # "gloo" (one process per worker) or "local" (reference executor)
workers = 4
steps = 24                # minibatches in the live run
compare_steps = 150       # minibatches per run in the comparison (reference executor)
batch_size = 32
lr = 0.1                  # SGD learning rate of the live run
learning_rates = [0.1, 0.4]
policies = ["1f1b-flush", "naive-async", "pipedream", "vertical-sync", "2bw", "pipemare"]

# %%
import functools

import pandas as pd
import plotly.express as px
import torch

import pipelab as pl
from pipelab.models import demo

images, labels = demo.digits_data("train")
n = len(labels) // batch_size * batch_size
data = functools.partial(demo.batches, (images[:n], labels[:n]), batch_size)
loss_fn = torch.nn.functional.cross_entropy
optimizer = functools.partial(torch.optim.SGD, lr=lr)

model = demo.small_cnn()
x0, y0 = data()[0]
prof = pl.profile(model, x0, loss_fn=loss_fn, target=y0, progress=False)
cluster = pl.Cluster.flat(workers, bandwidth=1e9)
plan = pl.partition(prof, cluster, method="pipedream", straight=True)
print(plan.describe())

# %%
handle = pl.launch(demo.small_cnn, plan, method="pipedream", data=data, loss_fn=loss_fn, optimizer=optimizer,
                   steps=steps, backend=backend)
pl.widgets.LiveGantt(handle, color_by="version", title="pipedream, coloured by weight version (live)")

# %%
run = handle.wait()
ev = run.trace.to_dataframe()
fb = ev[ev.kind.isin(["F", "B"])].pivot_table(index=["stage", "microbatch"], columns="kind",
                                              values="weight_version", aggfunc="first")
assert (fb["F"] == fb["B"]).all(), "weight stashing: every backward uses the version its forward used"
print("versions held per stage (measured):", run.versions_held)
fb.unstack("stage").head(8)

# %% [markdown]
# The table shows, per minibatch (row) and stage (column), the weight version its forward (`F`) and its
# backward (`B`) used: equal on every row, and lagging more at the early stages, whose updates run ahead of
# the minibatches still in flight.
#
# ## Six policies side by side
#
# Same model, data and plan; only the weight policy differs, with a synchronous baseline (`1f1b-flush`, one
# version, equal to plain minibatch SGD). Each run uses the reference executor (the same schedules and
# policies as the processes, in one process: identical weights, no start-up cost). We record the training
# loss, the test accuracy at each learning rate, the versions each stage held, and the weight memory.

# %%
from pipelab.runtime import supported_methods

test_x, test_y = demo.digits_data("test")

def accuracy(state):
    m = demo.small_cnn()
    m.load_state_dict(state)
    with torch.no_grad():
        return float((m(test_x).argmax(1) == test_y).float().mean())

# (method, options); 2BW and the flush split each minibatch into microbatches (2BW coalesces their gradients)
setups = {"1f1b-flush": ("1f1b-flush", {"microbatches": workers}), "naive-async": ("naive-async", {}),
          "pipedream": ("pipedream", {}), "vertical-sync": ("pipedream", {"vertical_sync": True}),
          "2bw": ("2bw", {"microbatches": workers}), "pipemare": ("pipemare", {})}
stage_params = [prof[s.start:s.end].param_bytes for s in plan.stages]
runnable = set(supported_methods())                 # the weight policies this runtime implements
skipped = [label for label in policies if setups[label][0] not in runnable]
if skipped:
    print(f"not run: {skipped}: this runtime has no weight policy for them (it has {sorted(runnable)})")
curves, table = [], []
for label in [label for label in policies if label not in skipped]:
    method, opts = setups[label]
    row = {"policy": label}
    for rate in learning_rates:
        r = pl.train(demo.small_cnn, plan, method=method, data=data, loss_fn=loss_fn,
                     optimizer=functools.partial(torch.optim.SGD, lr=rate), steps=compare_steps,
                     backend="local", progress=False, **opts)
        row[f"test accuracy, lr {rate}"] = accuracy(r.state_dict())
        curves += [{"policy": label, "lr": rate, "step": i, "loss": v} for i, v in enumerate(r.losses)]
    held = [r.versions_held[s] for s in range(plan.num_stages)]
    row["versions held per stage"] = held
    row["weight memory (KB)"] = round(sum(h * p for h, p in zip(held, stage_params)) / 1e3, 1)
    table.append(row)
results = pd.DataFrame(table)
results

# %%
px.line(pd.DataFrame(curves), x="step", y="loss", color="policy", facet_col="lr", log_y=True,
        title="training loss by weight policy and learning rate")

# %% [markdown]
# Read the accuracy columns together: at a small learning rate the few updates of staleness in a 4-stage
# pipeline hardly matter and every policy learns; at a larger one the asynchronous policies become unstable
# before the synchronous baseline does, because their gradients are computed on weights several updates
# old. Which asynchronous policy survives a given learning rate varies from run to run near that edge
# (try other rates); PipeMare's point is to make the early, most fragile steps smaller for the stages with
# the longest delay.

# %% [markdown]
# **Exercise.** Predict the versions held per stage for PipeDream (`P − s` for stage `s` of a straight
# `P`-stage pipeline, §3.3), 2BW (at most 2), naive-async and the flush (1), and check them against the
# measured column. Then explain vertical sync's column: why must a late stage keep as many versions as the
# input stage?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
held = dict(zip(results["policy"], results["versions held per stage"]))
P = plan.num_stages
if "pipedream" in held:
    assert list(held["pipedream"]) == [P - s for s in range(P)]
if "vertical-sync" in held:
    # every stage runs minibatch k on the version the *input stage* used for k; a late stage has
    # already moved past the versions that the P - 1 minibatches still on their way will ask for,
    # so it keeps them all: P versions at every stage, for consistency across stages
    assert list(held["vertical-sync"]) == [P] * P
if "1f1b-flush" in held:
    assert max(held["1f1b-flush"]) == 1
if "2bw" in held:
    assert max(held["2bw"]) <= 2
if "naive-async" in held:
    assert max(held["naive-async"]) == 1
print("predictions hold:", held)

# %% [markdown]
# **What each costs.** Stashing multiplies a stage's weight memory by the minibatches in flight there
# (`P − s`, so most at the input stage); vertical sync makes every stage agree on the input stage's
# version, which costs `P` versions at *every* stage; 2BW caps versions at two for any depth by coalescing
# gradients over a minibatch and applying them one update late; naive-async and PipeMare hold one version, and
# PipeMare pays instead with smaller early learning rates for delayed stages and an extrapolation of the
# weights (discrepancy correction). The flush holds one version too, and pays in bubbles (`04_schedules`).
