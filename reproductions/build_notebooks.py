"""Write the reproduction notebooks (``*.ipynb``) from the cell sources below, without outputs.

The notebooks are the source that papermill runs (``make reproduce`` and ``tests/test_reproductions.py``);
this script is how they are edited, so that a diff of a notebook is a diff of Python text. Run it after
changing a cell::

    .venv/bin/python reproductions/build_notebooks.py

Each notebook has one cell tagged ``parameters`` (papermill injects its overrides after it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from pipelab._io import atomic_write_text

HERE = Path(__file__).resolve().parent


def md(text: str) -> nbformat.NotebookNode:
    """A markdown cell."""
    return new_markdown_cell(text.strip("\n"))


def code(text: str, *tags: str) -> nbformat.NotebookNode:
    """A code cell (optionally tagged, e.g. ``parameters``)."""
    cell = new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def notebook(cells: list[nbformat.NotebookNode], title: str) -> nbformat.NotebookNode:
    """A notebook for the ``python3`` kernel."""
    nb = new_notebook(cells=cells)
    for i, cell in enumerate(nb.cells):  # stable ids: rebuilding an unchanged notebook changes nothing
        cell.id = f"cell-{i:02d}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["title"] = title
    return nb


# --------------------------------------------------------------------------- shared cells
SHOW = '''
import plotly.io as pio
from IPython.display import HTML, display


def show(fig):
    """Show a figure live in JupyterLab; in a report, as HTML whose plotly.js the driver adds once."""
    if report:
        display(HTML(fig.to_html(full_html=False, include_plotlyjs=False)))
    else:
        fig.show()
'''

# --------------------------------------------------------------------------- PipeDream Table 1
TABLE1 = [
    md('''
# PipeDream Table 1: the configuration pipelab chooses, and its speed-up over data parallelism

**Claim** (Narayanan et al., *PipeDream: Generalized Pipeline Parallelism for DNN Training*, SOSP'19,
Table 1): for each model and cluster PipeDream's optimizer picks a configuration (e.g. VGG-16 on
4 servers × 4 V100 of cluster A: `15-1`, fifteen replicas of the convolutional front and one worker
for the fully connected tail) whose epoch time is several times shorter than data parallelism (DP).

This notebook does one row of that table with pipelab: it loads the model's profile (PipeDream's own
measured profile by default), builds the cluster model, partitions with PipeDream's hierarchical
dynamic program (§3.1), then **simulates** the chosen plan and the data-parallel plan on the same
cluster with the discrete-event simulator (`pl.simulate`) and reports the simulated speed-up beside
the partitioner's prediction and the paper's number.

`mode="measure"` runs the same question for real on this machine at reduced scale: a narrower,
smaller-input model of the same layer structure, 2–4 CPU processes (gloo), the chosen plan against
data parallelism, measured speed-up against the simulator's prediction for this machine.
'''),
    code('''
model = "vgg16"              # vgg16 | resnet50 | gnmt8 | gnmt16
cluster = "pipedream-a"      # a pl.Cluster preset
servers = 4
gpus_per_server = 4
profile_source = "pipedream" # "pipedream": PipeDream's shipped profiles; "measured": pl.profile on `device`
device_speed = 1.0           # the cluster GPU's speed relative to the GPU the profile was measured on
enforce_memory = True        # False: partition without pipelab's (strict) memory limit
mode = "simulate"            # "simulate" | "measure" (real runtime at reduced scale on this machine)
minibatches = 64             # simulated minibatches (steady state is measured after warm-up)
gantt_minibatches = 6        # minibatches drawn in the Gantt chart (keeps the report small)
device = "cpu"               # device to profile on, with the measured profile source
measured_batch = 8           # batch and input size of the measured profile source
measured_image_size = 64
measured_seq_len = 16
# mode="measure": the reduced model and the local run
measure_workers = 2          # processes (2-4 on a laptop; one thread each)
measure_steps = 12           # minibatches timed per run (after measure_warmup)
measure_warmup = 3
measure_batch = 32
measure_width = 0.125        # channel / hidden width multiplier of the reduced model
measure_image_size = 32      # image side (images) of the reduced model
measure_seq_len = 8          # sequence length (GNMT) of the reduced model
measure_rounds = 2           # runs per plan, alternating; the median is kept
measure_bandwidth = 0.0      # bytes/s of the machine model; 0: measure the gloo loopback
backend = "gloo"
seed = 0
out_dir = ""                 # if set, row.json (this row's numbers, for the driver) is written there
report = False               # True under the driver: figures as HTML, plotly.js added once by the report
''', "parameters"),
    code(SHOW),
    code('''
import math
from pathlib import Path

import pandas as pd

import pipelab as pl
from pipelab import reproduce as rp

paper = rp.paper_row(model, cluster, servers, gpus_per_server)
print("paper:", paper.describe() if paper else "this row is not in PipeDream's Table 1")
'''),
    md('''
## Profile and cluster

PipeDream's profiles (shipped with pipelab, `pipelab/data/pipedream/`) were measured on the paper's
GPUs, so a device of relative speed 1.0 in the cluster model *is* that GPU. With
`profile_source="measured"` the profile comes from `pl.profile` on this device instead (at a small
input size on a CPU; expect different shapes, since compute is then slow relative to the network).
'''),
    code('''
if profile_source == "pipedream":
    prof = pl.models.pipedream_profile(model)
elif profile_source == "measured":
    net, sample = rp.paper_model(model, batch=measured_batch, image_size=measured_image_size,
                                 seq_len=measured_seq_len)
    prof = pl.profile(net, sample, device=device, model_name=model)
else:
    raise ValueError(f"profile_source={profile_source!r} must be 'pipedream' or 'measured'")
cl = pl.Cluster.preset(cluster, servers=servers, gpus_per_server=gpus_per_server, speed=device_speed)
print(f"{model}: {len(prof)} layers, batch {prof.batch_size}, "
      f"fwd+bwd {(prof.fwd_s + prof.bwd_s) * 1e3:.1f} ms/minibatch, {prof.param_bytes / 1e6:.1f} MB of weights")
print(cl.describe())
'''),
    md('''
## Partition (PipeDream §3.1) and simulate

`pl.partition(..., method="pipedream")` returns the plan with the cost model's *prediction*;
`pl.simulate` then runs the plan's schedule event by event (transfers serialized per link,
all-reduce overlapped with backward, warm-up excluded), which is the number compared with the paper.
A plan of one stage is data parallelism, simulated with method `dp`; it is also simulated with its
all-reduce *after* backward (`allreduce_overlap="none"`), a second baseline for the speed-up.

pipelab's memory model is strict (every layer output of every in-flight minibatch is kept, a stashed
weight copy per in-flight minibatch, gradients and momentum); where no plan fits the device, or the
best plan does not, the plan without a memory limit is shown beside it. The data-parallel baseline
is always taken without a memory limit: the paper ran it on these GPUs.
'''),
    code('''
limit = {} if enforce_memory else {"memory_limit": math.inf}
try:
    plan = pl.partition(prof, cl, method="pipedream", **limit)
    fits = True
except ValueError as exc:   # nothing fits pipelab's memory model: show the unconstrained plan
    print(f"no plan fits the device memory in pipelab's model ({exc}); using the plan without a limit")
    plan, fits = pl.partition(prof, cl, method="pipedream", memory_limit=math.inf), False
free = pl.partition(prof, cl, method="pipedream", memory_limit=math.inf)
dp_plan = pl.partition(prof, cl, method="dp", memory_limit=math.inf)
print(plan.describe())
print(dp_plan.describe())

sim = rp.simulate_plan(plan, prof, cl, minibatches=minibatches)
sim_dp = rp.simulate_plan(dp_plan, prof, cl, minibatches=minibatches)
# the same baseline with its all-reduce after backward instead of overlapped DDP-style (how much of
# the gap to the paper that one assumption accounts for; pipelab's own runtime works this way)
sim_dp_none = rp.simulate_plan(dp_plan, prof, cl, minibatches=minibatches, allreduce_overlap="none")
sim_free = sim if free.config == plan.config else rp.simulate_plan(free, prof, cl, minibatches=minibatches)
sim_speedup = sim.throughput / sim_dp.throughput
print(f"simulated: plan {sim.throughput:.1f} samples/s, dp {sim_dp.throughput:.1f} samples/s "
      f"-> {sim_speedup:.2f}x (partitioner predicted {plan.speedup_over_dp:.2f}x); over DP without "
      f"all-reduce overlap ({sim_dp_none.throughput:.1f} samples/s): "
      f"{sim.throughput / sim_dp_none.throughput:.2f}x")
if free.config != plan.config:
    print(f"without a memory limit: {free.config}, simulated {sim_free.throughput / sim_dp.throughput:.2f}x")
'''),
    md('''
## Why this plan: the cost-model terms

Per stage, milliseconds per minibatch of one replica: compute (forward + backward), the all-reduce
of the stage's weights over its replicas, the replica's time with that all-reduce overlapped with
backward (what is left over is *exposed* communication), the activation transfer into the stage, and
the stage's share of the steady-state time (replica time / replicas). Data parallelism is one stage
on every worker: its exposed all-reduce is what a pipeline can save.
'''),
    code('''
terms = rp.cost_terms(prof, cl, plan)
dp_terms = rp.cost_terms(prof, cl, dp_plan)
display(terms)
display(dp_terms)
'''),
    code('''
row = rp.table1_row(model=model, cluster=cluster, servers=servers, gpus_per_server=gpus_per_server,
                    plan=plan, predicted_speedup=plan.speedup_over_dp, simulated_speedup=sim_speedup,
                    profile_source=profile_source, dp_terms=dp_terms,
                    sim_ms=(sim.time_per_minibatch, sim_dp.time_per_minibatch),
                    sim_dp_no_overlap_s=sim_dp_none.time_per_minibatch)
row.update(fits_memory=fits, config_no_memory_limit=free.config,
           simulated_speedup_no_memory_limit=round(sim_free.throughput / sim_dp.throughput, 3),
           device_speed=device_speed)
# the paper's own configuration in this simulator (where pipelab can build it), to separate "chose
# another plan" from "the same plan is faster or slower here"
paper_plan = rp.paper_config_plan(prof, cl, paper.config, candidates=(plan, free)) if paper else None
if paper_plan is not None:
    sim_paper = rp.simulate_plan(paper_plan, prof, cl, minibatches=minibatches)
    row["paper_config_simulated_speedup"] = round(sim_paper.throughput / sim_dp.throughput, 3)
pd.DataFrame([row]).T.rename(columns={0: ""})
'''),
    md('''
## Gantt chart of the chosen plan

The first minibatches of the simulated run: one row per worker, one box per forward (solid) and
backward (hatched) pass, coloured by minibatch; thin grey bars are transfers.
'''),
    code('''
short = rp.simulate_plan(plan, prof, cl, minibatches=gantt_minibatches)
show(pl.views.gantt(short.trace, title=f"{model} on {cluster} {servers}x{gpus_per_server}: "
                                         f"{plan.config} (simulated)"))
'''),
    md('''
## Measure mode: real processes at reduced scale on this machine

Runs only with `mode="measure"`. The reduced model keeps the paper model's layer structure with a
smaller input and width. The simulated side profiles *that* model on this CPU and models this machine
as a flat cluster whose bandwidth is the measured gloo loopback bandwidth; the chosen plan and data
parallelism then run for real with `pl.train` and their measured throughputs are compared.
'''),
    code('''
measure = None
if mode == "measure":
    measure = rp.measure_row(model, workers=measure_workers, steps=measure_steps, warmup=measure_warmup,
                             batch=measure_batch, width=measure_width, image_size=measure_image_size,
                             seq_len=measure_seq_len, backend=backend, rounds=measure_rounds,
                             bandwidth=measure_bandwidth or None, seed=seed)
    row.update({f"measure_{k}": v for k, v in measure.items() if not isinstance(v, (list, dict))})
    display(pd.DataFrame([measure]).T.rename(columns={0: ""}))
elif mode != "simulate":
    raise ValueError(f"mode={mode!r} must be 'simulate' or 'measure'")
'''),
    code('''
if out_dir:
    print("wrote", rp.write_row(Path(out_dir) / "row.json", row))
'''),
]

# --------------------------------------------------------------------------- weight stashing
STASH = [
    md('''
# Statistical efficiency: weight stashing, vertical sync, naive pipelining, 2BW, PipeMare

**Claims.** Without weight stashing, a pipelined backward pass uses weights other than the ones its
forward pass used, and training does not reach data-parallel accuracy; with stashing (PipeDream,
Narayanan et al. SOSP'19 §3.3, evaluated in §5) it does. PipeMare (Yang et al., MLSys'21) keeps no
stash and closes the gap with learning-rate rescheduling and discrepancy correction instead.

**Set-up.** Real training with pipelab's runtime (`pl.train`), 4 stages, on scikit-learn's bundled
8×8 digits with a small CNN (`pl.models.small_cnn`), the same learning rate for every method (one
that data parallelism trains well with). Each method executes the schedule `pl.schedules.build`
returns (the one the simulator times and the Gantt chart draws); `backend="local"` is the
single-process reference executor, which gives the same weights as real processes
(`backend="gloo"`), only faster here. Test accuracy on a fixed held-out split after every epoch.

| method | weights a backward pass uses |
|---|---|
| `dp`, `gpipe` | the weights its forward used (synchronous: the same as plain minibatch SGD) |
| `pipedream` | a stashed copy of the version its forward used (PipeDream §3.3) |
| `pipedream+vertical_sync` | every stage uses the version the input stage used for that minibatch |
| `naive-async` | whatever is newest when it runs (no stash): the ablation of PipeDream §3 |
| `2bw` | two versions, `W(t+1) = W(t) - lr * grad f(W(t-1))` (PipeDream-2BW, ICML'21 §3) |
| `pipemare` | no stash; learning-rate rescheduling and discrepancy correction (PipeMare §3) |
'''),
    code('''
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
''', "parameters"),
    code(SHOW),
    code('''
from pathlib import Path

import pandas as pd

import pipelab as pl
from pipelab import reproduce as rp

runs = [rp.stash_experiment(methods, stages=stages, epochs=epochs, batch_size=batch_size, lr=lr,
                            momentum=momentum, channels=channels, train_limit=train_limit,
                            backend=backend, seed=s, progress=not report).assign(seed=s) for s in seeds]
per_seed = pd.concat(runs, ignore_index=True)
curves = rp.mean_over_seeds(per_seed)
curves.pivot(index="epoch", columns="method", values="test_accuracy")
'''),
    md('''
## Summary

Accuracies are means over the seeds. `late_accuracy` is the mean test accuracy over the last three
epochs (one epoch's accuracy on 359 test images moves by a few points from epoch to epoch); the gap
is to data parallelism, in points.
'''),
    code('''
final = rp.stash_summary(curves)
print(rp.stash_verdict(final))
final
'''),
    code('''
show(rp.curves_figure(curves, x="epoch", y="test_accuracy", color="method",
                      title=f"digits, small CNN, {stages} stages, lr {lr}, momentum {momentum}: test accuracy"))
'''),
    md('''
## How it depends on the learning rate

Staleness hurts more as steps get larger. The same three methods at a few learning rates (late accuracy,
mean of the last three epochs):
'''),
    code('''
sweep = rp.stash_lr_sweep(sweep_methods, sweep_lrs, stages=stages, epochs=sweep_epochs, batch_size=batch_size,
                          momentum=momentum, channels=channels, train_limit=train_limit, backend=backend,
                          seed=seeds[0], progress=not report)
sweep
'''),
    code('''
out = Path(out_dir)
rp.write_table(sweep, out / "lr_sweep.csv")
rp.write_table(per_seed, out / "accuracy_per_seed.csv")
rp.write_table(curves, out / "accuracy.csv")
rp.write_table(final, out / "summary.csv")
rp.write_text(out / "accuracy.svg", rp.svg_curves(curves, x="epoch", y="test_accuracy", color="method",
                                                  title=f"digits CNN, {stages} stages: test accuracy per epoch"))
verdict = rp.stash_verdict(final)
rp.write_text(out / "results.md", f"# Weight stashing: results\\n\\nlr {lr}, momentum {momentum}, {epochs} epochs, "
              f"{stages} stages, mean of seeds {seeds}\\n\\n{rp.markdown_table(final)}\\n\\n```\\n{verdict}\\n```\\n\\n"
              f"## Learning-rate sweep (late accuracy)\\n\\n{rp.markdown_table(sweep)}\\n")
'''),
]

# --------------------------------------------------------------------------- HetPipe
HETPIPE = [
    md('''
# HetPipe: virtual workers of heterogeneous GPUs, synchronised with Wave Synchronous Parallel

**Claim** (Park et al., *HetPipe*, USENIX ATC'20): on a cluster of mixed GPUs, grouping devices into
*virtual workers* (VWs) that each run a PipeDream-style pipeline, and synchronising the VWs through a
parameter server with Wave Synchronous Parallel (WSP: a VW pushes once per wave of in-flight
minibatches and may run at most `D` waves ahead of the slowest), trains faster than data parallelism
over the same devices, whose every step waits for the slowest GPU. A larger staleness bound `D` lets
fast VWs wait less, at some cost in convergence.

Two parts: (1) simulated on a heterogeneous cluster model, (2) emulated here with real processes, in
which slow devices are emulated by per-worker slowdowns.
'''),
    code('''
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
''', "parameters"),
    code(SHOW),
    code('''
from pathlib import Path

import pandas as pd

import pipelab as pl
from pipelab import reproduce as rp
'''),
    md('''
## Simulated: HetPipe's cluster, data parallelism vs virtual workers

Data parallelism (`pl.simulate(..., method="dp")`) runs every GPU as a replica: each step waits for
the slowest device, then all-reduces. HetPipe groups the 16 GPUs into 4 virtual workers by one of its
policies (§6: `NP` one node per VW, `ED` one GPU of each type per VW, `HD` two types per VW),
partitions the layers over each VW's devices (`pl.partition(..., method="hetpipe")`) and runs
PipeDream inside each VW (`pl.simulate(..., method="hetpipe")`: the seconds per minibatch of every
VW come from that simulation).

The simulator runs the pipelines; the wave synchronisation *across* VWs is the WSP timeline of
`rp.wsp_makespan`: a VW pushes its update after each wave of NOAM minibatches (a transfer of its
stage's weights to the parameter-server shard over the inter-node link) and may go on at once while
it is at most `D` waves ahead of the slowest VW; otherwise it waits and pulls the global weights.
With `D = 0` every wave waits for every push and a pull; with `D >= 1` synchronisation leaves the
critical path, and VWs of unequal speed run at the pace of the slowest plus `D` waves of slack.
'''),
    code('''
sim_table = rp.hetpipe_simulated(profile_name, cluster, staleness=staleness, minibatches=minibatches,
                                 batch_size=batch_size, policies=policies, waves=waves)
rp.write_table(sim_table, Path(out_dir) / "simulated.csv")
sim_table
'''),
    code('''
show(rp.bar_figure(sim_table.dropna(subset=["samples_per_s"]), x="config", y="samples_per_s",
                   title=f"{profile_name} (batch {batch_size}) on {cluster}: simulated samples/s"))
'''),
    md('''
## Emulated with real processes

Each virtual worker is a pipeline of `emu_stages` processes; one worker in one VW sleeps so that it runs
`emu_slowdown` times slower. Data parallelism over the same processes waits for that worker at every
step; HetPipe lets the other VW run ahead by up to `D` waves.
'''),
    code('''
from pipelab.runtime import supported_methods

emu = None
if emulate and "hetpipe" not in supported_methods():
    print("the runtime cannot run method 'hetpipe' yet (supported: " + ", ".join(supported_methods()) + "); "
          "the emulated part is skipped")
elif emulate:
    emu = rp.hetpipe_emulated(stages=emu_stages, virtual_workers=emu_virtual_workers, slowdown=emu_slowdown,
                              staleness=emu_staleness, epochs=emu_epochs, batch_size=emu_batch, lr=emu_lr,
                              train_limit=emu_train_limit, backend=backend, seed=seed)
    rp.write_table(emu, Path(out_dir) / "emulated.csv")
emu
'''),
    code('''
text = f"# HetPipe: results\\n\\n## Simulated\\n\\n{rp.markdown_table(sim_table)}\\n"
if emu is not None:
    text += f"\\n## Emulated (real processes, one slowed worker)\\n\\n{rp.markdown_table(emu)}\\n"
rp.write_text(Path(out_dir) / "results.md", text)
'''),
]


# --------------------------------------------------------------------------- weight buffer (run.py by the runtime's authors)
BUFFER = [
    md('''
# Bounded weight buffers, 2BW, PipeMare's two techniques, and activation compression

**Claims** (see README.md here): a bounded weight buffer keeps at most `K` versions per stage (Lv et
al., CCGrid'23), `K = 2` being PipeDream-2BW's double buffering (Narayanan et al., ICML'21 §3);
PipeMare (Yang et al., MLSys'21) trains without a stash using learning-rate rescheduling (T1) and
discrepancy correction (T2); compressing the activations and gradients between stages (fp16, bf16,
int8) cuts the bytes on the wire by 2× or about 4× at little cost in accuracy.

**Set-up.** `run.py` in this folder, written with the runtime's weight policies: the digits CNN over
4 stages, SGD with momentum 0.9, the runtime's reference executor, several seeds per configuration;
test accuracy against GPipe's (synchronous), versions held, and the bytes that crossed stage
boundaries (from the trace). This notebook runs it for each learning rate and shows its tables.
'''),
    code('''
lrs = [0.02, 0.04]
epochs = 6
seeds = 3
quick = False                # one epoch, one seed, three configurations, first learning rate only (tests)
out_dir = "."
report = False
''', "parameters"),
    code('''
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
        raise RuntimeError(f"run.py --lr {lr} failed ({done.returncode}):\\n{done.stderr[-3000:]}")
    tables[lr] = pd.read_csv(out / f"results_lr{lr:g}.csv")
for lr, table in tables.items():
    print(f"lr {lr}:")
    display(table)
'''),
]

NOTEBOOKS = {
    HERE / "pipedream_table1" / "table1.ipynb": (TABLE1, "PipeDream Table 1"),
    HERE / "weight_stashing" / "weight_stashing.ipynb": (STASH, "Weight stashing and statistical efficiency"),
    HERE / "hetpipe" / "hetpipe.ipynb": (HETPIPE, "HetPipe: virtual workers and WSP"),
    HERE / "weight_buffer" / "weight_buffer.ipynb": (BUFFER, "Weight buffers, 2BW, PipeMare, compression"),
}


def main(argv: list[str] | None = None) -> int:
    """Write every notebook; ``--check`` only reports notebooks that differ from their source here."""
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for path, (cells, title) in NOTEBOOKS.items():
        text = nbformat.writes(notebook(cells, title)) + "\n"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        print("wrote", path.relative_to(HERE.parent))
    for path in stale:
        print("out of date:", path.relative_to(HERE.parent), "(run reproductions/build_notebooks.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
