"""torchgpipe-style balancing: the exact min-max split of per-layer times or sizes into partitions.

``balance_by_time``/``balance_by_size`` mirror torchgpipe.balance but take per-layer numbers; GPipe
(Huang et al., NeurIPS'19) runs the partitions as a fill-drain pipeline of ``M`` microbatches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipelab.batching import check_divides, default_microbatches
from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.partition.predict import Pipelining, build_plan, check_memory


def _split(costs: Sequence[float], partitions: int) -> list[int]:
    """Exact min-max contiguous split of non-negative ``costs`` into ``partitions`` non-empty parts."""
    c = np.asarray(costs, dtype=np.float64)
    n = len(c)
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions={partitions!r} must be a positive integer")
    if partitions > n:
        raise ValueError(f"{partitions} partitions but only {n} layers; use at most {n} partitions")
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("costs must be finite numbers >= 0 (check the profile for NaN or negative times)")
    pre = np.concatenate([[0.0], np.cumsum(c)])

    def greedy(X: float) -> list[int] | None:
        cuts, i = [0], 0
        while i < n:
            j = int(np.searchsorted(pre, pre[i] + X * (1 + 1e-12) + 1e-300, side="right")) - 1
            if j <= i:
                return None
            cuts.append(min(j, n))
            i = min(j, n)
        return cuts

    cand = np.unique((pre[None, :] - pre[:, None])[np.triu_indices(n + 1, 1)])
    lo, hi = 0, len(cand) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        g = greedy(float(cand[mid]))
        if g is not None and len(g) - 1 <= partitions:
            hi = mid
        else:
            lo = mid + 1
    cuts = greedy(float(cand[lo]))
    assert cuts is not None
    # fewer parts than asked: split the longest parts (never raises the maximum)
    sizes = [b - a for a, b in zip(cuts, cuts[1:])]
    while len(sizes) < partitions:
        k = max(range(len(sizes)), key=lambda t: sizes[t])
        sizes[k:k + 1] = [sizes[k] - 1, 1]
    return sizes


def uniform_cuts(layers: int, stages: int) -> list[int]:
    """First layer of each stage after the first in a uniform split (torch's and Megatron's default)."""
    return [round(i * layers / stages) for i in range(1, stages)]


def balance_by_time(partitions: int, times: Sequence[float]) -> list[int]:
    """Layers per partition so that the slowest partition's total time is as small as possible."""
    return _split(times, partitions)


def balance_by_size(partitions: int, sizes: Sequence[float]) -> list[int]:
    """Layers per partition so that the largest partition's total bytes are as small as possible."""
    return _split(sizes, partitions)


def partition_gpipe(cm: CostModel, *, stages: int | None = None, microbatches: int | None = None,
                    by: str = "time", memory_limit: float | None = None) -> Plan:
    """A GPipe plan: ``stages`` partitions balanced ``by`` "time" or "size", one worker each."""
    n, W = cm.num_layers, cm.cluster.num_workers
    S = min(W, n) if stages is None else stages
    if not (1 <= S <= W):
        raise ValueError(f"stages={S} must be in 1..{W} (the cluster's workers)")
    M = default_microbatches(S) if microbatches is None else microbatches
    if cm.profile.source != "synthetic":   # a synthetic profile's times split into any M
        check_divides(cm.profile.batch_size, M)
    if by == "time":
        sizes = balance_by_time(S, [layer.fwd_s + layer.bwd_s for layer in cm.profile.layers])
    elif by == "size":
        P_mat, A_mat = cm.memory_arrays()
        per = [float(P_mat[i, i + 1] * (2 + cm.state_factor) + A_mat[i, i + 1]) for i in range(n)]
        sizes = balance_by_size(S, per)
    else:
        raise ValueError(f"by={by!r}: balance by 'time' or 'size'")
    bounds = [int(b) for b in np.cumsum(sizes)[:-1]]
    plan = build_plan(cm, bounds, [1] * S, method="gpipe", run=Pipelining("flush", M),
                      notes={"balance": by, "bubble_fraction": (S - 1) / (M + S - 1)})
    check_memory(plan, cm, memory_limit)
    assert math.isfinite(plan.time_per_minibatch)
    return plan
