"""Write the teaching notebooks (``notebooks/NN_*.ipynb``) from the cell sources in this file.

The notebooks are generated so that they stay reviewable as plain Python, identical in structure
(a tagged papermill ``parameters`` cell, short prose, exercises whose solutions are hidden code
cells tagged ``solution``), and stored without outputs. Run it after editing a cell::

    .venv/bin/python notebooks/_build.py          # rewrite every notebook
    .venv/bin/python notebooks/_build.py --check  # exit 1 if a stored notebook differs from this file

``tests/test_notebooks.py`` runs the ``--check`` and every notebook under papermill.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from pipelab._io import atomic_write_text

HERE = Path(__file__).resolve().parent
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
SOLUTION_META = {"jupyter": {"source_hidden": True}, "tags": ["solution"]}

Cell = NotebookNode


def md(text: str) -> Cell:
    """A markdown cell (leading/trailing blank lines stripped)."""
    return nbformat.v4.new_markdown_cell(text.strip("\n"))


def code(text: str, **meta: object) -> Cell:
    """A code cell without outputs."""
    return nbformat.v4.new_code_cell(text.strip("\n"), metadata=dict(meta))


def params(text: str) -> Cell:
    """The papermill ``parameters`` cell (papermill injects overrides right after it)."""
    return code(text, tags=["parameters"])


def exercise(question: str, solution: str) -> list[Cell]:
    """A markdown exercise followed by its solution: a code cell collapsed in JupyterLab.

    The solution runs under papermill like every other cell, and ends with checks against an
    oracle, so a wrong solution (or an API change that breaks it) fails the notebook tests.
    """
    return [md("**Exercise.** " + question.strip("\n") + "\n\n*(The solution is the collapsed cell below: "
               "click its ellipsis to open it once you have tried.)*"),
            code("# Solution\n" + solution.strip("\n"), **SOLUTION_META)]


# ============================================================================ 01 quickstart
def quickstart() -> list[Cell]:
    """Profile -> partition -> simulate -> train -> Gantt, in ten cells."""
    return [
        md("""
# 01 · Quickstart: profile → partition → simulate → train → Gantt

Ten cells through pipelab's whole data flow on a small CNN for scikit-learn's bundled 8×8 digits
(no download): **profile** the layers, **partition** them into a 2-stage pipeline, **simulate** the
schedule, **train** it for real in 2 processes, and draw both runs as Gantt charts. Run all cells
(Run ▸ Run All Cells); the training cell starts two worker processes and takes a few seconds.
"""),
        params("""
# Parameters (papermill overrides these; change them and re-run everything)
backend = "gloo"         # "gloo": one OS process per worker; "local": the single-process reference executor
workers = 2              # pipeline stages (one worker each)
method = "1f1b-flush"    # try "gpipe", "pipedream", "2bw"
microbatches = 4         # per minibatch
batch_size = 64
steps = 30               # minibatches to train
"""),
        code("""
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
print(model, "\\nminibatch:", tuple(x.shape), "labels:", tuple(y.shape))
"""),
        code("""
