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
# # 03 · Partitioning: PipeDream's dynamic program, step by step
#
# Given per-layer costs, a partitioner splits the layers into contiguous stages, each run by one or more
# replicas. PipeDream (Narayanan et al., SOSP'19, §3.1) minimizes the time per minibatch of the slowest
# stage with a dynamic program. On a flat cluster, let `A[j][m]` be the best time when layers `0..j` use
# `m` workers:
#
# * one stage, replicated `m` times: `T(0, j, m)` — one replica's minibatch time (compute plus the weight
#   all-reduce among the replicas) shared by `m` replicas,
# * or a cut after layer `i`, with `m'` workers for the last stage `i+1..j`:
#   `max(A[i][m − m'], cut(i), T(i+1, j, m'))`, where `cut(i)` sends the activation across the cut.
#
# `A[j][m] = min` over all of these, and the answer is the best `A[N−1][m]` with `m ≤ W`. We fill the table
# by hand for a small synthetic model shaped like VGG-16 (cheap weights in front, heavy ones at the back),
# check it against brute force and against `pl.partition`, then look at real models. Stage and transfer
# times come from pipelab's one cost model (`CostModel`), the same the partitioner and simulator use.

# %% tags=["parameters"]
layer_ms = [4.0, 2.0, 6.0, 1.0, 3.0, 3.0, 1.0]       # forward ms per layer; backward takes twice as long
param_mb = [0.5, 0.5, 1.0, 1.0, 2.0, 40.0, 55.0]    # weights per layer (MB)
out_mb = [4.0, 4.0, 2.0, 2.0, 1.0, 1.0, 0.1]        # activation each layer hands on (MB)
workers = 4
bandwidth_gbps = 10.0
explorer_models = ["vgg16", "gnmt8"]                # shipped PipeDream profiles for the PlanExplorer

# %%
import itertools
import math

import pandas as pd

import pipelab as pl
from pipelab.costs import CostModel

prof = pl.Profile.synthetic([ms / 1e3 for ms in layer_ms], out_bytes=[round(mb * 1e6) for mb in out_mb],
                            param_bytes=[round(mb * 1e6) for mb in param_mb], model="vgg-like")
cluster = pl.Cluster.flat(workers, bandwidth=bandwidth_gbps * 1e9 / 8)
cm = CostModel(prof, cluster)
N = len(prof)

def T(i, j, m):
    """Seconds per minibatch of layers i..j (inclusive) on m replicas: one replica's time over m."""
    return cm.replica_time_s(i, j + 1, workers=range(m)) / m

def cut(i):
    """Seconds to send the activation crossing the cut after layer i to the next worker."""
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


# %% [markdown]
# Read the table row by row: the first column is the plain sum (one worker runs everything); moving right
# adds a worker, which either replicates a stage or opens a new one. Following `choice` backwards from the
# best cell of the last row recovers the stages.

# %%
def stages_from(j, m):
    """Walk the choices back: list of (first_layer, last_layer, replicas)."""
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


# %% [markdown]
# **Oracle 1 — brute force.** Enumerate every way to cut the layers into contiguous stages and to give the
# stages replica counts summing to at most `W`; the best must be the table's answer.

# %%
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

# %% [markdown]
# **Oracle 2 — pipelab's partitioner.** `pl.partition(..., method="pipedream")` solves the same program,
# vectorized with numpy over whole rows of the table, hierarchical clusters and memory limits included. On
# this flat cluster its predicted time per minibatch must equal ours.

# %%
plan = pl.partition(prof, cluster, method="pipedream")
print(plan.describe())
print(f"pl.partition predicts {plan.time_per_minibatch * 1e3:.4f} ms, the table says {best * 1e3:.4f} ms")
assert math.isclose(plan.time_per_minibatch, best, rel_tol=1e-6)
pl.views.partition_graph(prof, plan)

# %% [markdown]
# **Exercise.** PipeDream's DP optimizes a *straight* pipeline too (one worker per stage, option
# `straight=True`). Change the recurrence so that every stage gets exactly one worker (`m' = 1`, and
# `T(0, j, m)` only for `m = 1`), and check your answer against `pl.partition(..., straight=True)`. How
# much slower than the replicated plan is it, and why?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
S = [[math.inf] * (workers + 1) for _ in range(N)]
for j in range(N):
    S[j][1] = T(0, j, 1)
    for m in range(2, workers + 1):
        S[j][m] = min([max(S[i][m - 1], cut(i), T(i + 1, j, 1)) for i in range(j)], default=math.inf)
straight = pl.partition(prof, cluster, method="pipedream", straight=True)
print(straight.describe())
ours_straight = min(S[N - 1][m] for m in range(1, workers + 1))
print(f"ours {ours_straight * 1e3:.4f} ms; "
      f"pl.partition's search {straight.notes['search_objective_s'] * 1e3:.4f} ms")
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

