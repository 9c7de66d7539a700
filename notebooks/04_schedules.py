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
# # 04 · Schedules: who runs what, when
#
# A schedule is data: per worker, an ordered list of actions such as `1F0` (stage 1, forward, microbatch
# 0), `B` (backward), `W` (weight gradient, split off by zero-bubble schedules) and `U` (optimizer step).
# The same lists drive the runtime, the simulator and the Gantt charts. We compare five orders on a
# `P`-stage pipeline with `M` microbatches per minibatch:
#
# | method | idea | source |
# |---|---|---|
# | `gpipe` | all forwards, then all backwards, flush | Huang et al., NeurIPS'19 |
# | `1f1b-flush` | after a warm-up, alternate forward and backward; flush | Narayanan et al., ICML'21, SC'21 |
# | `pipedream` | 1F1B without flushes; weight stashing | Narayanan et al., SOSP'19 |
# | `interleaved-1f1b` | `v` virtual stages per worker | Narayanan et al., SC'21 §2.2 |
# | `zb-h1` | backward split into B (input grad) and W (weight grad) | Qi et al., ICLR'24 |

# %% tags=["parameters"]
stages = 4                 # P
microbatches = 8           # M per minibatch
chunks = 2                 # v, virtual stages per worker for interleaved-1f1b
microbatch_sweep = [1, 2, 4, 8, 16, 32]
compare_backend = "gloo"   # the real run of "Simulated against measured": "gloo" processes or "local"
compare_steps = 8          # its minibatches
calibrate_here = False     # True: measure this machine with pl.calibrate first (a minute or more)
left_schedule = "1f1b-flush"   # the two schedules drawn side by side in "Two schedules, one clock"
right_schedule = "zb-h2"

# %%
import pandas as pd
import plotly.express as px

import pipelab as pl

methods = {"gpipe": {}, "1f1b-flush": {}, "pipedream": {}, "interleaved-1f1b": {"chunks": chunks},
           "zb-h1": {}}
scheds = {}
for method, opts in methods.items():
    # pipedream has no minibatch boundary: each "microbatch" is a minibatch, and the default length
    # (three times the minibatches in flight) reaches its steady state
    M = None if method == "pipedream" else microbatches
    K = None if method == "pipedream" else 1
    scheds[method] = pl.schedules.build(method, stages, microbatches=M, minibatches=K, **opts)
    pl.schedules.validate(scheds[method])          # dependencies respected, no deadlock
print(scheds["1f1b-flush"])                         # the per-worker action lists as a grid

# %%
# Unit costs (F = 1, B = 2; F = B = W = 1 when W is split off) laid out in time, one figure per method.
for method, sched in scheds.items():
    pl.views.gantt(sched, title=method).show()

# %% [markdown]
# The white space is the **bubble**: time a worker idles. For GPipe and 1F1B with flushes, with equal
# per-stage costs, each worker idles `P−1` slots of `M+P−1`, so the bubble fraction is `(P−1)/(M+P−1)` of
# the total time (Huang et al., NeurIPS'19, §2.2; Narayanan et al., SC'21, §2.2, state the same bubble as
# `(P−1)/M` of the ideal time). Interleaving divides it by `v`; ZB-H1
# cuts it to about a third by filling it with `W`s (Qi et al., ICLR'24, §3).

# %%
rows = []
for M in microbatch_sweep:
    for method in ("gpipe", "1f1b-flush", "interleaved-1f1b", "zb-h1"):
        if method == "interleaved-1f1b" and M % stages:
            continue                                   # interleaving needs M a multiple of P
        opts = methods[method]
        sched = pl.schedules.build(method, stages, microbatches=M, minibatches=1, **opts)
        bubble = pl.views.bubble_fraction(pl.views.schedule_trace(sched))
        rows.append({"M": M, "method": method, "bubble": bubble})
    rows.append({"M": M, "method": "closed form (P-1)/(M+P-1)", "bubble": (stages - 1) / (M + stages - 1)})
