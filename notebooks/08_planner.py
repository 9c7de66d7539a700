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
# # 08 · The planner: what to run on this cluster, and why it is slower than the formula
#
# Two questions come back again and again in the issue trackers of pipeline engines: *how should I
# split and schedule my model on my GPUs within memory*, and *where do my bubbles come from*. Engines
# leave the first to hand tuning (a uniform layer split, a schedule picked by name) and answer the
# second with a raw trace. pipelab has every method, a memory model and a simulator on the same
# schedules, so it can answer both:
#
# * `pl.plan(profile, cluster)` searches methods × partitions (uniform, GPipe's time balance,
#   prefix-sum, PipeDream's DP, data parallel; every stage count; replication) × microbatches ×
#   interleaving chunks × recomputation × activation compression, prunes with closed-form bounds,
#   simulates the rest and returns a ranked table with the Pareto front of throughput against memory.
#   Asynchronous methods are ranked too, with their weight staleness flagged (a statistical-efficiency
#   risk: more epochs may be needed), not hidden.
# * The pick is honest about the simulator's error. With a signed relative error
#   `(predicted - measured) / measured` measured in `[lo, hi]`, a prediction `p` says the measurement
#   lies in `[p/(1+hi), p/(1+lo)]` (one number `e`: `[p/(1+e), p/(1-e)]`); a candidate replaces the
#   default (1F1B on a uniform layer split) only when its interval lies wholly above the default's, and
#   candidates whose intervals reach the fastest's go to the simplest (synchronous, fewer stages, data
#   parallelism itself, ...). The range is `margin=`, measured on the machine the plans are for: the
#   `sim_errors.json` that `reproductions/sim_accuracy` writes there (its errors per method less each
#   run's common shift: one calibration's predictions all move together with what the machine did
#   since, and that shift cancels when two of them are compared), or a plain number. No machine's
#   errors ship as a default: without a margin the planner says so and ranks by prediction alone.
#   Columns `vs_default`, `needs_vs_default` (the predicted gain a row would need to be surely faster
#   than the default, `(1 + hi) / (1 + lo_default)`), `within_error` and `pick` show the rule;
#   `equivalent` names what a degenerate candidate is (a pipelining method on one replicated stage is
#   data parallelism, and takes `dp`'s error; an asynchronous one there is collapsed, not ranked).
# * Where the cluster is the machine you are on, `pl.planner.confirm(table, model_fn, data, loss_fn,
#   optimizer)` trains the shortlist (the default, the pick, the fastest prediction, the next two) side by
#   side and keeps the default unless a candidate beat it in most rounds: the simulator searches, the
#   measurement decides among the few it shortlists.
# * `pl.explain(result)` splits every worker's idle time into fill/drain inherent to the schedule,
#   waiting on a slower stage, a straggler, waiting on a transfer, and updates/all-reduce, and finds
#   the critical path.

# %% tags=["parameters"]
full_search = False             # True: both models on four 16-GPU clusters, three real models (many minutes)
models = ["gnmt16"]                                # shipped PipeDream profiles
clusters = ["pipedream-a:1x4", "dgx-h100:1x8"]
run_real = False                                   # True: run the pick and the default for real (minutes)
real_models = ["cnn"]                              # digits CNN; also "transformer", "unbalanced" (heavy head)
real_steps = None                                  # minibatches per real run (None: about a second of
                                                   # steady state, as reproductions/sim_accuracy runs)
real_rounds = 3                                    # rounds, variants interleaved; medians quoted
confirm_rounds = 1                                 # rounds of pl.planner.confirm (its own runs)
confirm_top = 2                                    # its shortlist: default, pick, fastest and the next
                                                   # `confirm_top` predictions that fit
margin_file = None                                 # this machine's sim_errors.json, which
                                                   # reproductions/sim_accuracy writes; None: ranked
                                                   # by prediction alone
cluster_file = None                                # this machine calibrated (`pipelab calibrate -o
                                                   # me.json`) for the real runs; None: calibrate here

# %%
if full_search:
    models = ["vgg16", "gnmt16"]
    clusters = ["pipedream-a:4x4", "pipedream-b:2x8", "dgx-h100:2x8", "a100-ib:2x8"]
    real_models = ["cnn", "transformer", "unbalanced"]
    run_real, real_rounds, confirm_rounds = True, 5, 3

