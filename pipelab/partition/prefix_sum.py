"""Lv et al. (CCGrid'23): balanced contiguous partition by prefix sums and a binary search on the bottleneck.

One stage per worker; the optimum bottleneck is one of the stage or cut costs, found exactly by a
binary search over their sorted values with a reachability sweep per probe. docs/partitioning.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import pipelab.metrics as metrics
from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.partition.predict import Pipelining, build_plan


class _Problem:
    """Prefix sums and per-stage limits of one straight partition problem."""

    def __init__(self, cm: CostModel, S: int, memory_limit: float | None, buffers: int | None) -> None:
        n = cm.num_layers
        self.n, self.S = n, S
        self.pc = cm.forward_prefix + cm.backward_prefix                       # prefix compute
        self.speed = [cm.cluster.speed(s) for s in range(S)]
        inp = np.concatenate([[float(cm.profile.input_bytes)], cm.cuts, [0.0]])
        # memory of [i, j) on stage s is g_s[j] - h_s[i] (nondecreasing in j): last feasible j per i
        self.jmem = []
        for s in range(S):
            k = S - s                                 # PipeDream's NOAM for a straight pipeline
            v = k if buffers is None else min(k, buffers)
            lim = memory_limit if memory_limit is not None else cm.cluster.memory(s)
            g = (v + 1 + cm.state_factor) * cm.param_bytes_prefix + k * cm.activation_prefix
            h = (v + 1 + cm.state_factor) * cm.param_bytes_prefix + k * (cm.activation_prefix - inp)
            self.jmem.append(np.searchsorted(g, lim + h, side="right") - 1)
        # cut cost of boundary i (activation entering layer i) between worker s-1 and s
        self.cutc = np.zeros((S, n + 1))
        for s in range(1, S):
            lv = cm.cluster.link(s - 1, s)
            self.cutc[s, 1:n] = lv.latency + cm.cuts / (cm.compression_ratio * lv.transfer_bandwidth)

    def candidates(self) -> np.ndarray:
        """Every value the optimum can take: a range's compute on some speed, or a cut's cost."""
        d = self.pc[None, :] - self.pc[:, None]
        tri = d[np.triu_indices(self.n + 1, 1)]
        vals = [tri / sp for sp in sorted(set(self.speed))]
        return np.unique(np.concatenate([*vals, self.cutc.ravel()]))

    def reach(self, X: float) -> list[np.ndarray] | None:
        """Per stage, the boundaries reachable with every cost <= X (each start reaches an interval of
        ends, merged with a difference array); None when ``n`` is not reached."""
        n = self.n
        reach = np.zeros(n + 1, dtype=bool)
        reach[0] = True
        hist = [reach]
        tol = X * (1 + 1e-12)
        for s in range(self.S):
            src = reach & (self.cutc[s] <= tol)
            src[n] = False
            jc = np.searchsorted(self.pc, self.pc + tol * self.speed[s], side="right") - 1
            J = np.minimum(jc, self.jmem[s])
            ok = src & (J > np.arange(n + 1))
            diff = np.zeros(n + 2)
            i = np.flatnonzero(ok)
            np.add.at(diff, i + 1, 1)
            np.add.at(diff, J[i] + 1, -1)
            reach = np.cumsum(diff)[: n + 1] > 0
            hist.append(reach)
            if not reach.any():
                return None
        return hist if reach[n] else None

    def path(self, X: float) -> list[int]:
        """Boundaries of a partition with every cost <= X (X must be feasible)."""
        hist = self.reach(X)
        assert hist is not None
        n, tol = self.n, X * (1 + 1e-12)
        bounds, j = [], n
        for s in range(self.S - 1, -1, -1):
            jc = np.searchsorted(self.pc, self.pc + tol * self.speed[s], side="right") - 1
            J = np.minimum(jc, self.jmem[s])
            idx = np.arange(n + 1)
            ok = hist[s] & (self.cutc[s] <= tol) & (idx < j) & (J >= j)
            i = int(np.flatnonzero(ok)[-1])
            if s > 0:
                bounds.append(i)
            j = i
        return bounds[::-1]


def solve(cm: CostModel, *, stages: int | None = None, memory_limit: float | None = None,
          buffers: int | None = None) -> tuple[float, list[int]]:
    """``(bottleneck seconds, boundaries)`` of the optimal ``stages``-way straight partition."""
    n, W = cm.num_layers, cm.cluster.num_workers
    S = W if stages is None else stages
    if not (1 <= S <= W):
        raise ValueError(f"stages={S} must be in 1..{W} (the cluster's workers)")
    if S > n:
        raise ValueError(f"{S} stages but the model has {n} layers; use at most {n} stages (fewer workers)")
    prob = _Problem(cm, S, memory_limit, buffers)
    cand = prob.candidates()
    lo, hi = 0, len(cand) - 1
    if prob.reach(float(cand[hi])) is None:
        raise ValueError(f"no {S}-stage partition of {cm.profile.model or 'this model'} fits in memory on "
                         f"{cm.cluster.name}; use more workers, a smaller batch, or raise memory_limit")
    while lo < hi:  # smallest feasible candidate
        mid = (lo + hi) // 2
        if prob.reach(float(cand[mid])) is not None:
            hi = mid
        else:
            lo = mid + 1
    X = float(cand[lo])
    return X, prob.path(X)


def partition_prefix_sum(cm: CostModel, *, stages: int | None = None, memory_limit: float | None = None,
                         buffers: int | None = 2, workers: Sequence[int] | None = None) -> Plan:
    """Lv et al.'s balanced straight pipeline, with ``buffers`` weight versions at most (None: unbounded)."""
    from dataclasses import replace

    cm2 = replace(cm, cluster=cm.cluster.subset(workers)) if workers is not None else cm
    X, bounds = solve(cm2, stages=stages, memory_limit=memory_limit, buffers=buffers)
    S = len(bounds) + 1
    in_flight = [metrics.in_flight([1] * S, s) for s in range(S)]
    plan = build_plan(cm2, bounds, [1] * S, method="prefix-sum", run=Pipelining(in_flight=in_flight),
                      notes={"bottleneck_s": X, "buffers": buffers})
    if buffers is not None:
        st = tuple(replace(s, versions=min(s.in_flight, buffers)) for s in plan.stages)
        plan = plan.with_predictions(stages=st)
    if workers is not None:
        plan = plan.with_predictions(notes={**plan.notes, "workers": sorted(set(workers))})
    return plan