bubbles = pd.DataFrame(rows)
gp = bubbles[bubbles.method == "gpipe"].bubble.to_numpy()
cf = bubbles[bubbles.method.str.startswith("closed")].bubble.to_numpy()
assert abs(gp - cf).max() < 1e-9, "GPipe's bubble must match the closed form"
px.line(bubbles, x="M", y="bubble", color="method", markers=True, log_x=True,
        title=f"bubble fraction against microbatches, P = {stages}")

# %% [markdown]
# **Exercise.** Check the interleaved schedule against its closed form `(P−1)/(v·M + P−1)` for every `M` of
# the sweep (it needs `M` a multiple of `P`), and ZB-H1's bubble *time* against a third of 1F1B's with equal
# F, B, W costs, for `M ≥ P` (Qi et al., ICLR'24, §3: 1F1B idles `(P−1)(F+B+W)`, ZB-H1 `(P−1)(F+B−W)`).
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
inter = bubbles[bubbles.method == "interleaved-1f1b"].set_index("M").bubble
for M, b in inter.items():
    expected = (stages - 1) / (chunks * M + stages - 1)
    print(f"M={M:3d} interleaved {b:.4f}  closed form {expected:.4f}")
    assert abs(b - expected) < 1e-9

def bubble_time(method, M):
    tr = pl.views.schedule_trace(pl.schedules.build(method, stages, microbatches=M, minibatches=1))
    return tr.makespan * pl.views.bubble_fraction(tr)      # idle time per worker, in units of F

for M in microbatch_sweep:
    ratio = bubble_time("zb-h1", M) / bubble_time("1f1b-flush", M)
    print(f"M={M:3d} ZB-H1 / 1F1B bubble time = {ratio:.3f}")
    if M >= stages:
        assert abs(ratio - 1 / 3) < 0.05, f"ZB-H1 should idle about a third of 1F1B's time at M={M}"

# %% [markdown]
# ## Memory: activations in flight
#
# GPipe keeps the activations of all `M` microbatches until their backward; 1F1B starts backwards early
# and keeps at most `P − s` microbatches at stage `s`. PipeDream keeps `P − s` *minibatches* in flight at
# stage `s` and stashes a weight version for each. The simulator tracks both per worker.

# %%
from dataclasses import replace

# equal stages; each layer keeps 32 MB of activations per minibatch for its backward, weights are small
base = pl.Profile.synthetic([1e-3] * stages, out_bytes=[8_000_000] * stages, param_bytes=[2_000_000] * stages,
                            batch_size=64)
prof = replace(base, layers=tuple(replace(layer, saved_bytes=32_000_000) for layer in base.layers))
cluster = pl.Cluster.flat(stages, bandwidth=10e9)
plan = pl.Plan.even(stages, stages)
rows, peak = [], {}
for method in ("gpipe", "1f1b-flush", "pipedream"):
    M, K = (None, None) if method == "pipedream" else (microbatches, 2)
    sim = pl.simulate(plan, prof, cluster, method=method, microbatches=M, minibatches=K)
    peak[method] = sim.peak_memory
    for w, b in enumerate(sim.peak_memory):
        rows.append({"method": method, "worker": w, "peak_MB": b / 1e6})
# GPipe holds all M microbatches at every stage; 1F1B at most P - s of them at stage s
assert all(g >= f for g, f in zip(peak["gpipe"], peak["1f1b-flush"]))
assert list(peak["1f1b-flush"]) == sorted(peak["1f1b-flush"], reverse=True)
px.bar(pd.DataFrame(rows), x="worker", y="peak_MB", color="method", barmode="group",
       title="simulated peak memory per worker")

# %% [markdown]
# **Exercise.** How many weight versions does each PipeDream stage hold at once? The schedule records, for
# every action, the version it reads (`sched.versions`); `sched.versions_held(s)` counts the most that stage
# `s` must keep alive at any time. Compare with PipeDream's `P − s` (SOSP'19, §3.3).
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
pd_sched = scheds["pipedream"]
for s in range(stages):
    held = pd_sched.versions_held(s)
    print(f"stage {s}: versions held {held}, closed form P - s = {stages - s}")
    assert held == stages - s