# 1. Profile: forward/backward time, output/cut bytes and parameters of every layer, on this CPU.
# small_batch: also time each layer on one microbatch, so that the simulator knows how much of a
# layer's time a smaller batch still pays (tiny CPU kernels cost nearly as much at 16 rows as at 64).
prof = pl.profile(model, x, progress=False, small_batch=batch_size // microbatches)
prof.summary()
"""),
        code("""
# 2. Partition: a cluster model of this machine (processes on one host), then the pipeline plan.
cluster = pl.Cluster.flat(workers, bandwidth=1e9)          # ~1 GB/s between local processes
plan = pl.partition(prof, cluster, method="pipedream", straight=True)
print(plan.describe())
pl.views.partition_graph(prof, plan)
"""),
        code("""
# 3. Simulate: the schedule the runtime will execute, timed with the profile and the cluster model.
sim = pl.simulate(plan, prof, cluster, method=method, microbatches=microbatches, minibatches=steps)
print(f"simulated: {sim.throughput:.0f} samples/s, {sim.time_per_minibatch * 1e3:.2f} ms per minibatch")
pl.views.gantt(sim.trace, title=f"simulated {method}")
"""),
        code("""
# 4. Train for real, one process per worker; the Gantt chart fills in while it runs.
handle = pl.launch(demo.small_cnn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=optimizer,
                   steps=steps, microbatches=microbatches, backend=backend)
pl.widgets.LiveGantt(handle, title=f"{method} on {workers} {backend} workers (live)")
"""),
        code("""
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
"""),
        code("""
import plotly.express as px
px.line(x=range(1, len(run.losses) + 1), y=run.losses, labels={"x": "minibatch", "y": "training loss"},
        title="training loss")
"""),
        md("""
**Next.** `02_why_pipelining` (why data parallelism stalls), `03_partitioning` (the dynamic program
behind step 2), `04_schedules` (what the boxes above mean), `05_weight_versions`, `06_heterogeneous`,
`07_beyond_dnns`. Every notebook's first code cell holds its parameters.
"""),
    ]


# ============================================================================ 02 why pipelining
def why_pipelining() -> list[Cell]:
    """Data-parallel communication stalls and how pipelining avoids them."""
    return [
        md("""
# 02 · Why pipelining? Data parallelism stalls on communication

In data-parallel training every worker holds the whole model and, after each minibatch, the workers
all-reduce *every* weight gradient. The compute per worker stays fixed while the bytes to exchange
do not shrink, so as workers are added (or as bandwidth lags compute) a growing fraction of time is
spent waiting for communication. PipeDream (Narayanan et al., SOSP'19, §2.1) motivates pipelining with
this overhead: it grows with the number of workers and is largest for models with many weights relative
to their compute.

We measure it with the simulator on PipeDream's own layer profiles of VGG-16, ResNet-50 and GNMT-8
(shipped with pipelab: V100 times, minibatch sizes from the files) and then compare with a pipeline plan.
"""),
        params("""
models = ["vgg16", "resnet50", "gnmt8"]     # shipped PipeDream profiles
worker_counts = [1, 2, 4, 8, 16]            # data-parallel workers (flat cluster)
bandwidths_gbps = [10, 25, 100]             # link bandwidth between every pair of workers
minibatches = 4                             # simulated minibatches per run
"""),
        code("""
import pandas as pd
import plotly.express as px
import pipelab as pl

profiles = {name: pl.Profile.from_pipedream(name) for name in models}
pd.DataFrame([{"model": n, "layers": len(p), "batch": p.batch_size, "params_MB": p.param_bytes / 1e6,
               "fwd+bwd_ms": (p.fwd_s + p.bwd_s) * 1e3} for n, p in profiles.items()])
"""),
        md("""
The *communication fraction* of a run is the share of a worker's time not spent computing:
`1 − utilization`, averaged over workers, where utilization is measured on the simulated trace.
With one worker there is nothing to exchange, so it must be 0 — a first check.
"""),
        code("""
rows = []
for name, prof in profiles.items():
    for gbps in bandwidths_gbps:
        for n in worker_counts:
            # memory is not the question here: give every device plenty so that no plan is refused
            cluster = pl.Cluster.flat(n, bandwidth=gbps * 1e9 / 8, memory=2**40)
            plan = pl.partition(prof, cluster, method="dp")
            sim = pl.simulate(plan, prof, cluster, method="dp", minibatches=minibatches)
            util = sum(sim.utilization) / len(sim.utilization)
            rows.append({"model": name, "Gbps": gbps, "workers": n, "comm_fraction": 1 - util,
                         "samples_per_s": sim.throughput})
dp = pd.DataFrame(rows)
assert (dp[dp.workers == 1].comm_fraction.abs() < 1e-9).all(), "one worker must never wait"
px.line(dp, x="workers", y="comm_fraction", color="model", facet_col="Gbps", markers=True, log_x=True,
        title="data parallel: fraction of time stalled on communication (simulated)")
"""),
        md("""
**Why the curves look like this.** A ring all-reduce moves `2(n−1)/n · P` bytes per worker for `P`
gradient bytes (Patarasuk & Yuan, JPDC 2009), so its time tends to `2P/B` as `n` grows while the compute
per worker stays fixed; and it can hide only behind the backward pass, as each layer's gradient becomes
ready. What matters is bytes per second of compute: GNMT-8 (≈775 MB of weights against ≈89 ms of
compute per minibatch at its profiled batch of 32) stalls most, VGG-16 (≈553 MB, most of it in the fully
connected layers, against ≈690 ms) stalls at 10 Gbps, and ResNet-50 (≈102 MB against ≈462 ms) hides its
all-reduce behind its backward pass.
"""),
        *exercise("""
Check the simulator against closed forms. For VGG-16 at 16 workers and 10 Gbps, compute the ring
all-reduce time `2(n−1)/n · P / B` and the compute time of one minibatch. If the all-reduce overlapped the
backward pass perfectly, the stall fraction would be `max(0, allreduce − bwd) / (fwd + max(bwd, allreduce))`;
if it did not overlap at all, `allreduce / (compute + allreduce)`. Is the simulated fraction between the
two (up to rounding: the simulator also charges latency and the optimizer step)?
""", """
prof, n = profiles["vgg16"], 16
B = 10e9 / 8
ar = 2 * (n - 1) / n * prof.param_bytes / B
fwd, bwd = prof.fwd_s, prof.bwd_s
no_overlap = ar / (fwd + bwd + ar)
full_overlap = max(0.0, ar - bwd) / (fwd + max(bwd, ar))
sim_frac = dp[(dp.model == "vgg16") & (dp.workers == n) & (dp.Gbps == 10)].comm_fraction
print(f"all-reduce {ar * 1e3:.1f} ms, compute {(fwd + bwd) * 1e3:.1f} ms")
print(f"perfect overlap {full_overlap:.3f}, simulated {float(sim_frac.iloc[0]):.3f}, no overlap {no_overlap:.3f}")
if n in worker_counts and 10 in bandwidths_gbps and "vgg16" in models:
    assert full_overlap - 0.02 <= float(sim_frac.iloc[0]) <= no_overlap + 0.02
"""),
        md("""
## Pipelining instead

A pipeline gives each worker a contiguous range of layers: only activations and their gradients
cross stage boundaries, point to point, and weights need synchronizing only among the replicas of a
stage. PipeDream's partitioner replicates the compute-heavy convolutional front of VGG-16 and keeps the
large fully connected layers on few workers. Below: PipeDream's plan against data parallelism on
cluster A of the paper (4 servers × 4 V100, PCIe inside a server, 10 Gbps Ethernet across; §5.1).
"""),
        code("""
# Time is the question here, not memory: pipelab's memory model finds that ResNet-50's profiled
# minibatch (128 images) does not fit a 16 GB V100 without pipelining, so we lift the limit.
cluster = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4, memory=2**40)
rows = []
for name, prof in profiles.items():
    results = {}
    for method in ("dp", "pipedream"):
        plan = pl.partition(prof, cluster, method=method)
        sim = pl.simulate(plan, prof, cluster, method=method)   # default length: a few waves in flight
        results[method] = (plan, sim)
    plan, sim = results["pipedream"]
    rows.append({"model": name, "pipedream config": plan.config,
                 "dp samples/s": results["dp"][1].throughput, "pipedream samples/s": sim.throughput,
                 "simulated speed-up": sim.throughput / results["dp"][1].throughput,
                 "dp comm fraction": 1 - sum(results["dp"][1].utilization) / cluster.num_workers})
compare = pd.DataFrame(rows)
compare
"""),
        md("""
PipeDream's Table 1 reports, on this cluster, 15-1 with 5.28× over data parallel for VGG-16 and plain
data parallelism (1×) for ResNet-50 (Narayanan et al., SOSP'19, §5.2). The simulator runs the plan's
real schedule under pipelab's cost model, whose figures differ from the paper's;
`reproductions/pipedream_table1/` compares every row of that table and says which terms differ.
"""),
        *exercise("""
The pipeline wins where data parallelism stalls. Plot, for each model, the simulated speed-up of the
pipedream plan against the data-parallel communication fraction on cluster A. Which model gains least,
and why?
""", """
fig = px.scatter(compare, x="dp comm fraction", y="simulated speed-up", text="model",
                 title="speed-up of pipelining grows with the data-parallel stall")
# A pipeline can always fall back to data parallelism (config "16"), so it is never much slower.
assert (compare["simulated speed-up"] > 0.9).all()
fig
"""),
    ]


# ============================================================================ 03 partitioning
def partitioning() -> list[Cell]:
    """The PipeDream partitioning DP, step by step, checked against pl.partition and brute force."""
    return [
        md("""
# 03 · Partitioning: PipeDream's dynamic program, step by step

Given per-layer costs, a partitioner splits the layers into contiguous stages, each run by one or more
replicas. PipeDream (Narayanan et al., SOSP'19, §3.1) minimizes the time per minibatch of the slowest
stage with a dynamic program. On a flat cluster, let `A[j][m]` be the best time when layers `0..j` use
`m` workers:

* one stage, replicated `m` times: `T(0, j, m)` — one replica's minibatch time (compute plus the weight
  all-reduce among the replicas) shared by `m` replicas,
* or a cut after layer `i`, with `m'` workers for the last stage `i+1..j`:
  `max(A[i][m − m'], cut(i), T(i+1, j, m'))`, where `cut(i)` sends the activation across the cut.

`A[j][m] = min` over all of these, and the answer is the best `A[N−1][m]` with `m ≤ W`. We fill the table
by hand for a small synthetic model shaped like VGG-16 (cheap weights in front, heavy ones at the back),
check it against brute force and against `pl.partition`, then look at real models. Stage and transfer
times come from pipelab's one cost model (`CostModel`), the same the partitioner and simulator use.
"""),
        params("""
layer_ms = [4.0, 2.0, 6.0, 1.0, 3.0, 3.0, 1.0]       # forward ms per layer; backward takes twice as long
param_mb = [0.5, 0.5, 1.0, 1.0, 2.0, 40.0, 55.0]    # weights per layer (MB)
out_mb = [4.0, 4.0, 2.0, 2.0, 1.0, 1.0, 0.1]        # activation each layer hands on (MB)
workers = 4
bandwidth_gbps = 10.0
explorer_models = ["vgg16", "gnmt8"]                # shipped PipeDream profiles for the PlanExplorer
"""),
        code("""
import itertools
import math
import pandas as pd
import pipelab as pl
from pipelab.sim.costs import CostModel

prof = pl.Profile.synthetic([ms / 1e3 for ms in layer_ms], out_bytes=[round(mb * 1e6) for mb in out_mb],
                            param_bytes=[round(mb * 1e6) for mb in param_mb], model="vgg-like")
cluster = pl.Cluster.flat(workers, bandwidth=bandwidth_gbps * 1e9 / 8)
cm = CostModel(prof, cluster)
N = len(prof)

def T(i, j, m):
    \"\"\"Seconds per minibatch of layers i..j (inclusive) on m replicas: one replica's time over m.\"\"\"
    return cm.replica_time_s(i, j + 1, workers=range(m)) / m

def cut(i):
    \"\"\"Seconds to send the activation crossing the cut after layer i to the next worker.\"\"\"
    return cm.transfer_s(cm.cut_bytes(i), 0, 1)

A = [[math.inf] * (workers + 1) for _ in range(N)]
choice = {}
for j in range(N):
    for m in range(1, workers + 1):
        A[j][m], choice[j, m] = T(0, j, m), ("one stage", m)
        for i in range(j):
            for mp in range(1, m):
                t = max(A[i][m - mp], cut(i), T(i + 1, j, mp))
                if t < A[j][m]:
                    A[j][m], choice[j, m] = t, (i, mp)

table = pd.DataFrame([[A[j][m] * 1e3 for m in range(1, workers + 1)] for j in range(N)],
                     index=[f"layers 0..{j}" for j in range(N)],
                     columns=[f"m={m}" for m in range(1, workers + 1)])
table.style.format("{:.2f}").set_caption("A[j][m]: best time per minibatch (ms) for layers 0..j on m workers")
"""),
        md("""
Read the table row by row: the first column is the plain sum (one worker runs everything); moving right
adds a worker, which either replicates a stage or opens a new one. Following `choice` backwards from the
best cell of the last row recovers the stages.
"""),
        code("""
def stages_from(j, m):
    \"\"\"Walk the choices back: list of (first_layer, last_layer, replicas).\"\"\"
    c = choice[j, m]
    if c[0] == "one stage":
        return [(0, j, c[1])]
    i, mp = c
    return stages_from(i, m - mp) + [(i + 1, j, mp)]

m_best = min(range(1, workers + 1), key=lambda m: A[N - 1][m])
best = A[N - 1][m_best]
ours = stages_from(N - 1, m_best)
print(f"best {best * 1e3:.2f} ms per minibatch with stages (first, last, replicas): {ours}")
print("config:", "-".join(str(r) for _, _, r in ours))
"""),
        md("""
**Oracle 1 — brute force.** Enumerate every way to cut the layers into contiguous stages and to give the
stages replica counts summing to at most `W`; the best must be the table's answer.
"""),
        code("""
def brute_force():
    best, arg = math.inf, None
    for k in range(1, min(N, workers) + 1):
        for cuts in itertools.combinations(range(1, N), k - 1):
            bounds = [0, *cuts, N]
            for reps in itertools.product(range(1, workers + 1), repeat=k):
                if sum(reps) > workers:
                    continue
                t = max([T(a, b - 1, r) for a, b, r in zip(bounds, bounds[1:], reps)]
                        + [cut(c - 1) for c in cuts])
                if t < best:
                    best, arg = t, (bounds, reps)
    return best, arg

bf, bf_arg = brute_force()
print(f"brute force {bf * 1e3:.4f} ms {bf_arg}, dynamic program {best * 1e3:.4f} ms")
assert math.isclose(bf, best, rel_tol=1e-12)
"""),
        md("""
**Oracle 2 — pipelab's partitioner.** `pl.partition(..., method="pipedream")` solves the same program,
vectorized with numpy over whole rows of the table, hierarchical clusters and memory limits included. On
this flat cluster its predicted time per minibatch must equal ours.
"""),
        code("""
plan = pl.partition(prof, cluster, method="pipedream")
print(plan.describe())
print(f"pl.partition predicts {plan.time_per_minibatch * 1e3:.4f} ms, the table says {best * 1e3:.4f} ms")
assert math.isclose(plan.time_per_minibatch, best, rel_tol=1e-6)
pl.views.partition_graph(prof, plan)
"""),
        *exercise("""
PipeDream's DP optimizes a *straight* pipeline too (one worker per stage, option `straight=True`). Change
the recurrence so that every stage gets exactly one worker (`m' = 1`, and `T(0, j, m)` only for `m = 1`),
and check your answer against `pl.partition(..., straight=True)`. How much slower than the replicated plan
is it, and why?
""", """
S = [[math.inf] * (workers + 1) for _ in range(N)]
for j in range(N):
    S[j][1] = T(0, j, 1)
    for m in range(2, workers + 1):
        S[j][m] = min([max(S[i][m - 1], cut(i), T(i + 1, j, 1)) for i in range(j)], default=math.inf)
straight = pl.partition(prof, cluster, method="pipedream", straight=True)
print(straight.describe())
ours_straight = min(S[N - 1][m] for m in range(1, workers + 1))
print(f"ours {ours_straight * 1e3:.4f} ms; pl.partition's search {straight.notes['search_objective_s'] * 1e3:.4f} ms")
assert math.isclose(straight.notes["search_objective_s"], ours_straight, rel_tol=1e-6)
# The paper's recurrence takes the slowest stage or link. pipelab then scores the chosen plan with the
# full steady state of the cost model, which also bounds a run of unreplicated stages by their 1F1B
# round trip (stage s cannot start minibatch k+1's forward before k's backward came back):
print(f"full steady-state prediction {straight.time_per_minibatch * 1e3:.2f} ms, "
      f"set by: {straight.notes['bottleneck']}")
assert straight.time_per_minibatch >= ours_straight - 1e-12
# Straight, no stage can be faster than its heaviest layer (with the default profile: layer 2, 18 ms of
# forward + backward); replicating the front, whose weights are small, splits all of that work three
# ways for the price of a small all-reduce, while the heavy weights at the back stay on one worker.
print(f"straight is {straight.time_per_minibatch / plan.time_per_minibatch:.2f}x the replicated plan's time")
"""),
        md("""
## Other partitioners beside it

* **prefix-sum** (Lv et al., CCGrid'23): a straight pipeline balanced by binary search over the
  bottleneck value on prefix sums of the layer costs, respecting each device's memory.
* **gpipe** (torchgpipe's `balance_by_time`): a straight pipeline balancing compute alone.
* **hetpipe** (Park et al., ATC'20): layers over a *virtual worker* of heterogeneous GPUs, each stage's
  time divided by its device's speed.

Each returns a Plan priced by the same cost model; the straight ones differ in what they balance.
"""),
        code("""
rows = []
for method in ("pipedream", "prefix-sum", "gpipe"):
    kw = {"straight": True} if method == "pipedream" else {}
    p = pl.partition(prof, cluster, method=method, **kw)
    rows.append({"method": method, "config": p.config, "stages": [(s.start, s.end) for s in p.stages],
                 "slowest stage compute (ms)": max(prof[s.start:s.end].compute_s for s in p.stages) * 1e3,
                 "predicted ms per minibatch": p.time_per_minibatch * 1e3})
pd.DataFrame(rows)
"""),
        code("""
# One heterogeneous virtual worker: four devices of different speeds (1.0 = the profile's device).
from pipelab.cluster import Device, Level

devices = [Device("fast", 2.0), Device("mid", 1.0), Device("mid", 1.0), Device("slow", 0.5)][:workers]
hetero = pl.Cluster.heterogeneous([devices], intra=Level("pcie", len(devices), 1e12), inter=Level("net", 1, 1e12))
hp = pl.partition(prof, hetero, method="hetpipe", policy="NP")     # NP: the node's GPUs form one VW
print(hp.describe())
device_of = hp.notes.get("workers", list(range(hetero.num_workers)))   # plan rank -> physical device
for s in hp.stages:
    w = device_of[s.ranks[0]]
    print(f"stage {s.index} on {hetero.devices[w].name} (speed {hetero.speed(w)}): "
          f"{prof[s.start:s.end].compute_s / hetero.speed(w) * 1e3:.2f} ms")
"""),
        *exercise("""
HetPipe also chooses the *order* of the devices along the pipeline. Brute-force every contiguous cut into
`len(devices)` stages and every order of the devices, minimizing the slowest `compute / speed`, and check
that `hp.time_per_minibatch` (one VW: its bottleneck) equals your optimum.
""", """
speeds = [d.speed for d in devices]
best_h = math.inf
for cuts in itertools.combinations(range(1, N), len(speeds) - 1):
    bounds = [0, *cuts, N]
    work = [prof[a:b].compute_s for a, b in zip(bounds, bounds[1:])]
    for order in itertools.permutations(speeds):
        best_h = min(best_h, max(w / v for w, v in zip(work, order)))   # cuts cost ~0 on this 1 TB/s link
print(f"brute force {best_h * 1e3:.4f} ms, hetpipe {hp.time_per_minibatch * 1e3:.4f} ms")
assert math.isclose(hp.time_per_minibatch, best_h, rel_tol=1e-6)
"""),
        md("""
## Real models: the PlanExplorer

Pick a cluster preset, servers × GPUs, method and memory limit; the explorer re-partitions and redraws
the layer graph coloured by stage with the config string and the predicted speed-up over data
parallelism. (Under papermill it renders a static figure for the default settings.)
"""),
        code("""
explorers = [pl.widgets.PlanExplorer(pl.Profile.from_pipedream(name)) for name in explorer_models]
explorers[0]
"""),
        code("""
explorers[-1] if len(explorers) > 1 else None
"""),
        *exercise("""
VGG-16 on cluster A (4×4): compare the configs and predicted speed-ups of `pipedream`, `prefix-sum` and
`dp`. Why does the prefix-sum partition, a straight pipeline, lose to PipeDream's replicated front here?
""", """
vgg = pl.Profile.from_pipedream("vgg16")
# memory lifted: a straight 16-stage pipeline keeps up to 16 minibatches in flight at its first stage
a = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4, memory=2**40)
res = {m: pl.partition(vgg, a, method=m) for m in ("pipedream", "prefix-sum", "dp")}
print({m: (p.config, round(p.speedup_over_dp, 2)) for m, p in res.items()})
# A straight 16-stage pipeline's slowest stage is bounded below by the slowest single layer; replicating
# the convolutions splits them across workers instead, so pipedream's optimum can only be as good or better.
assert res["pipedream"].time_per_minibatch <= res["prefix-sum"].time_per_minibatch * (1 + 1e-9)
"""),
    ]


# ============================================================================ 04 schedules
def schedules() -> list[Cell]:
    """GPipe, 1F1B-flush, PipeDream, interleaved and ZB-H1 side by side; bubbles and memory."""
    return [
        md("""
# 04 · Schedules: who runs what, when

A schedule is data: per worker, an ordered list of actions such as `1F0` (stage 1, forward, microbatch
0), `B` (backward), `W` (weight gradient, split off by zero-bubble schedules) and `U` (optimizer step).
The same lists drive the runtime, the simulator and the Gantt charts. We compare five orders on a
`P`-stage pipeline with `M` microbatches per minibatch:

| method | idea | source |
|---|---|---|
| `gpipe` | all forwards, then all backwards, flush | Huang et al., NeurIPS'19 |
| `1f1b-flush` | after a warm-up, alternate one forward, one backward; flush | Narayanan et al., ICML'21 / SC'21 |
| `pipedream` | 1F1B without flushes; weight stashing | Narayanan et al., SOSP'19 |
| `interleaved-1f1b` | `v` virtual stages per worker | Narayanan et al., SC'21 §2.2 |
| `zb-h1` | backward split into B (input grad) and W (weight grad) | Qi et al., ICLR'24 |
"""),
        params("""
stages = 4                 # P
microbatches = 8           # M per minibatch
chunks = 2                 # v, virtual stages per worker for interleaved-1f1b
microbatch_sweep = [1, 2, 4, 8, 16, 32]
"""),
        code("""
import pandas as pd
import plotly.express as px
import pipelab as pl

methods = {"gpipe": {}, "1f1b-flush": {}, "pipedream": {}, "interleaved-1f1b": {"chunks": chunks}, "zb-h1": {}}
scheds = {}
for method, opts in methods.items():
    # pipedream has no minibatch boundary: each "microbatch" is a minibatch, and the default length
    # (three times the minibatches in flight) reaches its steady state
    M = None if method == "pipedream" else microbatches
    K = None if method == "pipedream" else 1
    scheds[method] = pl.schedules.build(method, stages, microbatches=M, minibatches=K, **opts)
    pl.schedules.validate(scheds[method])          # dependencies respected, no deadlock
print(scheds["1f1b-flush"])                         # the per-worker action lists as a grid
"""),
        code("""
# Unit costs (F = 1, B = 2; F = B = W = 1 when W is split off) laid out in time, one figure per method.
for method, sched in scheds.items():
    pl.views.gantt(sched, title=method).show()
"""),
        md("""
The white space is the **bubble**: time a worker idles. For GPipe and 1F1B with flushes, with equal
per-stage costs, each worker idles `P−1` slots of `M+P−1`, so the bubble fraction is `(P−1)/(M+P−1)` of
the total time (Huang et al., NeurIPS'19, §2.2; Narayanan et al., SC'21, §2.2, state the same bubble as
`(P−1)/M` of the ideal time). Interleaving divides it by `v`; ZB-H1
cuts it to about a third by filling it with `W`s (Qi et al., ICLR'24, §3).
"""),
        code("""
rows = []
for M in microbatch_sweep:
    for method in ("gpipe", "1f1b-flush", "interleaved-1f1b", "zb-h1"):
        if method == "interleaved-1f1b" and M % stages:
            continue                                   # interleaving needs M a multiple of P
        opts = methods[method]
        sched = pl.schedules.build(method, stages, microbatches=M, minibatches=1, **opts)
        rows.append({"M": M, "method": method, "bubble": pl.views.bubble_fraction(pl.views.schedule_trace(sched))})
    rows.append({"M": M, "method": "closed form (P-1)/(M+P-1)", "bubble": (stages - 1) / (M + stages - 1)})
bubbles = pd.DataFrame(rows)
gp = bubbles[bubbles.method == "gpipe"].bubble.to_numpy()
cf = bubbles[bubbles.method.str.startswith("closed")].bubble.to_numpy()
assert abs(gp - cf).max() < 1e-9, "GPipe's bubble must match the closed form"
px.line(bubbles, x="M", y="bubble", color="method", markers=True, log_x=True,
        title=f"bubble fraction against microbatches, P = {stages}")
"""),
        *exercise("""
Check the interleaved schedule against its closed form `(P−1)/(v·M + P−1)` for every `M` of the sweep
(it needs `M` a multiple of `P`), and ZB-H1's bubble *time* against a third of 1F1B's with equal F, B, W
costs, for `M ≥ P` (Qi et al., ICLR'24, §3: 1F1B idles `(P−1)(F+B+W)`, ZB-H1 `(P−1)(F+B−2W)`).
""", """
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
"""),
        md("""
## Memory: activations in flight

GPipe keeps the activations of all `M` microbatches until their backward; 1F1B starts backwards early
and keeps at most `P − s` microbatches at stage `s`. PipeDream keeps `P − s` *minibatches* in flight at
stage `s` and stashes a weight version for each. The simulator tracks both per worker.
"""),
        code("""
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
"""),
        *exercise("""
How many weight versions does each PipeDream stage hold at once? The schedule records, for every action,
the version it reads (`sched.versions`); `sched.versions_held(s)` counts the most that stage `s` must keep
alive at any time. Compare with PipeDream's `P − s` (SOSP'19, §3.3).
""", """
pd_sched = scheds["pipedream"]
for s in range(stages):
    held = pd_sched.versions_held(s)
    print(f"stage {s}: versions held {held}, closed form P - s = {stages - s}")
    assert held == stages - s
"""),
        md("""
## Explore

The ScheduleExplorer redraws the simulated Gantt, bubble and memory as you change the method, stages,
microbatches, `v` and `K`.
"""),
        code("""
pl.widgets.ScheduleExplorer()
"""),
    ]


# ============================================================================ 05 weight versions
def weight_versions() -> list[Cell]:
    """A live run coloured by weight version; stashing policies and their memory."""
    return [
        md("""
# 05 · Weight versions: stashing, vertical sync, 2BW, PipeMare

Without flushes, a pipeline keeps several minibatches in flight: by the time minibatch `k`'s backward
reaches stage 0, that stage has already applied updates from later minibatches. Using the *current*
weights in the backward pass (**naive-async**) computes a gradient of a function nobody evaluated.
PipeDream **stashes** the version each forward used and reuses it in the backward (SOSP'19, §3.3);
**vertical sync** makes every stage use the input stage's version; **2BW** keeps only two versions and
applies `W(t+1) = W(t) − ν∇f(W(t−1))` (Narayanan et al., ICML'21, §3); **PipeMare** keeps one version and
corrects with learning-rate rescheduling and discrepancy correction (Yang et al., MLSys'21).

First a live 4-process run, coloured by weight version: every backward box has its forward's colour.
"""),
        params("""
backend = "gloo"          # "gloo" (one process per worker) or "local" (reference executor)
workers = 4
steps = 24                # minibatches in the live run
compare_steps = 150       # minibatches per run in the comparison (reference executor)
batch_size = 32
lr = 0.1                  # SGD learning rate of the live run
learning_rates = [0.1, 0.4]
policies = ["1f1b-flush", "naive-async", "pipedream", "vertical-sync", "2bw", "pipemare"]
"""),
        code("""
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
prof = pl.profile(model, data()[0][0], progress=False)
cluster = pl.Cluster.flat(workers, bandwidth=1e9)
plan = pl.partition(prof, cluster, method="pipedream", straight=True)
print(plan.describe())
"""),
        code("""
handle = pl.launch(demo.small_cnn, plan, method="pipedream", data=data, loss_fn=loss_fn, optimizer=optimizer,
                   steps=steps, backend=backend)
pl.widgets.LiveGantt(handle, color_by="version", title="pipedream, coloured by weight version (live)")
"""),
        code("""
run = handle.wait()
ev = run.trace.to_dataframe()
fb = ev[ev.kind.isin(["F", "B"])].pivot_table(index=["stage", "microbatch"], columns="kind",
                                              values="weight_version", aggfunc="first")
assert (fb["F"] == fb["B"]).all(), "weight stashing: every backward uses the version its forward used"
print("versions held per stage (measured):", run.versions_held)
fb.unstack("stage").head(8)
"""),
        md("""
The table shows, per minibatch (row) and stage (column), the weight version its forward (`F`) and its
backward (`B`) used: equal on every row, and lagging more at the early stages, whose updates run ahead of
the minibatches still in flight.

## Six policies side by side

Same model, data and plan; only the weight policy differs, with a synchronous baseline (`1f1b-flush`, one
version, equal to plain minibatch SGD). Each run uses the reference executor (the same schedules and
policies as the processes, in one process: identical weights, no start-up cost). We record the training
loss, the test accuracy at each learning rate, the versions each stage held, and the weight memory.
"""),
        code("""
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
"""),
        code("""
px.line(pd.DataFrame(curves), x="step", y="loss", color="policy", facet_col="lr", log_y=True,
        title="training loss by weight policy and learning rate")
"""),
        md("""
Read the accuracy columns together: at a small learning rate the few updates of staleness in a 4-stage
pipeline hardly matter and every policy learns; at a larger one the asynchronous policies become unstable
before the synchronous baseline does, because their gradients are computed on weights several updates
old. Which asynchronous policy survives a given learning rate varies from run to run near that edge
(try other rates); PipeMare's point is to make the early, most fragile steps smaller for the stages with
the longest delay.
"""),
        *exercise("""
Predict the versions held per stage for PipeDream (`P − s` for stage `s` of a straight `P`-stage pipeline,
§3.3), 2BW (at most 2), naive-async and the flush (1), and check them against the measured column. Then
explain vertical sync's column: why must a late stage keep as many versions as the input stage?
""", """
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
"""),
        md("""
**What each costs.** Stashing multiplies a stage's weight memory by the minibatches in flight there (`P − s`,
so most at the input stage); vertical sync makes every stage agree on the input stage's version, which
costs `P` versions at *every* stage; 2BW caps versions at two for any depth by coalescing gradients over a
minibatch and applying them one update late; naive-async and PipeMare hold one version, and PipeMare
pays instead with smaller early learning rates for delayed stages and an extrapolation of the weights
(discrepancy correction). The flush holds one version too, and pays in bubbles (`04_schedules`).
"""),
    ]


# ============================================================================ 06 heterogeneous
def heterogeneous() -> list[Cell]:
    """HetPipe's virtual workers on a mixed cluster and WSP's staleness bound."""
    return [
        md("""
# 06 · Heterogeneous clusters: HetPipe's virtual workers and WSP

HetPipe (Park et al., ATC'20) trains on a cluster of mixed GPUs by grouping them into **virtual workers**
(VWs). Inside a VW the model runs as a PipeDream pipeline over that VW's GPUs, partitioned so the slowest
stage is as fast as possible given each GPU's speed and memory. Across VWs, data parallelism goes through
a parameter server under **Wave Synchronous Parallel** (WSP): a VW pushes its accumulated update once per
*wave* (the minibatches it has in flight), and may run at most `D` waves ahead of the slowest VW — the
staleness bound (`D = 0` is synchronous at wave granularity).
"""),
        params("""
model = "vgg16"                      # shipped PipeDream profile
batch_size = 32                      # minibatch per virtual worker (the profile is rescaled to it)
policies = ["ED", "NP", "HD"]        # HetPipe's virtual-worker policies
minibatches = 24                     # simulated minibatches
staleness_bounds = [0, 1, 2, 4]      # D values to compare
backend = "gloo"                     # the real run at the end: "gloo" processes or "local" reference executor
run_steps = 24                       # minibatches of the real run
slow_factor = 3.0                    # how much slower virtual worker 1's GPUs are in the real run
"""),
        code("""
from dataclasses import replace

import pandas as pd
import pipelab as pl

def at_batch(prof, batch):
    \"\"\"First-order rescaling of a profile to another minibatch: times and activation bytes scale with
    the batch, parameters do not. (Real GPUs are less efficient at small batches, so this flatters them.)\"\"\"
    f = batch / prof.batch_size
    layers = [replace(l, fwd_s=l.fwd_s * f, bwd_s=l.bwd_s * f, out_bytes=round(l.out_bytes * f),
                      saved_bytes=round(l.saved_bytes * f)) for l in prof.layers]
    return replace(prof, layers=tuple(layers), cut_bytes=tuple(round(c * f) for c in prof.cut_bytes),
                   input_bytes=round(prof.input_bytes * f), batch_size=batch)

full = pl.Profile.from_pipedream(model)
prof = at_batch(full, batch_size)
print(f"{model}: profiled at batch {full.batch_size}, rescaled to {prof.batch_size}")
cluster = pl.Cluster.preset("hetpipe")
print(cluster.describe())
"""),
        md("""
HetPipe's three ways of forming virtual workers (§6): **NP** — the GPUs of one node (one type) form a VW,
so VWs differ in speed; **ED** — every VW gets one GPU of each type, so VWs are identical; **HD** — pairs of
fast and slow nodes. Within each VW the layers are cut so the slowest stage on its device is as fast as
possible. Below: each policy's plan, the partitioner's prediction, and the simulator's measurement,
against data parallelism over the same 16 GPUs (held back by the slowest GPU at every step). The
simulator hands minibatches to the VWs in turn, so in it the VWs advance in step whatever `D` is; the
staleness bound is the subject of the next section.
"""),
        code("""
dp_plan = pl.partition(prof, cluster, method="dp")
dp_sim = pl.simulate(dp_plan, prof, cluster, method="dp", minibatches=4)
plans, rows = {}, []
for policy in policies:
    plan = pl.partition(prof, cluster, method="hetpipe", policy=policy)
    sim = pl.simulate(plan, prof, cluster, method="hetpipe", minibatches=minibatches)
    plans[policy] = (plan, sim)
    vws = plan.notes["virtual_workers"]
    rows.append({"policy": policy, "VW 0 devices": [cluster.devices[r].name for r in vws[0]],
                 "predicted samples/s": prof.batch_size / plan.time_per_minibatch,
                 "simulated samples/s": sim.throughput,
                 "simulated speed-up over dp": sim.throughput / dp_sim.throughput})
pd.DataFrame(rows)
"""),
        code("""
plan, sim = plans[policies[0]]
pl.views.gantt(sim.trace, title=f"hetpipe ({policies[0]}): simulated")
"""),
        md("""
## WSP's staleness bound, checked

`pipelab.runtime.wsp.WSPServer` is the parameter server's logic as a plain object (the runtime serves it
from a separate process). Below, four virtual workers of different speeds run waves in simulated time:
a VW that finishes a wave pushes its update, then pulls the global weights as soon as the rule lets it
start the next wave (`local clock − global clock ≤ D`). `check_staleness` replays the server's log,
recomputing the global clock from the pushes alone, and fails if any pull broke the bound. With VWs of
different speeds (as under the NP policy), a larger `D` lets the fast ones keep working instead of
waiting at every wave boundary — more waves in the same time — at the price of staler weights.
"""),
        code("""
import heapq
import torch
from pipelab.runtime import wsp

def run_waves(D, speeds, horizon):
    \"\"\"Event-driven WSP: VW v needs 1/speeds[v] s per wave; returns the server after `horizon` seconds.\"\"\"
    server = wsp.WSPServer({"w": torch.zeros(1)}, num_virtual_workers=len(speeds), staleness=D)
    ends = []
    for v in range(len(speeds)):
        server.pull(v)
        heapq.heappush(ends, (1 / speeds[v], v))
    waiting = []
    while ends and ends[0][0] <= horizon:
        t, v = heapq.heappop(ends)
        server.push(v, {"w": torch.ones(1)})          # each wave adds 1 to the global weight
        waiting.append(v)
        for u in list(waiting):                       # whoever the new global clock releases starts now
            if server.try_pull(u) is not None:
                waiting.remove(u)
                heapq.heappush(ends, (t + 1 / speeds[u], u))
    return server

speeds = [4.0, 2.0, 1.0, 1.0]                       # relative speeds of the four virtual workers
rows = []
for D in staleness_bounds:
    server = run_waves(D, speeds, horizon=10.0)
    worst = wsp.check_staleness(server.log, len(speeds), D)   # raises if a pull broke the bound
    assert float(server.weights()["w"]) == sum(server.clocks), "every pushed update is in the weights"
    rows.append({"D": D, "waves per VW": list(server.clocks), "total waves": sum(server.clocks),
                 "largest lead at a pull": worst})
wsp_table = pd.DataFrame(rows)
assert list(wsp_table["total waves"]) == sorted(wsp_table["total waves"]), "more staleness, more waves"
wsp_table
"""),
        *exercise("""
Predict the waves each VW completes in 10 s. The slow VWs (speed 1) finish 10 whatever `D` is, so the
global clock ends at 10. A VW whose clock is `c` may start another wave only while `c − global ≤ D`; how
many waves can the fastest VW (speed 4) have completed at the end? Check your formula against the table.
""", """
for D, waves in zip(wsp_table["D"], wsp_table["waves per VW"]):
    g = min(waves)
    # it finishes wave c and may start the next while c - g <= D: it runs up to g + D + 1 waves ahead, but
    # the last one started when the global clock reached 10, at the horizon, so it has completed g + D;
    # unless its own speed (4 waves per second) limits it first
    expected_fast = min(int(10.0 * speeds[0]), g + D)
    print(f"D={D}: fastest VW {waves[0]} waves, predicted {expected_fast}")
    assert waves[0] == expected_fast
"""),
        md("""
## A real HetPipe run

Finally the runtime itself: the digits CNN on two virtual workers of two stages each (four worker
processes and a parameter-server process), with virtual worker 1's GPUs emulated `slow_factor` times
slower (each of its workers sleeps after every action). Each stage's shard of the weights lives on the
server; the server's log of pushes and pulls comes back with the run. We check the bound on the real
log and plot each virtual worker's clock over time: with `D = 0` the two advance in lockstep, with a
larger `D` the fast one runs up to `D` waves ahead.
"""),
        code("""
import functools
import plotly.express as px
from pipelab.models import demo
from pipelab.graph import layer_nodes, trace

images, labels = demo.digits_data("train")
n = len(labels) // 32 * 32
data = functools.partial(demo.batches, (images[:n], labels[:n]), 32)
layers = len(layer_nodes(trace(demo.small_cnn())))
vw_plan = pl.Plan.from_boundaries(layers, [layers // 3], replicas=[2, 2])   # replica v of each stage = VW v
slow = {s.ranks[1]: slow_factor for s in vw_plan.stages}                    # virtual worker 1's workers
clock_rows = []
for D in sorted({staleness_bounds[0], staleness_bounds[-1]}):
    r = pl.train(demo.small_cnn, vw_plan, method="hetpipe", D=D, slowdown=slow, data=data, steps=run_steps,
                 loss_fn=torch.nn.functional.cross_entropy, backend=backend, progress=False,
                 optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    worst = wsp.check_staleness(r.wsp_log, 2, D)         # raises if any pull broke the bound
    print(f"D={D}: {len(r.wsp_log)} server events, largest lead at a pull {worst} (bound {D}), "
          f"{r.throughput:.0f} samples/s, loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}")
    clock_rows += [{"D": D, "t (s)": e.t, "virtual worker": str(e.vw), "local clock": e.clock}
                   for e in r.wsp_log if e.kind == "push" and e.stage == 0]
px.line(pd.DataFrame(clock_rows), x="t (s)", y="local clock", color="virtual worker", facet_col="D",
        markers=True, line_shape="hv", title="virtual workers' clocks on the parameter server (stage 0 shard)")
"""),
    ]


# ============================================================================ 07 beyond DNNs
def beyond_dnns() -> list[Cell]:
    """The simulator applied to a map/shuffle/reduce data pipeline."""
    return [
        md("""
# 07 · Beyond DNNs: which ideas carry over to other pipelines?

A discussion question made runnable: pipeline parallelism is older than deep learning (instruction
pipelines, Unix pipes, stream processing, MapReduce-style data pipelines). Which of this course's ideas
still apply to a pipeline that has **no backward pass and no weights**?

We describe a data pipeline — read → parse → map → shuffle → reduce → write — as a `Profile.synthetic`:
each operator is a "layer" with a forward cost for the job's whole input, zero backward cost, the bytes
it hands to the next operator, and no parameters; streaming the input as `M` batches splits every cost
into `M` parts. Then we reuse the partitioner, the schedules and the
simulator unchanged.
"""),
        params("""
op_names = ["read", "parse", "map", "shuffle", "reduce", "write"]
op_ms = [3.0, 6.0, 9.0, 4.0, 5.0, 2.0]          # compute for the whole input
op_out_mb = [64.0, 48.0, 48.0, 48.0, 8.0, 0.0]  # MB each operator hands on, for the whole input
workers = 3
batches = 16                                     # batches of records streamed through
bandwidth_gbps = 10.0
"""),
        code("""
import pandas as pd
import plotly.express as px
import pipelab as pl

ops = pl.Profile.synthetic([ms / 1e3 for ms in op_ms], bwd_s=[0.0] * len(op_ms),
                           out_bytes=[int(mb * 1e6) for mb in op_out_mb], names=op_names,
                           model="map-shuffle-reduce")
ops.summary()
"""),
        md("""
**Partitioning carries over.** Grouping consecutive operators onto workers so the slowest group is as
fast as possible is exactly the layer partitioning problem; here the cuts are priced by the bytes the
operators hand on. Without weights, replicating an operator costs nothing to synchronize, so when
replication is allowed the partitioner runs the whole pipeline on every worker (plain data parallelism:
each worker streams its own share of the records), as MapReduce does for its map tasks.
"""),
        code("""
cluster = pl.Cluster.flat(workers, bandwidth=bandwidth_gbps * 1e9 / 8)
straight = pl.partition(ops, cluster, method="pipedream", straight=True)
replicated = pl.partition(ops, cluster, method="pipedream")
for p in (straight, replicated):
    print(p.describe(), "\\n")
pl.views.partition_graph(ops, straight)
"""),
        md("""
**Overlap and bubbles carry over.** A schedule is data, so the data pipeline's schedule is simply the
forward half of GPipe's: every worker runs its stage for batch 0, 1, 2, ... as soon as the batch arrives.
Streaming overlaps the stages; the fill and the drain leave the same bubble `(P−1)/(M+P−1)` with equal
stage costs, and in steady state the slowest stage (or link) sets the pace.
"""),
        code("""
from pipelab.schedules.actions import Schedule

gpipe = pl.schedules.build("gpipe", straight, microbatches=batches, minibatches=1)
stream = Schedule(method="forward-only", num_stages=gpipe.num_stages, stage_ranks=gpipe.stage_ranks,
                  microbatches=batches, minibatches=1,
                  actions=tuple(tuple(a for a in acts if a.kind == "F") for acts in gpipe.actions))
print(stream)
sim = pl.simulate(straight, ops, cluster, method="gpipe", microbatches=batches, minibatches=1, schedule=stream)
print(f"simulated: {batches} batches in {sim.trace.makespan * 1e3:.2f} ms")
pl.views.gantt(sim.trace, title="the data pipeline, streamed (forward-only schedule)")
"""),
        *exercise("""
Check the simulator with a closed form. The profile's costs are for the whole job; streamed as `M` batches,
each batch costs `1/M` of every operator and of every transfer. With per-stage compute `c_s` and send
time `x_s` (the stage's outgoing bytes over the link), a pipeline in which each stage sends while it
computes the next batch finishes after the first batch has crossed every stage and link, plus `M − 1`
times the slowest of all those steps: `Σ_s (c_s + x_s) + (M − 1) · max_s max(c_s, x_s)`.
Then compare the bubble of the forward-only schedule (unit costs) with `(P−1)/(M+P−1)`.
""", """
bw = bandwidth_gbps * 1e9 / 8
c = [ops[s.start:s.end].fwd_s / batches for s in straight.stages]
x = [ops[s.start:s.end].out_bytes / batches / bw if s.index < straight.num_stages - 1 else 0.0
     for s in straight.stages]
closed = sum(ci + xi for ci, xi in zip(c, x)) + (batches - 1) * max(max(ci, xi) for ci, xi in zip(c, x))
print(f"closed form {closed * 1e3:.3f} ms, simulated {sim.trace.makespan * 1e3:.3f} ms")
assert abs(closed - sim.trace.makespan) <= 1e-9 + 1e-6 * closed

P = straight.num_stages
bubble = pl.views.bubble_fraction(pl.views.schedule_trace(stream))
print(f"unit-cost bubble {bubble:.4f}, closed form {(P - 1) / (batches + P - 1):.4f}")
assert abs(bubble - (P - 1) / (batches + P - 1)) < 1e-9
"""),
        md("""
**What does not carry over.** There is no backward pass, so 1F1B's reason to exist — starting backwards
early to free stashed activations — is gone; its data-pipeline cousin is *backpressure*: bounded queues
between operators so a fast producer cannot flood a slow consumer's memory. There are no weights, so
weight versions, stashing, 2BW and PipeMare have nothing to act on; every policy computes the same thing.
What takes the place of weights is *state* (a reduce's running aggregate, a join's hash table): a stateful
operator cannot be replicated freely, and the shuffle is an all-to-all exchange that no contiguous cut
avoids — the data pipeline's analogue of the all-reduce, which the simple chain model above leaves out.
The training-shaped costs also do not carry over: `pl.partition` and the built-in methods price a
backward pass and a gradient sent back across every cut, which is why we used the forward-only schedule.
"""),
        *exercise("""
Make the reduce stateful: give the `reduce` operator 200 MB of "parameters" (its aggregate) and
re-partition with replication allowed. What happens to the replica count of the stage holding `reduce`,
and why?
""", """
state = [0, 0, 0, 0, 200_000_000, 0]
stateful = pl.Profile.synthetic([ms / 1e3 for ms in op_ms], bwd_s=[0.0] * len(op_ms),
                                out_bytes=[int(mb * 1e6) for mb in op_out_mb], param_bytes=state,
                                names=op_names, model="stateful")
p = pl.partition(stateful, cluster, method="pipedream")
print(p.describe())
reduce_stage = p.stage_of_layer(op_names.index("reduce"))
print("replicas of the stage with reduce:", reduce_stage.replicas)
# Replicas of a stateful operator must keep their states consistent, which the cost model prices like
# a weight all-reduce of 200 MB: far dearer than computing `reduce` on one worker, so it is not replicated.
assert reduce_stage.replicas == 1
"""),
    ]


NOTEBOOKS: dict[str, Callable[[], list[Cell]]] = {
    "01_quickstart": quickstart,
    "02_why_pipelining": why_pipelining,
    "03_partitioning": partitioning,
    "04_schedules": schedules,
    "05_weight_versions": weight_versions,
    "06_heterogeneous": heterogeneous,
    "07_beyond_dnns": beyond_dnns,
}


def build(name: str) -> NotebookNode:
    """The notebook ``name`` as an nbformat object (no outputs, stable cell ids)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    nb.cells = NOTEBOOKS[name]()
    for i, cell in enumerate(nb.cells):   # deterministic ids so regenerating does not churn the diff
        cell["id"] = f"{name[:2]}-{i:02d}"
    nbformat.validate(nb)
    return nb


def render(nb: NotebookNode) -> str:
    """The notebook's file text."""
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) every notebook; returns a process exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a stored notebook is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path = HERE / f"{name}.ipynb"
        text = render(build(name))
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            atomic_write_text(path, text)
            print("wrote", path.relative_to(HERE.parent))
    if stale:
        print("out of date (run python notebooks/_build.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