# %%
import functools
import os
import statistics

import pandas as pd

import pipelab as pl
from reproductions.pipedream_table1 import rows as table1

# %% [markdown]
# ## Profiles on today's GPUs: the assumption
#
# PipeDream's profiles were measured on V100s (clusters A and B of the paper). To plan them on a DGX
# H100 or an A100 + InfiniBand cluster we **scale every layer's time by the ratio of FP32 peak
# throughput** from NVIDIA's data sheets: V100 (SXM2) 15.7 TFLOPS, A100 19.5 TFLOPS, H100 SXM
# 67 TFLOPS, so A100 = 1.24× and H100 = 4.27× a V100. This is first order only: it ignores tensor
# cores and mixed precision (which favour the newer GPUs far more), memory bandwidth and kernel
# efficiency at small microbatches. Communication uses the presets' own links (NVLink 3/4 inside a
# server, 200/400 Gbps InfiniBand per GPU across).

# %%
SPEED = {"pipedream-a": 1.0, "pipedream-b": 1.0, "a100-ib": 19.5 / 15.7, "dgx-h100": 67.0 / 15.7}


def make_cluster(spec: str) -> pl.Cluster:
    """A preset ``name:SxG`` with its devices' speed relative to a V100 (the profiles' GPU)."""
    name, shape = spec.split(":")
    servers, gpus = (int(x) for x in shape.lower().split("x"))
    return pl.Cluster.preset(name, servers=servers, gpus_per_server=gpus, speed=SPEED[name])


# %% [markdown]
# ## The planner on the shipped profiles
#
# For each model and cluster: the planner's pick, its best synchronous pick (a method that flushes: no
# stale weights), the default a torch or Megatron user gets (1F1B with flush on a uniform layer split
# over every worker, `M = P` microbatches), and PipeDream's Table 1 configuration (Narayanan et al.,
# SOSP'19), simulated with PipeDream's method — all on the same simulator.

# %%
rows, tables = [], {}
for model in models:
    prof = pl.Profile.open(model)
    for spec in clusters:
        cl = make_cluster(spec)
        table = pl.plan(prof, cl, progress=True)
        tables[(model, spec)] = table
        best, default = table.best, table.default
        t = table.table
        sync = t[(t["rank"] > 0) & t["synchronous"]].sort_values("rank").iloc[0]
        name, shape = spec.split(":")
        servers, gpus = (int(x) for x in shape.split("x"))
        paper = table1.paper_row(model, name, servers, gpus)
        paper_tp = None
        if paper is not None:
            cands = tuple(c.plan for c in table.candidates if c.partitioner.startswith("pipedream"))
            pplan = table1.paper_config_plan(prof, cl, paper.config, candidates=cands)
            if pplan is not None:
                paper_tp = pl.simulate(pplan, prof, cl, "pipedream").throughput
        rows.append({
            "model": model, "cluster": spec,
            "pick": f"{best['method']} · {best['partitioner']} {best['config']} · M={best['microbatches']}"
                    + (f" · v={best['chunks']}" if best["chunks"] else "")
                    + (" · recompute" if best["recompute"] else "")
                    + (f" · {best['compression']}" if best["compression"] != "none" else ""),
            "pick samples/s": best["throughput"], "pick staleness": best["staleness_risk"] or "none",
            "sync pick": f"{sync['method']} · {sync['partitioner']} {sync['config']} "
                         f"· M={sync['microbatches']}",
            "sync samples/s": sync["throughput"],
            "default samples/s": default["throughput"],
            "Table 1 config": paper.config if paper else "—",
            "Table 1 sim. samples/s": paper_tp,
            "pick / default": best["throughput"] / default["throughput"],
            "sync / default": sync["throughput"] / default["throughput"],
        })
summary = pd.DataFrame(rows)
summary.style.format({c: "{:.0f}" for c in summary.columns if "samples/s" in c}
                     | {"pick / default": "{:.2f}×", "sync / default": "{:.2f}×"}, na_rep="—")

# %% [markdown]
# The default (a uniform split, `M = P`) is in the planner's search space and is always simulated, so the
# pick can never be predicted slower than it; the check below is that the search and the decision hold
# that (surely faster given the error, or the default itself), and that the pick re-simulates to its
# table value.

