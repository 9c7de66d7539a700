"""PipeDream's optimizer (SOSP'19 §3.1): contiguous layer ranges with replica counts, by dynamic programming.

One DP over ``(layers done, workers used)``, each stage priced on the contiguous ranks it gets::

    A[j, w + m] = min_i max( A[i, w], T_{w,m}[i, j] / m, port_{w,m}(i, j) )

Exact for that objective over its plan space; each layout's boundaries are then refined on the full
steady state, and the layout with the best prediction wins. docs/partitioning.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pipelab.costs import CostModel
from pipelab.costs.prices import span
from pipelab.partition.dp import partition_dp
from pipelab.partition.plan import Plan
from pipelab.partition.predict import block_workers, build_plan, refine_bounds, search_objective
from pipelab.partition.prefix_sum import solve as straight_solve


def solve(cm: CostModel, *, straight: bool = False, memory_limit: float | None = None,
          max_stages: int | None = None, block: int | None = None,
          straight_bounds: Sequence[int] | None = None) -> tuple[float, list[int], list[int]]:
    """The DP itself: ``(time per minibatch, stage boundaries, replicas per stage)``.

    ``straight_bounds``: the best straight pipeline's boundaries, an upper bound for the search
    (computed when not given). ``block``: a pipeline over one block's workers (e.g. a server)
    replicated in every block, as PipeDream's hierarchical plans; replicas returned are per block.
    """
    search = _Search(cm, straight=straight, memory_limit=memory_limit, block=block)
    search.band(search.upper_bound(straight_bounds))
    search.fill()
    return search.backtrack(max_stages)


class _Search:
    """The DP's table ``A[j, w]`` (best time of layers ``[0, j)`` on the first ``w`` workers), filled
    stage by stage; ``par_i``/``par_w`` record each cell's last stage for the backtrack."""

    def __init__(self, cm: CostModel, *, straight: bool, memory_limit: float | None,
                 block: int | None) -> None:
        n = cm.num_layers
        Wall = cm.cluster.num_workers
        W = Wall if block is None else block
        if block is not None and (block < 1 or Wall % block):
            raise ValueError(f"block={block} must divide the {Wall} workers")
        if straight and W > n:
            raise ValueError(f"a straight pipeline on {W} workers needs at least {W} layers, the model has "
                             f"{n}; use fewer workers or straight=False")
        self.cm, self.n, self.W, self.copies = cm, n, W, Wall // W
        self.block, self.straight, self.memory_limit = block, straight, memory_limit
        self.A = np.full((n + 1, W + 1), np.inf)
        self.A[0, 0] = 0.0
        self.par_i = np.full((n + 1, W + 1), -1, dtype=np.int64)
        self.par_w = np.full((n + 1, W + 1), -1, dtype=np.int64)
        self.speeds = [min(cm.cluster.speed(x) for x in self.phys(w, 1)) for w in range(W)]
        self.mems = [min(cm.cluster.memory(x) for x in self.phys(w, 1)) for w in range(W)]
        # transfer seconds of the activation entering layer i over a link of each level
        self.cut_bytes = np.concatenate([[0.0], np.floor(cm.cuts), [0.0]])
        self.cut_s_by_level = [self._cut_seconds(k) for k in range(len(cm.cluster.levels))]
        # the link level between worker w - 1 and w (-1 at the pipeline's two ends)
        self.link_level = [cm.cluster.level_between(w - 1, w) if 0 < w < W else -1 for w in range(W + 1)]
        # memory of [i, j) with k in flight = g_k[j] - h_k[i]; feasible j form a prefix for each i
        self.bytes_in = np.concatenate([[float(cm.profile.input_bytes)], cm.cuts, [0.0]])
        self.layer_index = np.arange(n + 1)
        self.cache_limit = max(4, int(3e8 // (8 * (n + 1) ** 2)))   # cached T matrices (about 300 MB at most)
        # inf on the rows j where no stage may end (a non-tensor value crosses the cut before layer j)
        legal = np.array(cm.profile.legal_starts())
        self.illegal_end = None if legal.all() else np.where(legal, 0.0, np.inf)
        self.cache: dict[tuple[float, float, float, float], np.ndarray] = {}
        self.penalties: dict[tuple[int, float], np.ndarray | None] = {}
        # row chunks of j so that only the triangle i < j is scanned
        step = max(32, (n + 1) // 8)
        self.chunks = [(a, min(a + step, n + 1)) for a in range(1, n + 1, step)]
        self.buf = np.empty((n + 1, n + 1))
        self.ilo = np.zeros(W + 1, dtype=np.int64)
        self.ihi = np.full(W + 1, n, dtype=np.int64)

    def phys(self, w: int, m: int) -> list[int]:
        """Cluster workers of inner workers ``[w, w+m)`` (every block's copy with ``block``)."""
        return list(range(w, w + m)) if self.block is None else block_workers(self.cm, self.W, w, m)

    def _cut_seconds(self, k: int) -> np.ndarray:
        """Seconds to send the activation entering each layer over a link of level ``k`` (0 at the ends)."""
        lv = self.cm.cluster.levels[k]
        x = lv.latency + self.cut_bytes / self.cm.compression_ratio / lv.transfer_bandwidth
        x[0] = x[self.n] = 0.0
        return x

    def upper_bound(self, straight_bounds: Sequence[int] | None) -> float:
        """A time some plan of this DP's space reaches: the one-stage plan's or the best straight one's."""
        cm, n, W = self.cm, self.n, self.W
        U = math.inf
        if not self.straight or W == 1:
            mem1 = ((2 + cm.state_factor) * span(cm.param_bytes_prefix, 0, n)
                    + span(cm.activation_prefix, 0, n) + self.bytes_in[0])
            lim1 = self.memory_limit if self.memory_limit is not None else min(self.mems)
            if mem1 <= lim1:
                U = cm.replica_time_s(0, n, self.phys(0, W)) / (W * self.copies) * (1 + 1e-9)
        if self.block is None and 1 < W <= n:
            sbounds = straight_bounds
            if sbounds is None:
                with contextlib.suppress(ValueError):
                    sbounds = straight_solve(cm, memory_limit=self.memory_limit, buffers=None)[1]
            if sbounds is not None:
                comp, port = search_objective(cm, sbounds, [1] * W)
                U = min(U, max(*comp, *port) * (1 + 1e-9))
        return U

    def band(self, U: float) -> None:
        """Exact pruning: band ``i`` per ``w`` to where ``[0, i)`` and ``[i, n)`` can finish within ``U``
        at the fastest speed with perfect balance."""
        if not math.isfinite(U):
            return
        pc = self.cm.forward_prefix + self.cm.backward_prefix
        n, W, smax = self.n, self.W, max(self.speeds)
        for w in range(W + 1):
            cap_rest = U * (W - w) * self.copies * smax
            self.ilo[w] = int(np.flatnonzero(pc[n] - pc <= cap_rest * (1 + 1e-12))[0])
            self.ihi[w] = int(np.flatnonzero(pc <= U * w * self.copies * smax * (1 + 1e-12))[-1])

    def fill(self) -> None:
        """Relax every stage ``[i, j)`` on workers ``[w, w+m)`` from every reached ``(i, w)``."""
        for w in range(self.W):
            base = self.A[:, w].copy()
            rows = np.flatnonzero(np.isfinite(base))
            if rows.size == 0:
                continue
            for m in range(1, self.W - w + 1):
                if self.straight and m > 1:
                    break
                self._relax(w, m, base, int(rows.min()))

    def _stage_times(self, w: int, m: int) -> np.ndarray:
        """``TT[j, i]``: a replica's minibatch time of layers ``[i, j)`` on workers ``[w, w+m)`` (cached)."""
        ws = self.phys(w, m)
        cm = self.cm
        key = (min(self.speeds[w:w + m]), *cm.allreduce_coeffs(ws), cm.allreduce_latency_steps(ws))
        TT = self.cache.get(key)
        if TT is None:
            if len(self.cache) >= self.cache_limit:
                self.cache.pop(next(iter(self.cache)))
            TT = self.cache[key] = cm.replica_time_matrix(*key, transpose=True)
        return TT

    def _memory_penalty(self, w: int, m: int) -> np.ndarray | None:
        """``inf`` where stage ``[i, j)`` on workers ``[w, w+m)`` does not fit (None: every stage fits)."""
        cm = self.cm
        k = math.ceil((self.W - w) / m)  # NOAM at this stage = weight versions stashed
        lim = float(self.memory_limit if self.memory_limit is not None else min(self.mems[w:w + m]))
        pkey = (k, lim)
        if pkey not in self.penalties:
            weights = (k + 1 + cm.state_factor) * cm.param_bytes_prefix
            gk = weights + k * cm.activation_prefix
            hk = weights + k * (cm.activation_prefix - self.bytes_in)
            jmax = np.searchsorted(gk, lim + hk, side="right") - 1   # last feasible j per i
            self.penalties[pkey] = (None if np.all(jmax >= self.n)
                                    else np.where(self.layer_index[:, None] > jmax[None, :],   # [j, i]
                                                  np.inf, 0.0))
        return self.penalties[pkey]

    def _relax(self, w: int, m: int, base: np.ndarray, lo: int) -> None:
        TT = self._stage_times(w, m)
        pen = self._memory_penalty(w, m)
        bm = base * (m * self.copies)
        # the stage's port term (CostModel.stage_port_s), times m * copies like the T matrix
        kin, kout = self.link_level[w], self.link_level[w + m]
        ws_in = range(w, w + m)
        tin = self.cut_s_by_level[kin] * (self.cm.port_share(ws_in, kin) * m) if kin >= 0 else None
        tout = self.cut_s_by_level[kout] * (self.cm.port_share(ws_in, kout) * m) if kout >= 0 else None
        c0, c1 = max(lo, int(self.ilo[w])), int(self.ihi[w]) + 1                # columns i in [c0, c1)
        r0, r1 = max(int(self.ilo[w + m]), c0 + 1), int(self.ihi[w + m]) + 1    # rows j in [r0, r1)
        if c0 >= c1 or r0 >= r1:
            return
        A = self.A
        for a, b in self.chunks:
            a2, b2 = max(a, r0), min(b, r1)
            if a2 >= b2:
                continue
            e = min(b2 - 1, c1)
            if e <= c0:
                continue
            blk = self.buf[a2:b2, c0:e]
            np.maximum(TT[a2:b2, c0:e], bm[None, c0:e], out=blk)
            if tin is not None and tout is not None:
                if kin == kout:
                    np.maximum(blk, tout[a2:b2, None] + tin[None, c0:e], out=blk)
                else:
                    np.maximum(blk, np.maximum(tout[a2:b2, None], tin[None, c0:e]), out=blk)
            elif tin is not None:
                np.maximum(blk, tin[None, c0:e], out=blk)
            elif tout is not None:
                np.maximum(blk, tout[a2:b2, None], out=blk)
            if pen is not None:
                blk += pen[a2:b2, c0:e]
            if self.illegal_end is not None:
                blk += self.illegal_end[a2:b2, None]
            arg = blk.argmin(axis=1)
            best = blk[np.arange(b2 - a2), arg] / (m * self.copies)
            better = best < A[a2:b2, w + m]
            if better.any():
                js = np.flatnonzero(better)
                A[a2 + js, w + m] = best[js]
                self.par_i[a2 + js, w + m] = c0 + arg[js]
                self.par_w[a2 + js, w + m] = w

    def backtrack(self, max_stages: int | None) -> tuple[float, list[int], list[int]]:
        """``(time per minibatch, boundaries, replicas per stage)`` of the best full plan."""
        n, W = self.n, self.W
        total = float(self.A[n, W])
        if not math.isfinite(total):
            lim = self.memory_limit if self.memory_limit is not None else min(self.mems)
            model = self.cm.profile.model or "this model"
            legal = "" if self.illegal_end is None else (
                f" at the {int(np.isfinite(self.illegal_end[1:n]).sum())} legal cuts of {n - 1} (the others "
                "carry a value that is not a tensor, Profile.blocked_cuts)")
            raise ValueError(f"no pipedream plan of {model} fits in memory on {self.cm.cluster.name} (limit "
                             f"{lim / 2**30:.2f} GiB per worker){legal}; use more workers, a smaller "
                             "batch, or raise memory_limit")
        bounds, reps = [], []
        j, w = n, W
        while j > 0:
            i, pw = int(self.par_i[j, w]), int(self.par_w[j, w])
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
                        workers: Sequence[int] | None = None, hierarchical: bool = True) -> Plan:
    """PipeDream's plan: the fastest predicted of the DP's layouts (flat, per block of each inner level
    with ``hierarchical``, straight) and data parallelism. ``workers``: a regular subset of the
    cluster; ``straight``: one worker per stage."""
    cm2 = replace(cm, cluster=cm.cluster.subset(workers)) if workers is not None else cm
    Wall = cm2.cluster.num_workers
    # the best straight pipeline, once: the flat searches' bound and the straight refinement's second start
    sbounds: list[int] | None = None
    if 1 < Wall <= cm2.num_layers:
        with contextlib.suppress(ValueError):
            sbounds = list(straight_solve(cm2, memory_limit=memory_limit, buffers=None)[1])
    best: Plan | None = None
    errors = []
    for block, strt in _searches(cm2, straight, hierarchical):
        try:
            total, bounds, reps = solve(cm2, straight=strt, memory_limit=memory_limit, block=block,
                                        straight_bounds=sbounds)
        except ValueError as exc:
            errors.append(exc)
            continue
        notes: dict[str, object] = {"dp_objective_s": total, "straight": straight, "dp_bounds": bounds}
        if block is None:
            second = sbounds if strt and len(reps) == Wall else None
            plan = _flat_plan(cm2, bounds, reps, notes, second, memory_limit)
        else:
            plan = _block_plan(cm2, bounds, reps, notes, block, memory_limit)
        # the DP's objective is stage-additive; pick the plan whose full steady state is fastest
        if best is None or plan.time_per_minibatch < best.time_per_minibatch * (1 - 1e-12):
            best = plan
    if best is None:
        raise errors[0]
    if not straight and len(best.stages) > 1:
        best = _or_data_parallel(cm2, best, memory_limit)
    if workers is None:
        return best
    ws = sorted(set(workers))
    mapped = [ws[r] for r in best.notes.get("workers", range(Wall))]
    return best.with_predictions(notes={**best.notes, "workers": mapped})


def _searches(cm: CostModel, straight: bool, hierarchical: bool) -> list[tuple[int | None, bool]]:
    """The (block, straight) searches to run: flat, per block of each inner level, and straight (in the
    flat space too, but its stage-additive objective cannot see shared ports)."""
    cl = cm.cluster
    Wall = cl.num_workers
    blocks: list[int | None] = [None]
    if hierarchical and not straight:
        blocks += sorted({cl.block_size(k) for k in range(len(cl.levels) - 1)} - {1, Wall})
    searches: list[tuple[int | None, bool]] = [(b, straight) for b in blocks]
    if not straight and 1 < Wall <= cm.num_layers:
        searches.append((None, True))
    return searches


def _flat_plan(cm: CostModel, bounds: list[int], reps: list[int], notes: dict[str, object],
               second: list[int] | None, memory_limit: float | None) -> Plan:
    """The flat DP's plan, its bounds refined; ``second``: another start for a straight pipeline."""
    stage_ws, w = [], 0
    for m in reps:
        stage_ws.append(list(range(w, w + m)))
        w += m
    # a straight pipeline's DP optimum ties with others: the prefix-sum optimum is a second start
    starts = [list(bounds)]
    if second is not None and second != starts[0]:
        starts.append(second)
    return min((build_plan(cm, refine_bounds(cm, b, stage_ws, memory_limit=memory_limit), reps,
                           method="pipedream", notes=notes) for b in starts),
               key=lambda p: p.time_per_minibatch)


def _block_plan(cm: CostModel, bounds: list[int], reps: list[int], notes: dict[str, object], block: int,
                memory_limit: float | None) -> Plan:
    """A pipeline over ``block`` workers replicated in every block, its bounds refined."""
    copies = cm.cluster.num_workers // block
    ranks_of: list[int] = []
    stage_ws, w = [], 0
    for m in reps:
        stage_ws.append(block_workers(cm, block, w, m))
        ranks_of += stage_ws[-1]
        w += m
    bounds = refine_bounds(cm, bounds, stage_ws, memory_limit=memory_limit)
    notes["layout"] = f"pipeline over {block} workers replicated in {copies} blocks"
    return build_plan(cm, bounds, [m * copies for m in reps], method="pipedream",
                      ranks_of=ranks_of, block=block, notes=notes)


def _or_data_parallel(cm: CostModel, best: Plan, memory_limit: float | None) -> Plan:
    """``best``, or one stage on every worker where data parallelism is predicted faster."""
    try:
        dp = partition_dp(cm, memory_limit=memory_limit)
    except ValueError:
        return best
    if dp.time_per_minibatch < best.time_per_minibatch * (1 - 1e-12):
        return build_plan(cm, [], [cm.cluster.num_workers], method="pipedream",
                          notes={"dp_objective_s": dp.time_per_minibatch, "straight": False})
    return best
