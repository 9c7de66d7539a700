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
steps = None                 # minibatches per run (None: about a second of steady state per run)
rounds = 3                   # real runs per configuration: the median is compared, the spread kept
cluster_path = None          # a calibrated cluster JSON; None: calibrate now
model_factors = False        # predict with each model's compute factor inside a run (calibrate_model)
pair_model_factors = True    # measure those factors anyway and report the same runs' error with them
fresh_profiles = True        # also profile each model again right before each configuration's runs
recalibrate = True           # calibrate again after the runs and compare its predictions too
default_plan = True          # also the planner default: 1f1b-flush, uniform split, a microbatch per stage
second_cluster_path = None   # with recalibrate: a second calibrated cluster JSON; None: calibrate then
out_dir = "."
report = False
held_out_rounds = 3          # paired rounds of the held-out models (held_out.py; 0: skip them)
held_out_steps = 40          # minibatches per held-out run
planner_errors = "sim_errors.json"   # where this machine's per-method errors go (relative to out_dir; None:
                             # not written): pass it to pl.plan(..., margin=...) or `pipelab plan --margin`

# %%
import json
import time
from pathlib import Path

import pandas as pd
from IPython.display import SVG, Markdown, display
from tqdm.auto import tqdm

import pipelab.calibrate as calibrate
from pipelab._io import atomic_write_text
from reproductions._common.report import markdown_table, write_table
from reproductions.sim_accuracy import accuracy as acc

out = Path(out_dir).resolve()
t_start = time.perf_counter()
cluster = calibrate.load(cluster_path, backend="gloo") if cluster_path else calibrate.calibrate(workers=2)
print(cluster.calibration.describe())

# %%
profiles = acc.profiles(models)
# with model_factors: per model, the factor by which its layers compute slower inside a run than
# profiled, measured in two-worker runs of its own (pipelab.calibrate.calibrate_model), not in the runs below
# (README: measured, it lowered the CNN's backward by 17% and made the matrix's error larger)
# with pair_model_factors they are measured either way and each row also carries the error the same
# real runs give with them (error_model_factor), so their effect is read off paired, in one run
factored = acc.model_clusters(cluster, profiles) if model_factors or pair_model_factors else None
clusters = factored if model_factors and factored else {m: cluster for m in models}
for name, cl in (factored or clusters).items():
    print(name, {k: round(v, 3) for k, v in cl.calibration.compute_factor.items()})
configs = [(*c, "balanced") for c in acc.configurations(full=full, models=models, methods_=methods,
                                                         workers=workers, microbatches=microbatches)]
if default_plan and (methods is None or "1f1b-flush" in methods):
    # the planner's default (1F1B, uniform split, M = P): what its real-run decisions are compared with
    configs += acc.default_configurations(models, workers or ((2, 3, 4) if full else (2,)))
rows = []
for model, method, p, m, split in tqdm(configs, desc="simulate + run"):
    rows.append(acc.run_one(model, method, p, m, prof=profiles[model], cluster=clusters[model], steps=steps,
                            rounds=rounds, split=split,
                            factor_cluster=factored[model] if factored and not model_factors else None,
                            fresh=(lambda m=model: acc.profiles([m])[m]) if fresh_profiles else None))
df = pd.DataFrame(rows)
# a second calibration of the machine, after the runs: the same real runs against its predictions
# (the same plans). A user calibrates once, so the simulator's error includes how far one calibration's
# predictions lie from the next's; the planner's margins take both.
if recalibrate:
    cluster2 = calibrate.load(second_cluster_path, backend="gloo") if second_cluster_path else \
        calibrate.calibrate(workers=2)
    print("second calibration:", cluster2.calibration.describe().splitlines()[0])
    df["simulated_recalibrated"] = [
        acc.predicted_on(r.model, r.method, int(r.workers), int(r.microbatches), prof=profiles[r.model],
                         plan_cluster=clusters[r.model], cluster=cluster2, steps=int(r.steps),
                         split="balanced" if r.split == "dp" else str(r.split))
        for r in df.itertuples()]
    df["error_recalibrated"] = (df["simulated_recalibrated"] - df["measured"]) / df["measured"]
    shift = df["simulated_recalibrated"] / df["simulated"]
    # and each model profiled again after the runs: the same plans on the second calibration and the
    # second profile, to tell how much of the move between the two is the profile's
    profiles2 = acc.profiles(models)
    df["simulated_reprofiled"] = [
        acc.predicted_on(r.model, r.method, int(r.workers), int(r.microbatches), prof=profiles[r.model],
                         plan_cluster=clusters[r.model], cluster=cluster2, steps=int(r.steps),
                         split="balanced" if r.split == "dp" else str(r.split), sim_prof=profiles2[r.model])
        for r in df.itertuples()]
    df["error_reprofiled"] = (df["simulated_reprofiled"] - df["measured"]) / df["measured"]
    reshift = df["simulated_reprofiled"] / df["simulated_recalibrated"]
    print(f"second profile / first (on the second calibration), simulated throughput: median "
          f"{reshift.median():.3f}, range {reshift.min():.3f}-{reshift.max():.3f}; median |error| "
          f"{df['error_reprofiled'].abs().median():.1%}, worst {df['error_reprofiled'].abs().max():.1%}")
    again = df["error_recalibrated"].abs()
    print(f"second calibration / first, simulated throughput: median {shift.median():.3f}, range "
          f"{shift.min():.3f}-{shift.max():.3f}; median |error| {again.median():.1%}, "
          f"worst {again.max():.1%}")