# %%
for (model, spec), table in tables.items():
    best, default = table.best, table.default
    assert best.name == default.name or not default["fits"] or best["throughput"] > default["throughput"], \
        (model, spec)
    again = table.simulate()
    assert abs(again.throughput - best["throughput"]) <= 1e-6 * best["throughput"]
print("pick = default, or predicted faster, on every model and cluster; the pick re-simulates to its "
      "table value")

# %% [markdown]
# ## The Pareto front, interactively
#
# Every simulated candidate as throughput against peak memory per worker; the line is the Pareto front
# (nothing that fits is faster for less memory). Click a point: its Gantt chart (the critical path in
# red), its memory per worker against the device, and where its bubbles come from.

# %%
key = (models[-1], clusters[0])
explorer = pl.widgets.PlannerExplorer(tables[key])
explorer

# %% [markdown]
# ## Bubbles explained: why the default is slower than the formula
#
# The textbook bubble of 1F1B with `P` stages and `M` microbatches is `(P-1)/(M+P-1)`. The default run's
# idle time is more than that; `pl.explain` says how much of it is the schedule's own fill and drain,
# how much is waiting on a slower stage (a uniform layer split is not a balanced one), on transfers, and on
# the optimizer step. Every part is a share of the run's actual makespan (so the parts add up to its idle
# time): the schedule's fill and drain cost the same seconds as in a balanced pipeline, a smaller share of a
# longer run.

# %%
table = tables[key]
res = table.simulate(int(table.default.name))
bd = pl.explain(res)
P, M = res.schedule.num_workers, res.schedule.microbatches
print(f"{key[0]} on {key[1]}, default: {bd.summary()}")
print(f"closed form (P-1)/(M+P-1) = {(P - 1) / (M + P - 1):.1%} of the makespan of a balanced pipeline; "
      f"here the fill/drain seconds are {bd.table['fill_drain'].mean() / bd.makespan:.1%} of a makespan that "
      f"imbalance and transfers made longer")
pl.views.bubbles(bd)

# %%
pl.views.with_critical_path(pl.views.gantt(res), res.trace, bd.critical_path)

# %% [markdown]
# **Exercise.** Check `pl.explain` against its oracles. On unit costs (`UnitCosts()`: every stage one unit
# forward, two backward, no transfers), all idle time of GPipe and 1F1B with `P = 4`, `M = 8` must be
# fill/drain and equal `(P−1)/(M+P−1)`. Then slow worker 2 down 1.5× (a `UnitCosts` subclass whose
# `compute` multiplies worker 2's durations) and tell `explain` about it (`slowdown={2: 1.5}`): every other
# worker's straggler part must be exactly the makespan the slowdown adds, and for GPipe that is
# `0.5 × M × 3` units (the slow worker is the bottleneck of both phases).
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
from dataclasses import dataclass  # noqa: E402

from pipelab.schedules.dataflow import UnitCosts  # noqa: E402
from pipelab.sim.simulate import simulate_schedule  # noqa: E402


@dataclass(frozen=True)
class SlowWorker(UnitCosts):
    """Unit costs, worker 2 taking 1.5 times as long."""

    def compute(self, worker, action, split):
        return super().compute(worker, action, split) * (1.5 if worker == 2 else 1.0)


for method in ("gpipe", "1f1b-flush"):
    sch = pl.schedules.build(method, 4, microbatches=8, minibatches=1)
    unit = pl.explain(simulate_schedule(sch, UnitCosts()).trace, sch)
    assert abs(unit.totals()["fill_drain"] - 3 / 11) < 1e-12, method
    slow = simulate_schedule(sch, SlowWorker())
    added = slow.trace.makespan - simulate_schedule(sch, UnitCosts()).trace.makespan
    parts = pl.explain(slow.trace, sch, slowdown={2: 1.5}).table
    assert all(abs(parts.loc[w, "straggler"] - added) < 1e-9 for w in (0, 1, 3)), method
    if method == "gpipe":
        assert abs(added - 0.5 * 8 * 3) < 1e-9
    print(f"{method}: fill/drain 3/11 on unit costs; straggler part {added:g} units on every other worker")

