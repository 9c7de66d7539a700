"""PipeDream's optimizer (SOSP'19 §3.1): contiguous layer ranges with replica counts, by dynamic programming.

PipeDream picks stages (contiguous layer ranges) and a replica count per stage to minimise the
slowest stage, where a stage's time is its compute shared among its replicas, its weight all-reduce,
and the transfers across its cuts. It solves the problem level by level: the level-``k`` DP treats
a level-``k-1`` block and its best sub-plan as one "device". Its plans can therefore only replicate
whole lower-level pipelines.

pipelab's plans place each stage on a contiguous run of ranks (``Plan``'s convention), so we solve
one DP over ``(layers done, workers used)`` in which each stage's costs are taken from the ranks it
actually gets: the hierarchical all-reduce over exactly those workers, and each cut priced on the
link between the last worker of one stage and the first of the next. That is exact over its plan
space, which contains every plan made of whole blocks (PipeDream's level-by-level plans in rank
order), and also plans such as "15-1" on 4 x 4 that straddle a server.

Recurrence (``A[j, w]`` = best time per minibatch for layers ``[0, j)`` on workers ``[0, w)``)::

    A[j, w + m] = min_i max( A[i, w], cut(i, w), T_{w,m}[i, j] / m )

with ``T_{w,m}[i, j]`` one replica's minibatch time (compute + DDP-overlapped all-reduce over workers
``[w, w+m)``, :meth:`CostModel.replica_time_matrix`), ``cut(i, w)`` the transfer of the activation
crossing boundary ``i`` from worker ``w-1`` to ``w`` (0 for ``i = 0``), and stages over memory
(``(versions + 1 + optimizer) * params + in_flight * activations`` above the limit) excluded.
Differences from PipeDream's own optimizer, on purpose: compute and communication overlap (``max``
rather than sum, as the paper's formula says but not every term of its code does); activation and
gradient transfers are charged at every cut, at every level; the all-reduce hides behind backward
except for the tail of the earliest layers' gradients; and everything is vectorised with numpy:
each ``(w, m)`` step is one ``(N+1) x (N+1)`` min-max, so a run is ``O(N^2 W^2)`` numbers in
``O(W^2 + N W)`` numpy calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipelab.partition._evaluate import build_plan
from pipelab.partition.plan import Plan
from pipelab.sim.costs import CostModel


def solve(cm: CostModel, *, straight: bool = False, memory_limit: float | None = None,
          max_stages: int | None = None) -> tuple[float, list[int], list[int]]:
    """The DP itself: ``(time per minibatch, stage boundaries, replicas per stage)`` over all workers."""
    n, W = cm.num_layers, cm.cluster.num_workers
    if straight and W > n:
        raise ValueError(f"a straight pipeline on {W} workers needs at least {W} layers, the model has {n}; "
                         f"use fewer workers or straight=False")
    inf = np.inf
    A = np.full((n + 1, W + 1), inf)
    A[0, 0] = 0.0
    par_i = np.full((n + 1, W + 1), -1, dtype=np.int64)
    par_w = np.full((n + 1, W + 1), -1, dtype=np.int64)
    speeds = [cm.cluster.speed(w) for w in range(W)]
    mems = [cm.cluster.memory(w) for w in range(W)]
    # cut cost of boundary i (between layer i-1 and i) from worker w-1 to w
    link_sb = np.zeros(W + 1)
    link_lat = np.zeros(W + 1)
    for w in range(1, W):
        lv = cm.cluster.link(w - 1, w)
        link_sb[w] = 1.0 / (cm.compression_ratio * lv.bandwidth)
        link_lat[w] = lv.latency
    cut_bytes = np.concatenate([[0.0], cm.cuts, [0.0]])  # index i: activation entering layer i
    # memory of [i, j) with k in flight = g_k[j] - h_k[i]; feasible j form a prefix for each i
    inp = np.concatenate([[float(cm.profile.input_bytes)], cm.cuts, [0.0]])
    idx = np.arange(n + 1)
    cap = max(4, int(3e8 // (8 * (n + 1) ** 2)))   # cached T matrices (about 300 MB at most)
    cache: dict[tuple[float, float, float], np.ndarray] = {}
    penalties: dict[tuple[int, float], np.ndarray | None] = {}
    # row chunks of j so that only the triangle i < j is scanned
    step = max(32, (n + 1) // 8)
    chunks = [(a, min(a + step, n + 1)) for a in range(1, n + 1, step)]
    buf = np.empty((n + 1, n + 1))
    for w in range(W):
        col = A[:, w]
        if w > 0:
            cutc = np.where(idx > 0, link_lat[w] + cut_bytes * link_sb[w], 0.0)
            base = np.maximum(col, cutc)
        else:
            base = col.copy()
        rows = np.flatnonzero(np.isfinite(base))
        if rows.size == 0:
            continue
        lo = int(rows.min())
        for m in range(1, W - w + 1):
            if straight and m > 1:
                break
            key = (min(speeds[w:w + m]), *cm.allreduce_coeffs(range(w, w + m)))
            TT = cache.get(key)
            if TT is None:
                if len(cache) >= cap:
                    cache.pop(next(iter(cache)))
                TT = cm.replica_time_matrix(*key, transpose=True)  # TT[j, i]
                cache[key] = TT
            k = math.ceil((W - w) / m)  # NOAM at this stage = weight versions stashed
            lim = float(memory_limit if memory_limit is not None else min(mems[w:w + m]))
            pkey = (k, lim)
            if pkey not in penalties:
                gk = (k + 1 + cm.state_factor) * cm.pp + k * cm.pa
                hk = (k + 1 + cm.state_factor) * cm.pp + k * (cm.pa - inp)
                jmax = np.searchsorted(gk, lim + hk, side="right") - 1   # last feasible j per i
                if np.all(jmax >= n):
                    penalties[pkey] = None
                else:
                    penalties[pkey] = np.where(idx[:, None] > jmax[None, :], np.inf, 0.0)  # [j, i]
            pen = penalties[pkey]
            bm = base * m
            for a, b in chunks:
                if b <= lo + 1:
                    continue
                a2 = max(a, lo + 1)
                blk = buf[a2:b, lo:b - 1]
                np.maximum(TT[a2:b, lo:b - 1], bm[None, lo:b - 1], out=blk)
                if pen is not None:
                    blk += pen[a2:b, lo:b - 1]
                arg = blk.argmin(axis=1)
                best = blk[np.arange(b - a2), arg] / m
                tgt = A[a2:b, w + m]
                better = best < tgt
                if better.any():
                    js = np.flatnonzero(better)
                    A[a2 + js, w + m] = best[js]
                    par_i[a2 + js, w + m] = lo + arg[js]
                    par_w[a2 + js, w + m] = w
    total = float(A[n, W])
    if not math.isfinite(total):
        raise ValueError(f"no pipedream plan of {cm.profile.model or 'this model'} fits in memory on "
                         f"{cm.cluster.name} (limit "
                         f"{(memory_limit if memory_limit is not None else min(mems)) / 2**30:.2f} GiB per "
                         f"worker); use more workers, a smaller batch, or raise memory_limit")
    bounds, reps = [], []
    j, w = n, W
    while j > 0:
        i, pw = int(par_i[j, w]), int(par_w[j, w])
        reps.append(w - pw)
        if i > 0:
            bounds.append(i)
        j, w = i, pw
    bounds.reverse()
    reps.reverse()
    if max_stages is not None and len(reps) > max_stages:
        raise ValueError(f"the best plan has {len(reps)} stages, more than max_stages={max_stages}")
    return total, bounds, reps


def partition_pipedream(cm: CostModel, *, straight: bool = False, memory_limit: float | None = None,
                        workers: Sequence[int] | None = None) -> Plan:
    """PipeDream's plan: the DP's stages and replica counts, with every prediction filled in.

    ``workers`` restricts the plan to a regular subset of the cluster (whole servers, or GPUs of
    one server); ``straight=True`` forbids replication (one worker per stage).
    """
    from dataclasses import replace

    sub = cm.cluster.subset(workers) if workers is not None else cm.cluster
    cm2 = replace(cm, cluster=sub) if workers is not None else cm
    total, bounds, reps = solve(cm2, straight=straight, memory_limit=memory_limit)
    plan = build_plan(cm2, bounds, reps, method="pipedream", schedule="async",
                      notes={"dp_objective_s": total, "straight": straight})
    if workers is not None:
        plan = plan.with_predictions(notes={**plan.notes, "workers": sorted(set(workers))})
    return plan