write_table(df, out / "results.csv")
if planner_errors:
    from reproductions.sim_accuracy.errors_file import write_errors
    planner_errors = out / planner_errors
    # pooled with this host's last runs (one run's ranges do not hold the next run's errors)
    write_errors(df, planner_errors, source=f"reproductions/sim_accuracy, {len(df)} configurations x "
                 f"{rounds} rounds; {cluster.calibration.describe().splitlines()[0]}",
                 host=cluster.calibration.host)
    # this run held out: its errors less the shift against the margin of the host's runs before it
    held = json.loads(Path(planner_errors).read_text())["runs"][-1].get("held_out")
    held_line = (f"held out: {held['inside']} of {held['of']} errors less the shift (both calibrations) "
                 f"inside the planner's margin pooled from this host's {held['runs_before']} runs before "
                 "this one\n") if held else "held out: no earlier run of this host to check against\n"
    print(held_line, end="")
else:
    held_line = ""
df[["model", "method", "workers", "microbatches", "simulated", "measured", "measured_spread", "error",
    "error_one_allreduce_latency", "error_model_factor", "error_fresh_profile", "replay_error",
    "busy_error_median", "memory_error_max"]]

# %%
table = acc.method_table(df)
md = markdown_table(table)
def factors_of(c):
    return ", ".join(f"{k} {v:.2f}x" for k, v in sorted(c.calibration.compute_factor.items()))


factors = "\n".join(f"  {n}: {factors_of(c) or 'not measured (model_factors=False)'}"
                    + ("" if model_factors or not factored else " (paired only: error_model_factor)")
                    for n, c in (factored or clusters).items())
second = (f"second calibration, after the runs (error_recalibrated): {cluster2.calibration.describe()}\n"
          f"its simulated throughput / the first's: median {shift.median():.3f}, range {shift.min():.3f}-"
          f"{shift.max():.3f}\n"
          f"with each model profiled again after the runs too (error_reprofiled): simulated throughput / "
          f"the second calibration's with the first profiles: median {reshift.median():.3f}, range "
          f"{reshift.min():.3f}-{reshift.max():.3f}; median |error| "
          f"{df['error_reprofiled'].abs().median():.1%}, worst {df['error_reprofiled'].abs().max():.1%}\n") \
    if recalibrate else ""
rel = acc.less_shift(df).abs()
shift_line = (f"the run's common shift (median signed error): {acc.shift_of(df):+.1%}; less it, median "
              f"|error| {rel.median():.1%}, worst {rel.max():.1%}\n")
atomic_write_text(out / "results.md", f"{md}\n\n{shift_line}{held_line}"
                  f"machine: {cluster.calibration.describe()}\n{second}"
                  f"compute inside a run / profile, per model (calibrate_model):\n{factors}\n")
svg = acc.svg_scatter(df, title="simulated vs measured samples/s (log-log; band: ±10%)")
atomic_write_text(out / "scatter.svg", svg)
display(Markdown(md), SVG(svg))
print(f"median |error| {df['error'].abs().median():.1%}, worst {df['error'].abs().max():.1%} over "
      f"{len(df)} runs; the run's common shift {acc.shift_of(df):+.1%}, and less it median "
      f"{rel.median():.1%}, worst {rel.max():.1%}; {time.perf_counter() - t_start:.0f} s in all")

# %% [markdown]
# ## Held-out models: which host effects earn their place
#
# The two models above are the ones the project's tests, notebooks and earlier calibration work use.
# `held_out.py` runs two models used nowhere else (a residual conv net, a GRU; `held_out_models.py`)
# under the quickstart's recipe, each configuration predicted by the core model alone, with every
# host effect of this calibration, and with all but each one, in paired rounds (see `README.md`).
# The longer run, fitted models included: `python reproductions/sim_accuracy/held_out.py --fitted --rounds 5`.

# %%
if held_out_rounds:
    import held_out

    ho = held_out.run(cluster, ("held-out",), rounds=held_out_rounds, steps=held_out_steps)
    write_table(ho, out / "held_out.csv")
    md_ho = held_out.report(ho, cluster, f"{held_out_steps} minibatches per run (the sim_accuracy notebook)")
    atomic_write_text(out / "held_out.md", md_ho)
    display(Markdown(md_ho))