# %% [markdown]
# ## Run for real: the planner's pick against the default on this machine
#
# This part runs with `run_real = True` in the parameters cell (a few minutes: it calibrates the
# machine, or loads the calibrated cluster `cluster_file` names, then trains every variant several times).
#
# `pl.calibrate` measures this machine (gloo point-to-point and all-reduce, the runtime's per-action
# overhead, the optimizer step) and returns a calibrated 2-worker cluster; `real_models` are profiled here
# (all three with `full_search = True`): the digits CNN, a transformer block stack, and an **unbalanced**
# one: the same stack with four blocks and a 3,000-token vocabulary head, one layer about as heavy as the
# four blocks together at the very end, so a uniform split by layer count puts most of the work on the last
# worker. The planner searches with `allreduce_overlap="none"` (pipelab's runtime all-reduces after the
# backward) and without compression or recomputation (which would only cost time on CPUs with memory to
# spare); on this calibrated cluster its
# margin is `margin_file`'s (none given: ranked by prediction alone). Each variant is trained for real
# on 2 gloo processes: the **default** (1F1B, uniform split, `M = P`), the planner's **pick**, where the
# error made them differ the **fastest** predicted candidate, and the **sync pick** of the same search over
# synchronous methods only (no stale weights) where it is neither the default nor the pick. Before that,
# `pl.planner.confirm` measures the planner's shortlist (the default, the pick, the fastest prediction and
# the next two that fit) in runs of its own, side by side, and chooses by measurement: a candidate replaces
# the default only when it was faster than the default's run of the same round in most rounds (column
# `confirmed`; a **confirmed** variant where that is none of the others). On this shared 2-core machine the
# same plan measures ±15% from one minute to the next and a calibration's predictions shift as a whole by as
# much, so a predicted gain inside that noise is for the machine, not the model, to decide. Variants are
# interleaved round by round, each run about a second of steady state as in `reproductions/sim_accuracy`,
# and measured over the steady-state window the simulator uses (sim_accuracy's
# `accuracy.steady_throughput`); figures are medians, and a variant's gain over the default is the median of
# its per-round ratios to the default's run of the same round. A second, short run of each (3 minibatches,
# `measure_memory=True`) measures its peak memory (`RunResult.peak_state`: the terms the memory model
# counts) against what the table reports. The machine is 2 shared cores: read the rounds.