# %% [markdown]
# ## torch's newest schedules, inside pipelab
#
# `torch.distributed.pipelining` keeps its schedules as data too: per rank, rows such as `1F0`, `0I1` and
# `0W1` (backward split into input and weight gradients). `pl.schedules.from_torch` reads any of its
# schedule classes (or a compute-only CSV) into a pipelab `Schedule`, so the validator checks it, the
# simulator times it and the Gantt view draws it beside pipelab's own. Two of them place stages in a **V**:
# with `2P` stages on `P` workers, worker `w` runs stage `w` and stage `2P − 1 − w`, so the first worker
# also computes the loss.
#
# - **ZB-V** (`ScheduleZBVZeroBubble`): V placement and split backward; zero bubble with 1F1B's activation
#   memory when F, B and W cost the same (Qi et al., ICLR'24; ZB-V is §6 of arXiv:2401.10241).
# - **DualPipeV** (`ScheduleDualPipeV`): V placement with forward/backward pairs of two microbatches issued
#   together (`OVERLAP_F_B`; torch's runtime runs them one after the other, and so does the import); the
#   DualPipe of the DeepSeek-V3 report (arXiv:2412.19437, §3.2.1) cut in half.
#
# torch's ZB-V needs `M ≥ 2P − 1` microbatches to fill its V and DualPipeV `M ≥ 2P`, so this section uses at
# least `2P`.

# %%
from pipelab.schedules.dataflow import UnitCosts
from pipelab.sim.simulate import simulate_schedule

M_v = max(microbatches, 2 * stages)
compare = {
    "1f1b-flush": lambda K: pl.schedules.build("1f1b-flush", stages, microbatches=M_v, minibatches=K),
    "zb-h1": lambda K: pl.schedules.build("zb-h1", stages, microbatches=M_v, minibatches=K),
    "ZB-V (torch)": lambda K: pl.schedules.from_torch("ZBVZeroBubble", workers=stages, microbatches=M_v,
                                                      minibatches=K),
    "DualPipeV (torch)": lambda K: pl.schedules.from_torch("DualPipeV", workers=stages, microbatches=M_v,
                                                           minibatches=K),
}
zbv = compare["ZB-V (torch)"](1)
# from_torch validates too; here to show it passes pipelab's checks. in_order=False: sent right after the
# action that makes them, V's messages between two workers would cross (torch's engine orders them with
# explicit send steps; pipelab's gloo runtime matches them by tag), which the per-pair rule reports
pl.schedules.validate(zbv, in_order=False)
print(zbv.grid(max_steps=24))
for name, make in compare.items():
    pl.views.gantt(make(1), title=f"{name}, P = {stages}, M = {M_v}").show()

# %% [markdown]
# **Bubble.** With F, B and W of equal cost (per chunk for the V schedules, whose chunks are half a stage),
# the Zero Bubble paper gives the idle time per minibatch: 1F1B `(P−1)(F+B+W)`, ZB-H1 `(P−1)(F+B−W)` (§2.1)
# and ZB-V zero. "Per minibatch" means in a steady state of consecutive minibatches with no synchronization
# across stages at the optimizer step (the paper's §4 replaces it by a post-validation); pipelab's updates are
# per stage, so one more minibatch adds exactly its period to the run. One lone minibatch still pays the fill
# and drain, shown per worker as `bubble (one minibatch)`.

# %%
equal = UnitCosts(f=1.0, b=1.0, w=1.0)
rows = []
for name, make in compare.items():
    one = simulate_schedule(make(1), equal)
    period = simulate_schedule(make(5), equal).makespan - simulate_schedule(make(4), equal).makespan
    chunks = 2 if "torch" in name else 1
    busy = chunks * M_v * 3                               # per worker per minibatch, in units of F
    for w, b in enumerate(one.bubble_fraction):
        rows.append({"schedule": name, "worker": w, "bubble (one minibatch)": round(b, 3),
                     "steady idle per minibatch (units of F)": period - busy})
