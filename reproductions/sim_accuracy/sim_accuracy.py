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
# # How far is the simulator from real runs? Method by method, on the machine at hand
#
# pipelab's promise is that you can study pipelines on clusters you do not have because its
# simulator times the very schedule its runtime executes. This notebook measures how good that is:
# it **calibrates** this machine (`pl.calibrate`: point-to-point latency and bandwidth of gloo, the
# ring all-reduce, the runtime's own per-action overhead, the optimizer step, memory bandwidth),
# **profiles** two models here (the digits CNN and a transformer-style stack of 4 encoder blocks),
# then for every method × workers × microbatches **simulates** the plan on the calibrated cluster and
# **runs** it for real on gloo processes, measuring both traces the same way (the steady-state
# window of minibatch completions). See `README.md` here for the figures and what decides them.

# %% tags=["parameters"]
full = False                 # the whole matrix: 2-4 workers x 1-8 microbatches (about 20 minutes here)
models = ["cnn", "transformer"]
methods = None               # None: dp, gpipe, 1f1b-flush, interleaved-1f1b, zb-h1, pipedream, 2bw, pipemare
workers = None               # None: (2,) by default, (2, 3, 4) with full
microbatches = None          # None: (4,) by default, (1, 2, 4, 8) with full
steps = 24                   # minibatches per run
cluster_path = None          # a calibrated cluster JSON; None: calibrate now
out_dir = "."
report = False

# %%
import time
from pathlib import Path

import pandas as pd
from IPython.display import SVG, Markdown, display
from tqdm.auto import tqdm

import pipelab.calibrate as calibrate
from pipelab._io import atomic_write_text
from pipelab.reproduce import accuracy as acc
from pipelab.reproduce.report import markdown_table, write_table

out = Path(out_dir).resolve()
t_start = time.perf_counter()
cluster = calibrate.load(cluster_path, backend="gloo") if cluster_path else calibrate.calibrate(workers=2)
print(cluster.calibration.describe())

# %%
profiles = acc.profiles(models)
configs = acc.configurations(full=full, models=models, methods_=methods, workers=workers,
                             microbatches=microbatches)
rows = []
for cfg in tqdm(configs, desc="simulate + run"):
    rows.append(acc.run_one(*cfg, prof=profiles[cfg[0]], cluster=cluster, steps=steps))
df = pd.DataFrame(rows)
write_table(df, out / "results.csv")
df[["model", "method", "workers", "microbatches", "simulated", "measured", "error", "busy_error_median"]]

# %%
table = acc.method_table(df)
md = markdown_table(table)
atomic_write_text(out / "results.md", f"{md}\n\nmachine: {cluster.calibration.describe()}\n")
svg = acc.svg_scatter(df, title="simulated vs measured samples/s (log-log; band: ±10%)")
atomic_write_text(out / "scatter.svg", svg)
display(Markdown(md), SVG(svg))
print(f"median |error| {df['error'].abs().median():.1%}, worst {df['error'].abs().max():.1%} over "
      f"{len(df)} runs; {time.perf_counter() - t_start:.0f} s in all")
