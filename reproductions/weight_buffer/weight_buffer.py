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
# # Bounded weight buffers, 2BW, PipeMare's two techniques, and activation compression
#
# **Claims** (see README.md here): a bounded weight buffer keeps at most `K` versions per stage (Lv et
# al., CCGrid'23), `K = 2` being PipeDream-2BW's double buffering (Narayanan et al., ICML'21 §3);
# PipeMare (Yang et al., MLSys'21) trains without a stash using learning-rate rescheduling (T1) and
# discrepancy correction (T2); compressing the activations and gradients between stages (fp16, bf16,
# int8) cuts the bytes on the wire by 2× or about 4× at little cost in accuracy.
#
# **Set-up.** `run.py` in this folder, written with the runtime's weight policies: the digits CNN over
# 4 stages, SGD with momentum 0.9, the runtime's reference executor, several seeds per configuration;
# test accuracy against GPipe's (synchronous), versions held, and the bytes that crossed stage
# boundaries (from the trace). This notebook runs it for each learning rate and shows its tables.

# %% tags=["parameters"]
lrs = [0.02, 0.04]
epochs = 6
seeds = 3
quick = False                # one epoch, one seed, three configurations, first learning rate only (tests)
out_dir = "."
report = False

# %%
import subprocess
import sys
from pathlib import Path

import pandas as pd
from IPython.display import display

out = Path(out_dir).resolve()
tables = {}
for lr in lrs[:1] if quick else lrs:
    args = [sys.executable, "run.py", "--out", str(out), "--lr", str(lr)]
    args += ["--quick"] if quick else ["--epochs", str(epochs), "--seeds", str(seeds)]
    done = subprocess.run(args, capture_output=True, text=True)
    print(done.stdout[-3000:])
    if done.returncode != 0:
        raise RuntimeError(f"run.py --lr {lr} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    tables[lr] = pd.read_csv(out / f"results_lr{lr:g}.csv")
for lr, table in tables.items():
    print(f"lr {lr}:")
    display(table)
