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
# # Statistical efficiency: weight stashing, vertical sync, naive pipelining, 2BW, PipeMare
#
# **Claims.** Without weight stashing, a pipelined backward pass uses weights other than the ones its
# forward pass used, and training does not reach data-parallel accuracy; with stashing (PipeDream,
# Narayanan et al. SOSP'19 §3.3, evaluated in §5) it does. PipeMare (Yang et al., MLSys'21) keeps no
# stash and closes the gap with learning-rate rescheduling and discrepancy correction instead.
#
# **Set-up.** Real training with pipelab's runtime (`pl.train`), 4 stages, on scikit-learn's bundled
# 8×8 digits with a small CNN (`pl.models.small_cnn`), the same learning rate for every method (one
# that data parallelism trains well with). Each method executes the schedule `pl.schedules.build`
# returns (the one the simulator times and the Gantt chart draws); `backend="local"` is the
# single-process reference executor, which gives the same weights as real processes
# (`backend="gloo"`), only faster here. Test accuracy on a fixed held-out split after every epoch.
#
# | method | weights a backward pass uses |
# |---|---|
# | `dp`, `gpipe` | the weights its forward used (synchronous: the same as plain minibatch SGD) |
# | `pipedream` | a stashed copy of the version its forward used (PipeDream §3.3) |
# | `pipedream+vertical_sync` | every stage uses the version the input stage used for that minibatch |
# | `naive-async` | whatever is newest when it runs (no stash): the ablation of PipeDream §3 |
# | `2bw` | two versions, `W(t+1) = W(t) - lr * grad f(W(t-1))` (PipeDream-2BW, ICML'21 §3) |
# | `pipemare` | no stash; learning-rate rescheduling and discrepancy correction (PipeMare §3) |

# %% tags=["parameters"]
methods = ["dp", "gpipe", "pipedream", "pipedream+vertical_sync", "naive-async", "2bw", "pipemare"]
stages = 4
epochs = 8
batch_size = 32
lr = 0.2                     # plain SGD
momentum = 0.0
channels = 16
sweep_lrs = [0.1, 0.2, 0.4]  # a learning-rate sweep of the three methods the main claim is about
sweep_methods = ["dp", "pipedream", "naive-async"]
sweep_epochs = 6
train_limit = 0              # 0: the whole training split; >0: only that many samples (tests)
backend = "local"            # local: the single-process reference executor; gloo: real processes
seeds = [0, 1]               # each seed: its own initial weights, train/test split and data order
out_dir = "."
report = False

# %%
from reproductions._common.report import show_figure


def show(fig):
    """Show a figure live in JupyterLab; in a report, as HTML whose plotly.js the driver adds once."""
    show_figure(fig, report)


# %%
from pathlib import Path

import pandas as pd

from reproductions._common import report as output
from reproductions.weight_stashing import stashing

runs = [stashing.stash_experiment(methods, stages=stages, epochs=epochs, batch_size=batch_size, lr=lr,
                            momentum=momentum, channels=channels, train_limit=train_limit,
                            backend=backend, seed=s, progress=not report).assign(seed=s) for s in seeds]
per_seed = pd.concat(runs, ignore_index=True)
curves = stashing.mean_over_seeds(per_seed)
curves.pivot(index="epoch", columns="method", values="test_accuracy")

# %% [markdown]
# ## Summary
#
# Accuracies are means over the seeds. `late_accuracy` is the mean test accuracy over the last three
# epochs (one epoch's accuracy on 359 test images moves by a few points from epoch to epoch); the gap
# is to data parallelism, in points.

# %%
final = stashing.stash_summary(curves)
print(stashing.stash_verdict(final))
final

# %%
title = f"digits, small CNN, {stages} stages, lr {lr}, momentum {momentum}: test accuracy"
show(output.curves_figure(curves, x="epoch", y="test_accuracy", color="method", title=title))

# %% [markdown]
# ## How it depends on the learning rate
#
# Staleness hurts more as steps get larger. The same three methods at a few learning rates (late accuracy,
# mean of the last three epochs):

# %%
sweep = stashing.stash_lr_sweep(sweep_methods, sweep_lrs, stages=stages, epochs=sweep_epochs,
                                batch_size=batch_size, momentum=momentum, channels=channels,
                                train_limit=train_limit, backend=backend, seed=seeds[0], progress=not report)
sweep

# %%
out = Path(out_dir)
output.write_table(sweep, out / "lr_sweep.csv")
output.write_table(per_seed, out / "accuracy_per_seed.csv")
output.write_table(curves, out / "accuracy.csv")
output.write_table(final, out / "summary.csv")
svg = output.svg_curves(curves, x="epoch", y="test_accuracy", color="method",
                    title=f"digits CNN, {stages} stages: test accuracy per epoch")
output.write_text(out / "accuracy.svg", svg)
verdict = stashing.stash_verdict(final)
output.write_text(out / "results.md",
              f"# Weight stashing: results\n\nlr {lr}, momentum {momentum}, {epochs} epochs, "
              f"{stages} stages, mean of seeds {seeds}\n\n{output.markdown_table(final)}\n\n"
              f"```\n{verdict}\n```\n\n"
              f"## Learning-rate sweep (late accuracy)\n\n{output.markdown_table(sweep)}\n")