# %%
real = []
if run_real:
    import math  # noqa: E402

    import pipelab.methods as registry  # noqa: E402
    from pipelab.calibrate import calibrate  # noqa: E402
    from pipelab.models import demo  # noqa: E402
    from pipelab.planner.decide import bounds_of, less_shift, load_ranges  # noqa: E402
    from reproductions.sim_accuracy import accuracy  # noqa: E402

    # the errors as measured (not less the shift), to check this notebook's own errors against
    absolute = load_ranges(margin_file) if margin_file else None

    REAL = {**accuracy.MODELS,   # name -> (model_fn, data_fn, loss_fn, batch)
            "unbalanced": (functools.partial(demo.tiny_transformer, vocab=3000, d_model=64, heads=2, depth=4,
                                             max_len=16), accuracy.transformer_data, accuracy.token_loss, 32)}
    # minibatches per run: sim_accuracy's (about a second of steady state; 16 minibatches gave a
    # window of 40 ms on the CNN, at the mercy of one descheduling)
    STEPS = {**accuracy.STEPS, "unbalanced": accuracy.STEPS["transformer"]}
    SYNC = [m for m in pl.planner.DEFAULT_METHODS if registry.get(m).synchronous]
    here = pl.Cluster.load(cluster_file) if cluster_file else calibrate(workers=2, progress=False)

    def profile_of(name):
        """``name``'s profile on this machine, with the loss its last stage computes: its time and what
        it saves for its backward (the unbalanced model's log-softmax over 3,000 classes: 2.9 MiB a
        microbatch)."""
        model_fn, data_fn, loss_fn, batch = REAL[name]
        x, y = data_fn(batch)[0]
        return pl.profile(model_fn(), x, loss_fn=loss_fn, target=y, progress=False, repeats=5,
                          model_name=name)

    profs = {name: profile_of(name) for name in real_models}

    def run_variant(name, table, row, steps, **more):
        """Train the candidate of ``row`` for real: (measured steady samples/s, the run)."""
        model_fn, data_fn, loss_fn, batch = REAL[name]
        run = table.train(row, model_fn, functools.partial(data_fn, batch), loss_fn, accuracy.sgd,
                          steps=steps, backend="gloo", progress=False, **more)
        return accuracy.steady_throughput(run.trace, run.schedule, batch), run

    runs, tables_here, confirmations = {}, {}, {}
    for name, prof in profs.items():
        table = pl.plan(prof, here, compression=(None,), recompute=(False,), allreduce_overlap="none",
                        margin=margin_file)
        tables_here[name] = table
        # the shortlist (default, pick, fastest, next two) measured side by side: the choice by measurement
        model_fn, data_fn, loss_fn, batch = REAL[name]
        confirmed = pl.planner.confirm(table, model_fn, functools.partial(data_fn, batch), loss_fn,
                                       accuracy.sgd, rounds=confirm_rounds, steps=real_steps, top=confirm_top,
                                       progress=False)
        confirmations[name] = confirmed
        print(f"{name}: {confirmed.describe()}\n")
        # the same search over synchronous methods only (no stale weights): its pick, when it differs
        sync_table = pl.plan(prof, here, methods=SYNC, compression=(None,), recompute=(False,),
                             allreduce_overlap="none", margin=margin_file)
        variants = {"default": (table, int(table.default.name))}
        if table.best.name != table.default.name:
            variants["pick"] = (table, int(table.best.name))
        else:
            variants = {"default = pick": variants["default"]}
        if int(table.fastest.name) != int(table.best.name):
            variants["fastest"] = (table, int(table.fastest.name))
        if sync_table.best.name != sync_table.default.name and \
                sync_table.candidate().key() != table.candidate().key():
            variants["sync pick"] = (sync_table, int(sync_table.best.name))
        if confirmed.row not in {row for tb, row in variants.values() if tb is table}:
            variants["confirmed"] = (table, confirmed.row)
        f = sync_table.fastest
        print(f"{name}, synchronous only: pick "
              + ("the default" if sync_table.best.name == sync_table.default.name else
                 f"{sync_table.best['method']} {sync_table.best['config']}")
              + f" (fastest {f['method']} · {f['partitioner']} {f['config']} · M={f['microbatches']}, "
                f"predicted {f['vs_default']:.2f}x the default; within the error: {bool(f['within_error'])})")
        batch = REAL[name][3]
        steps = real_steps or STEPS[name]
        predicted = {v: accuracy.steady_throughput((s := tb.simulate(row, minibatches=steps)).trace,
                                                   s.schedule, batch) for v, (tb, row) in variants.items()}
        got = {v: [] for v in variants}
        for _ in range(real_rounds):
            for v, (tb, row) in variants.items():
                measured, run = run_variant(name, tb, row, steps)
                got[v].append(measured)
                runs[(name, v)] = run
        for v, (tb, row) in variants.items():
            r = tb.table.loc[row]
            short = tb.simulate(row, minibatches=3)
            mem = run_variant(name, tb, row, 3, schedule=short.schedule, measure_memory=True)[1]
            peak = max(mem.peak_state.values())
            meas = statistics.median(got[v])
            # each round against the default's run of the same round (side by side, so what the
            # machine does to both in a round cancels): the median of those ratios
            base = next(got[u] for u in got if u.startswith("default"))
            paired = [x / d for x, d in zip(got[v], base)]
            # the simulator's measured error range for this row's method (margin_file's): is this run's
            # error inside it? And the range less the run's shift (the margin the pick was made with),
            # which the error less this notebook's own shift is checked against below
            err = (predicted[v] - meas) / meas
            lo, hi = bounds_of(absolute, r["method"], r["equivalent"]) if absolute else (math.nan, math.nan)
            rlo, rhi = bounds_of(tb.margin, r["method"], r["equivalent"])
            real.append({"model": name, "variant": v, "confirmed": tb is table and row == confirmed.row,
                         "plan": f"{r['method']} · {r['partitioner']} {r['config']} · M={r['microbatches']}"
                                 + (f" ({r['equivalent']})" if r["equivalent"] else ""),
                         "measured samples/s": meas, "predicted samples/s": predicted[v],
                         "error": err, "error range": f"{lo:+.0%}..{hi:+.0%}", "in range": lo <= err <= hi,
                         "relative range": (rlo, rhi),
                         "rounds": ", ".join(f"{m:.0f}" for m in got[v]),
                         "measured vs default": statistics.median(paired),
                         "rounds vs default": ", ".join(f"{x:.2f}" for x in paired),
                         "predicted vs default": r["vs_default"],
                         "peak MiB (table)": r["peak_memory"] / 2**20, "peak MiB (measured)": peak / 2**20,
                         "memory error": (r["peak_memory"] - peak) / peak})
    real = pd.DataFrame(real)
    # this notebook's own common shift: its calibration's predictions all moved with the machine
    real["error less shift"] = less_shift(real["error"])
    real["in relative range"] = [lo <= e <= hi for e, (lo, hi) in zip(real["error less shift"],
                                                                         real["relative range"])]
    real["relative range"] = [f"{lo:+.0%}..{hi:+.0%}" for lo, hi in real["relative range"]]
    print(f"this run's common shift (median error over its variants): {real['error'].median():+.1%}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(tables_here[real_models[0]].describe(0).splitlines()[0] + f"; load average {load}")
real_table = pd.DataFrame(real)
real_table


# %% [markdown]
# Read it as the decision does: a pick other than the default had to be surely faster given each one's
# error; the `error` column is how far the simulator was from the measurement on each variant (inside
# `margin_file`'s ranges, what sim_accuracy measured here, or not: `in range`), `error less shift` the
# same less this notebook's own common shift (the median error of its variants: this calibration's
# predictions all moved with what the machine did since), checked against the margin the pick was made with
# (`relative range`, `in relative range`), and
# `measured vs default` is what the user gets: the median over the rounds of each round's ratio to the
# default's run in the same round (`rounds vs default`). The `fastest` row (when there is one) is what
# the error refused: a candidate the simulator ranked first but could not tell apart from the default or
# from a simpler candidate.
#
# And the measured bubbles of the default run of the last model, split the same way as a simulated
# trace's (the transfer part of a measured trace includes the runtime's receive overhead):

# %%
measured_bubbles = None   # the figure (a bare expression inside `if` would not be displayed)
if run_real:
    last = real_models[-1]
    run = next(r for (m, v), r in runs.items() if m == last and v.startswith("default"))
    measured = pl.explain(run.trace, run.schedule)
    print(f"{last}, default, measured: {measured.summary()}")
    measured_bubbles = pl.views.bubbles(measured, title=f"{last}: measured run of the default")
measured_bubbles

# %% [markdown]
# **The planner's answer on this machine, per model**: the choice by measurement of the shortlist the
# search produced (`pl.planner.confirm`, its own 3 rounds), then measured again in this notebook's later
# rounds side by side with the default (`measured vs default`, independent of the rounds that chose it),
# its prediction's error less this notebook's shift against the margin, and its peak memory against the
# table. Beside it, what the simulation alone would have done: the fastest prediction, its predicted gain,
# and the gain the margin needs for it to be surely faster (`needs_vs_default`). On 2 workers no plan can
# gain much more than 2x, so where the margin needs about 2x the simulator alone keeps the default.

# %%
goal = pd.DataFrame()
if run_real:
    summary = []
    for name in real_models:
        sub = real_table[real_table["model"] == name]
        c = sub[sub["confirmed"]].iloc[0]
        tb, f = tables_here[name], tables_here[name].fastest
        summary.append({
            "model": name, "planner's choice (measured shortlist)": c["plan"],
            "measured vs default": c["measured vs default"], "rounds vs default": c["rounds vs default"],
            "predicted vs default": c["predicted vs default"], "error less shift": c["error less shift"],
            "relative range": c["relative range"], "in relative range": c["in relative range"],
            "memory error": c["memory error"],
            "simulation only": "the default" if tb.best.name == tb.default.name else
                               f"{tb.best['method']} · {tb.best['partitioner']} {tb.best['config']}",
            "fastest predicted": f"{f['method']} · {f['partitioner']} {f['config']} · M={f['microbatches']}",
            "its predicted gain": f["vs_default"], "gain it needs": f["needs_vs_default"]})
    goal = pd.DataFrame(summary)
goal