bub = pd.DataFrame(rows)
steady = bub.groupby("schedule", sort=False)["steady idle per minibatch (units of F)"].max()
assert steady["ZB-V (torch)"] == 0                                 # the paper's zero bubble
assert steady["1f1b-flush"] == 3 * (stages - 1) and steady["zb-h1"] == stages - 1
bub

# %% [markdown]
# **Memory.** Peak memory per worker, simulated with a profile: `2P` equal layers (one per V chunk, two per
# stage of the straight schedules), each keeping 16 MB of activations per microbatch for its backward.
# ZB-V holds `2P` chunk-microbatches on *every* worker, the `P` whole-stage microbatches that 1F1B holds on
# its first worker only (the paper's "same activation memory as 1F1B", balanced across workers), plus the
# received inputs of its extra chunk boundaries (a V has twice as many cuts). DualPipeV holds one more.

# %%
layers = 2 * stages
base_v = pl.Profile.synthetic([1e-3] * layers, out_bytes=[4_000_000] * layers,
                              param_bytes=[1_000_000] * layers, batch_size=64)
prof_v = replace(base_v, layers=tuple(replace(la, saved_bytes=16_000_000 * M_v) for la in base_v.layers))
cluster_v = pl.Cluster.flat(stages, bandwidth=10e9)
rows, peak_v = [], {}
for name, make in compare.items():
    sch = make(1)
    plan_v = pl.Plan.even(layers, sch.num_stages)          # V schedules: one layer per chunk
    sim = pl.simulate(plan_v, prof_v, cluster_v, schedule=sch)
    peak_v[name] = sim.peak_memory
    rows += [{"schedule": name, "worker": w, "peak_MB": b / 1e6} for w, b in enumerate(sim.peak_memory)]
assert max(peak_v["ZB-V (torch)"]) <= 1.05 * max(peak_v["1f1b-flush"])   # about 1F1B's peak, on every worker
px.bar(pd.DataFrame(rows), x="worker", y="peak_MB", color="schedule", barmode="group",
       title="simulated peak memory per worker")

# %% [markdown]
# The way back: `pl.torch_bridge.to_torch(plan, schedule, model, loss_fn=...)` runs a pipelab plan and any
# synchronous schedule (pipelab's, or one imported here) on torch's own engine under torchrun, where it
# composes with FSDP and tensor parallelism (README, "Two engines").

# %% [markdown]
# ## Simulated against measured
#
# The boxes above are predictions. Here one schedule (1F1B with flush, 2 stages, 4 microbatches) is
# both simulated, from a profile of a small digits CNN on this machine (on a cluster measured by
# `pl.calibrate` with `calibrate_here = True`, else a plain 2-worker one), and run for real in 2
# processes; then
# `pl.views.compare(sim.trace, run.trace)` draws the two Gantt charts on one time axis, each worker's
# simulated row above its measured row, and colours both boxes of every action by the relative error of
# its duration, `(measured − simulated) / simulated`: red where the run took longer than predicted, blue
# where it was faster. Hover over a box for both durations.

# %%
import functools

import torch

from pipelab.models import demo

images, labels = demo.digits_data("train")
digits = functools.partial(demo.batches, (images[:640], labels[:640]), 64)
cnn_x, cnn_y = digits()[0]
cnn_prof = pl.profile(demo.small_cnn(), cnn_x, loss_fn=torch.nn.functional.cross_entropy, target=cnn_y,
                      progress=False, small_batch=16)
cnn_cluster = pl.calibrate(workers=2, progress=False) if calibrate_here else pl.Cluster.flat(2)
cnn_plan = pl.partition(cnn_prof, cnn_cluster, method="pipedream", straight=True)
sim = pl.simulate(cnn_plan, cnn_prof, cnn_cluster, method="1f1b-flush", microbatches=4,
                  minibatches=compare_steps, allreduce_overlap="none")