# %% [markdown]
# ## Other partitioners beside it
#
# * **prefix-sum** (Lv et al., CCGrid'23): a straight pipeline balanced by binary search over the
#   bottleneck value on prefix sums of the layer costs, respecting each device's memory.
# * **gpipe** (torchgpipe's `balance_by_time`): a straight pipeline balancing compute alone.
# * **hetpipe** (Park et al., ATC'20): layers over a *virtual worker* of heterogeneous GPUs, each stage's
#   time divided by its device's speed.
#
# Each returns a Plan priced by the same cost model; the straight ones differ in what they balance.

# %%
rows = []
for method in ("pipedream", "prefix-sum", "gpipe"):
    kw = {"straight": True} if method == "pipedream" else {}
    p = pl.partition(prof, cluster, method=method, **kw)
    rows.append({"method": method, "config": p.config, "stages": [(s.start, s.end) for s in p.stages],
                 "slowest stage compute (ms)": max(prof[s.start:s.end].compute_s for s in p.stages) * 1e3,
                 "predicted ms per minibatch": p.time_per_minibatch * 1e3})
pd.DataFrame(rows)

# %%
# One heterogeneous virtual worker: four devices of different speeds (1.0 = the profile's device).
from pipelab.cluster import Device, Level

devices = [Device("fast", 2.0), Device("mid", 1.0), Device("mid", 1.0), Device("slow", 0.5)][:workers]
hetero = pl.Cluster.heterogeneous([devices], intra=Level("pcie", len(devices), 1e12),
                                  inter=Level("net", 1, 1e12))
hp = pl.partition(prof, hetero, method="hetpipe", policy="NP")     # NP: the node's GPUs form one VW
print(hp.describe())
device_of = hp.notes.get("workers", list(range(hetero.num_workers)))   # plan rank -> physical device
for s in hp.stages:
    w = device_of[s.ranks[0]]
    print(f"stage {s.index} on {hetero.devices[w].name} (speed {hetero.speed(w)}): "
          f"{prof[s.start:s.end].compute_s / hetero.speed(w) * 1e3:.2f} ms")

# %% [markdown]
# **Exercise.** HetPipe also chooses the *order* of the devices along the pipeline. Brute-force every
# contiguous cut into `len(devices)` stages and every order of the devices, minimizing the slowest
# `compute / speed`, and check that `hp.time_per_minibatch` (one VW: its bottleneck) equals your optimum.
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
speeds = [d.speed for d in devices]
best_h = math.inf
for cuts in itertools.combinations(range(1, N), len(speeds) - 1):
    bounds = [0, *cuts, N]
    work = [prof[a:b].compute_s for a, b in zip(bounds, bounds[1:])]
    for order in itertools.permutations(speeds):
        best_h = min(best_h, max(w / v for w, v in zip(work, order)))   # cuts cost ~0 on this 1 TB/s link
print(f"brute force {best_h * 1e3:.4f} ms, hetpipe {hp.time_per_minibatch * 1e3:.4f} ms")
assert math.isclose(hp.time_per_minibatch, best_h, rel_tol=1e-6)

# %% [markdown]
# ## Real models: the PlanExplorer
#
# Pick a cluster preset, servers × GPUs, method and memory limit; the explorer re-partitions and redraws
# the layer graph coloured by stage with the config string and the predicted speed-up over data
# parallelism. (Under papermill it renders a static figure for the default settings.)

# %%
explorers = [pl.widgets.PlanExplorer(pl.Profile.from_pipedream(name)) for name in explorer_models]
explorers[0]

# %%
explorers[-1] if len(explorers) > 1 else None

# %% [markdown]
# **Exercise.** VGG-16 on cluster A (4×4): compare the configs and predicted speed-ups of `pipedream`,
# `prefix-sum` and `dp`. Why does the prefix-sum partition, a straight pipeline, lose to PipeDream's
# replicated front here?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
vgg = pl.Profile.from_pipedream("vgg16")
# memory lifted: a straight 16-stage pipeline keeps up to 16 minibatches in flight at its first stage
a = pl.Cluster.preset("pipedream-a", servers=4, gpus_per_server=4, memory=2**40)
res = {m: pl.partition(vgg, a, method=m) for m in ("pipedream", "prefix-sum", "dp")}
print({m: (p.config, round(p.speedup_over_dp, 2)) for m, p in res.items()})
# A straight 16-stage pipeline's slowest stage is bounded below by the slowest single layer; replicating
# the convolutions splits them across workers instead, so pipedream's optimum can only be as good or better.
assert res["pipedream"].time_per_minibatch <= res["prefix-sum"].time_per_minibatch * (1 + 1e-9)
