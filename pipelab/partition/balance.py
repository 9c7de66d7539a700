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


def _split(costs: Sequence[float], partitions: int, legal: Sequence[bool] | None = None) -> list[int]:
    """Exact min-max contiguous split of non-negative ``costs`` into ``partitions`` non-empty parts, cut
    only at positions ``i`` (a part starting at layer ``i``) where ``legal[i]`` (default: everywhere)."""
    c = np.asarray(costs, dtype=np.float64)
    n = len(c)
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions={partitions!r} must be a positive integer")
    if partitions > n:
        raise ValueError(f"{partitions} partitions but only {n} layers; use at most {n} partitions")
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("costs must be finite numbers >= 0 (check the profile for NaN or negative times)")
    ok = np.ones(n + 1, dtype=bool) if legal is None else np.array(legal, dtype=bool)
    if len(ok) != n + 1:
        raise ValueError(f"legal has {len(ok)} entries; give one per position 0..{n} ({n + 1})")
    ok[0] = ok[n] = True
    starts = np.flatnonzero(ok)
    if len(starts) - 1 < partitions:
        raise ValueError(f"{partitions} partitions but only {len(starts) - 2} legal cuts between the {n} "
                         f"layers; use at most {len(starts) - 1} partitions")
    pre = np.concatenate([[0.0], np.cumsum(c)])

    def greedy(X: float) -> list[int] | None:
        # the furthest legal end within X of each start: reaching further never hurts (costs >= 0)
        cuts, i = [0], 0
        while i < n:
            far = int(np.searchsorted(pre, pre[i] + X * (1 + 1e-12) + 1e-300, side="right")) - 1
            j = int(starts[np.searchsorted(starts, min(far, n), side="right") - 1])
            if j <= i:
                return None
            cuts.append(j)
            i = j
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
    # fewer parts than asked: split the part with the most layers at its last legal position (never
    # raises the maximum)
    while len(cuts) - 1 < partitions:
        inner = [(b - a, k, int(starts[(starts > a) & (starts < b)][-1]))
                 for k, (a, b) in enumerate(zip(cuts, cuts[1:])) if np.any((starts > a) & (starts < b))]
        _, k, at = max(inner, key=lambda t: (t[0], -t[1]))
        cuts.insert(k + 1, at)
    return [b - a for a, b in zip(cuts, cuts[1:])]


def uniform_cuts(layers: int, stages: int) -> list[int]:
    """First layer of each stage after the first in a uniform split (torch's and Megatron's default)."""
    return [round(i * layers / stages) for i in range(1, stages)]


def balance_by_time(partitions: int, times: Sequence[float], *, legal: Sequence[bool] | None = None
                    ) -> list[int]:
    """Layers per partition so that the slowest partition's total time is as small as possible;
    ``legal``: where a partition may start (:meth:`Profile.legal_starts`)."""
    return _split(times, partitions, legal)


def balance_by_size(partitions: int, sizes: Sequence[float], *, legal: Sequence[bool] | None = None
                    ) -> list[int]:
    """Layers per partition so that the largest partition's total bytes are as small as possible."""
    return _split(sizes, partitions, legal)


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
        sizes = balance_by_time(S, [layer.fwd_s + layer.bwd_s for layer in cm.profile.layers],
                                legal=cm.profile.legal_starts())
    elif by == "size":
        P_mat, A_mat = cm.memory_arrays()
        per = [float(P_mat[i, i + 1] * (2 + cm.state_factor) + A_mat[i, i + 1]) for i in range(n)]
        sizes = balance_by_size(S, per, legal=cm.profile.legal_starts())
    else:
        raise ValueError(f"by={by!r}: balance by 'time' or 'size'")
    bounds = [int(b) for b in np.cumsum(sizes)[:-1]]
    plan = build_plan(cm, bounds, [1] * S, method="gpipe", run=Pipelining("flush", M),
                      notes={"balance": by, "bubble_fraction": (S - 1) / (M + S - 1)})
    check_memory(plan, cm, memory_limit)
    assert math.isfinite(plan.time_per_minibatch)
    return plan