run = pl.train(demo.small_cnn, cnn_plan, method="1f1b-flush", data=digits, steps=compare_steps,
               microbatches=4, loss_fn=torch.nn.functional.cross_entropy, backend=compare_backend,
               progress=False, optimizer=functools.partial(torch.optim.SGD, lr=0.05))
assert run.trace.actions_by_worker() == sim.trace.actions_by_worker()   # one schedule, run and simulated
errors = pl.views.error_summary(sim, run)    # median error per action kind, busy-time error per worker
print(errors["by_kind"], "\n", errors["by_worker"])
pl.views.compare(sim.trace, run.trace)

# %% [markdown]
# Where is the model wrong? The first table gives the median error per action kind, the second the
# busy-time error per worker: what the actions themselves explain of a gap in throughput; the rest is
# waiting, white space in the measured rows. `reproductions/sim_accuracy` measures these errors for every
# method, worker count and microbatch count, and its README names the term behind each miss.
# Swap `"1f1b-flush"` for `"gpipe"` in both calls: the errors per kind stay, the bubble changes.

# %% [markdown]
# ## Two schedules, one clock
#
# Pick two schedules: their Gantt charts are drawn one above the other on the same time axis (unit
# costs), with each one's bubble and the most microbatches' activations a worker holds. Compare
# `"1f1b-flush"` with `"zb-h1"` (same memory, a third of the bubble), or `"zb-h1"` with `"zb-h2"`: ZB-H2
# runs more forwards early (it holds 2P-1 activations) and each stage finishes its own work sooner, but on
# this chart's clock the last stage still ends last, so the makespan only shrinks once the optimizer
# step stops waiting for every stage (Qi et al., ICLR'24 §4). In JupyterLab, the dropdowns redraw it.

# %%
from plotly.subplots import make_subplots

from pipelab import methods as registry

choices = {**methods, **{m: {} for m in ("zb-h2", "zb-v", "dualpipe", "dualpipev") if m in registry.METHODS}}
choices.pop("pipedream")            # no flush: its minibatches never end, so no makespan to compare


def held(sched):
    """Most (stage, microbatch) activations one worker holds at once."""
    best = 0
    for acts in sched.actions:
        split = {a.stage for a in acts if a.kind == "W"}
        live = 0
        for a in acts:
            live += 1 if a.kind == "F" else -1 if a.kind == ("W" if a.stage in split else "B") else 0
            best = max(best, live)
    return best


def side_by_side(left=left_schedule, right=right_schedule):
    """The two schedules' Gantt charts on one time axis."""
    figs, names = [], []
    for name in (left, right):
        sched = pl.schedules.build(name, stages, microbatches=microbatches, **choices[name])
        fig = pl.views.gantt(sched, title=name)
        figs.append(fig)
        names.append(f"{fig.layout.title.text}; holds {held(sched)} activations")
    both = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=names)
    for row, fig in enumerate(figs, start=1):
        for tr in pl.views.action_traces(fig):
            both.add_trace(tr, row=row, col=1)
        both.update_yaxes(fig.layout.yaxis.to_plotly_json(), row=row, col=1)
    both.update_layout(height=260 + 50 * sum(len(f.layout.yaxis.ticktext) for f in figs), barmode="overlay",
                       showlegend=False, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    both.update_xaxes(title_text="time (unit)", row=2, col=1)
    return both


if pl.widgets.live_frontend():      # JupyterLab: the dropdowns redraw the pair
    import ipywidgets
    ipywidgets.interact(side_by_side, left=list(choices), right=list(choices))
else:                                # papermill, nbconvert, a report: the parameters above pick the two
    pl.widgets.show(side_by_side())

# %% [markdown]
# ## Explore
#
# The ScheduleExplorer redraws the simulated Gantt, bubble and memory as you change the method, stages,
# microbatches, `v` and `K`.

# %%
pl.widgets.ScheduleExplorer()
