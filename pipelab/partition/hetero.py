"""HetPipe (Park et al., USENIX ATC'20): pipelines over virtual workers of heterogeneous GPUs.

HetPipe groups a heterogeneous cluster's GPUs into *virtual workers* (VWs); each VW runs a
PipeDream-style pipeline over its own GPUs, and VWs synchronise through a parameter server under
Wave Synchronous Parallel (bounded staleness). Its resource-allocation policies (§6):

* ``"NP"`` (node partition): each VW is the GPUs of one node, hence of one type;
* ``"ED"`` (equal distribution): each VW gets one GPU of each type (identical VWs);
* ``"HD"`` (hybrid distribution): each VW pairs fast with slow types, half of each node's GPUs
  from two nodes (here: node ``i`` with node ``n-1-i`` of the nodes sorted by speed).

Within a VW, layers are cut into contiguous stages, one per GPU, minimising the slowest stage
where stage time is compute / the GPU's speed (and each cut's transfer time), under each GPU's
memory; the order of GPUs along the pipeline is searched too (all orders for up to 6 GPUs).
Under bounded staleness the VWs progress in the long run at the slowest VW's pace, so the cluster
finishes ``V`` minibatches every ``max_v T_v`` seconds; parameter-server traffic is assumed hidden by
the staleness bound (HetPipe §4), which is the optimistic side of its model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pipelab.cluster import Cluster
from pipelab.partition._evaluate import build_plan
from pipelab.partition.plan import Plan
from pipelab.sim.costs import CostModel

POLICIES = ("ED", "NP", "HD")


def virtual_workers(cluster: Cluster, policy: str = "ED") -> list[list[int]]:
    """Group the cluster's workers into virtual workers by HetPipe's ``policy`` ("ED", "NP", "HD")."""
    pol = policy.upper()
    if pol not in POLICIES:
        raise ValueError(f"unknown virtual-worker policy {policy!r}; choose one of {', '.join(POLICIES)}")
    g = cluster.levels[0].size
    nodes = [list(range(s, s + g)) for s in range(0, cluster.num_workers, g)]
    if pol == "NP":
        return nodes
    if pol == "ED":
        by_type: dict[str, list[int]] = {}
        for w, d in enumerate(cluster.devices):
            by_type.setdefault(d.name, []).append(w)
        counts = {len(v) for v in by_type.values()}
        if len(counts) != 1:
            raise ValueError(f"ED needs the same number of GPUs of every type; got "
                             f"{ {k: len(v) for k, v in by_type.items()} }; use policy='NP'")
        return [list(ws) for ws in zip(*by_type.values())]
    # HD: pair nodes fast-with-slow; each VW takes half of each paired node's GPUs
    if len(nodes) % 2 or g % 2:
        raise ValueError("HD pairs nodes and halves them; it needs an even number of nodes and of GPUs per node")
    order = sorted(range(len(nodes)), key=lambda i: -cluster.devices[nodes[i][0]].speed)
    vws = []
    for a, b in zip(order[: len(order) // 2], reversed(order[len(order) // 2:])):
        h = g // 2
        vws.append(nodes[a][:h] + nodes[b][:h])
        vws.append(nodes[a][h:] + nodes[b][h:])
    return vws


def partition_virtual_worker(cm: CostModel, devices: Sequence[int], *, memory_limit: float | None = None,
                             search_order: bool = True) -> tuple[float, list[int], list[int]]:
    """Best straight pipeline of the whole model over ``devices``: ``(time, boundaries, device order)``.

    Exact DP over (layers, stages) for each device order (all orders when ``len(devices) <= 6`` and
    ``search_order``; otherwise the given order and fastest-first).
    """
    n, k = cm.num_layers, len(devices)
    if k == 0:
        raise ValueError("a virtual worker needs at least one device")
    if k > n:
        raise ValueError(f"{k} devices but the model has {n} layers; use at most {n} devices per virtual worker")
    comp = (cm.pf + cm.pb)[None, :] - (cm.pf + cm.pb)[:, None]
    comp = np.where(np.triu(np.ones((n + 1, n + 1), dtype=bool), 1), comp, np.inf)
    P_mat, A_mat = cm.memory_arrays()
    cut_bytes = np.concatenate([[0.0], cm.cuts, [0.0]])
    if search_order and k <= 6:
        orders = set(itertools.permutations(devices))
        # identical devices make many orders equivalent: keep one per sequence of device types
        seen, uniq = set(), []
        for o in sorted(orders):
            key = tuple(cm.cluster.devices[w] for w in o)
            if key not in seen:
                seen.add(key)
                uniq.append(list(o))
        candidates = uniq
    else:
        candidates = [list(devices), sorted(devices, key=lambda w: -cm.cluster.speed(w))]
    best: tuple[float, list[int], list[int]] | None = None
    for order in candidates:
        A = np.full(n + 1, np.inf)
        A[0] = 0.0
        parents = []
        for s, w in enumerate(order):
            kf = k - s
            lim = memory_limit if memory_limit is not None else cm.cluster.memory(w)
            cost = comp / cm.cluster.speed(w)
            cost = np.where((kf + 1 + cm.state_factor) * P_mat + kf * A_mat <= lim, cost, np.inf)
            if s > 0:
                lv = cm.cluster.link(order[s - 1], w) if order[s - 1] != w else None
                cutc = (np.zeros(n + 1) if lv is None else
                        lv.latency + cut_bytes / (cm.compression_ratio * lv.bandwidth))
                cutc[0] = 0.0
                base = np.maximum(A, cutc)
            else:
                base = A
            cand = np.maximum(base[:, None], cost)
            arg = cand.argmin(axis=0)
            A = cand[arg, np.arange(n + 1)]
            parents.append(arg)
        if math.isfinite(A[n]) and (best is None or A[n] < best[0] - 1e-15):
            bounds, j = [], n
            for s in range(k - 1, -1, -1):
                i = int(parents[s][j])
                if s > 0:
                    bounds.append(i)
                j = i
            best = (float(A[n]), bounds[::-1], order)
    if best is None:
        raise ValueError(f"no partition of {cm.profile.model or 'this model'} over devices {list(devices)} fits "
                         f"in their memory; use a smaller batch or more devices per virtual worker")
    return best


def partition_hetpipe(cm: CostModel, *, policy: str = "ED", memory_limit: float | None = None) -> Plan:
    """HetPipe plan: VWs by ``policy``; each VW a straight pipeline; stage ``s`` replicated over VWs.

    All VWs use the partition of the slowest VW (with ``ED`` they are identical); predicted time per
    minibatch is ``max_v T_v / V`` (bounded staleness: the slowest VW sets the pace).
    """
    vws = virtual_workers(cm.cluster, policy)
    sizes = {len(v) for v in vws}
    if len(sizes) != 1:
        raise ValueError("virtual workers of different sizes cannot share one plan")
    results = [partition_virtual_worker(cm, v, memory_limit=memory_limit) for v in vws]
    slow = max(range(len(vws)), key=lambda i: results[i][0])
    t_slow, bounds, _ = results[slow]
    k, V = sizes.pop(), len(vws)
    # stage s runs on the s-th device (in its best order) of every VW
    stage_workers = [[results[v][2][s] for v in range(V)] for s in range(k)]
    ranks_of = [w for ws in stage_workers for w in ws]
    # time of every VW with the shared boundaries (each VW keeps its own device order)
    plan = build_plan(cm, bounds, [V] * k, method="hetpipe", schedule="async", in_flight=[k - s for s in range(k)],
                      ranks_of=ranks_of, notes={"policy": policy.upper(), "virtual_workers": vws,
                                                "vw_times_s": [r[0] for r in results]})
    terms = []
    for v in range(V):
        order = results[v][2]
        cuts = [0, *bounds, cm.num_layers]
        t = 0.0
        for s, w in enumerate(order):
            f, b = cm.compute_s(cuts[s], cuts[s + 1], w)
            t = max(t, f + b)
            if s > 0:
                t = max(t, cm.transfer_s(cm.cut_bytes(cuts[s] - 1), order[s - 1], w))
        terms.append(t)
    time = max(terms) / V
    stages = tuple(replace(st, versions=st.in_flight) for st in plan.stages)
    return plan.with_predictions(stages=stages, time_per_minibatch=time,
                                 speedup_over_dp=plan.time_per_minibatch * plan.speedup_over_dp / time,
                                 notes={**plan.notes, "vw_times_shared_bounds_s": terms,
                                        "sync": "parameter server under WSP, assumed hidden by staleness"})
