"""Turn a partition (stage boundaries and replica counts) into a Plan with predictions.

Every partitioner ends here, so every plan's ``time_per_minibatch``, per-stage ``time_s``,
``in_flight``, ``versions`` and memory come from the same cost model
(:class:`pipelab.sim.costs.CostModel`) and the same steady-state formula:

* ``"async"`` (PipeDream, Lv et al.'s buffered pipelines; no flush): stages and cuts work
  concurrently (compute and communication overlap, PipeDream §3.1), so one minibatch leaves the
  pipeline every ``max(max_s T_s / r_s, max_cut c)`` seconds, where ``T_s`` is a replica's time for
  one minibatch (compute with the DDP-style overlapped all-reduce tail) and ``c`` a cut's transfer
  time (latency + bytes / bandwidth, activations forward and gradients back on a full-duplex link).
* ``"flush"`` (GPipe): ``M`` microbatches fill and drain the pipeline each minibatch, so a minibatch
  takes ``(M + P - 1)`` times the slowest per-microbatch step (GPipe §2.2's bubble), plus the
  all-reduce tail of replicated stages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pipelab.partition.plan import Plan, Stage
from pipelab.sim.costs import CostModel


def in_flight_pipedream(num_workers: int, starts: Sequence[int], replicas: Sequence[int]) -> list[int]:
    """PipeDream's NOAM per stage: ``ceil(workers from this stage on / replicas of this stage)``.

    Stage 0 gets ``ceil(num_workers / r_0)`` (PipeDream §3.2, "number of optimal active
    minibatches"); a later stage has fewer minibatches between its forward and backward.
    """
    out, used = [], 0
    for r in replicas:
        out.append(math.ceil((num_workers - used) / r))
        used += r
    return out


def cut_time_s(cm: CostModel, boundary: int, src: int, dst: int, microbatches: int = 1) -> float:
    """Transfer time of the activation crossing the cut after layer ``boundary`` from ``src`` to ``dst``."""
    return cm.transfer_s(cm.cut_bytes(boundary, microbatches), src, dst)


def build_plan(cm: CostModel, bounds: Sequence[int], replicas: Sequence[int], *, method: str,
               schedule: str = "async", microbatches: int = 1, versions: str = "in_flight",
               ranks_of: Sequence[int] | None = None, notes: dict[str, Any] | None = None,
               dp_time: float | None = None, in_flight: Sequence[int] | None = None,
               cut_links: Sequence[tuple[int, int]] | None = None, cut_share: int = 1) -> Plan:
    """A Plan for stages cut at ``bounds`` (layer indices) with ``replicas``, with every prediction.

    ``ranks_of`` maps plan rank -> cluster worker (default identity); ``dp_time`` is the data-parallel
    baseline's time per minibatch for ``speedup_over_dp`` (computed when omitted). A cut is priced on
    the link from the last worker of one stage to the first of the next, or on ``cut_links[s]``
    (cluster workers) divided by ``cut_share`` when that many disjoint copies of the link carry the
    minibatches in turn (a pipeline replicated over ``cut_share`` servers).
    """
    prof, n = cm.profile, cm.num_layers
    cuts = [0, *bounds, n]
    W = sum(replicas)
    phys = list(ranks_of) if ranks_of is not None else list(range(W))
    if len(phys) != W:
        raise ValueError(f"ranks_of has {len(phys)} workers but the replicas add up to {W}")
    P = len(replicas)
    if in_flight is None:
        in_flight = (in_flight_pipedream(W, cuts[:-1], replicas) if schedule == "async"
                     else [microbatches] * P)
    stages, terms, mem_per_worker = [], [], [0] * W
    rank = 0
    for s in range(P):
        a, b, r = cuts[s], cuts[s + 1], replicas[s]
        ws = phys[rank:rank + r]
        t_rep = cm.replica_time_s(a, b, ws, microbatches=1)
        nver = in_flight[s] if versions == "in_flight" else 1
        mem = cm.memory_bytes(a, b, versions=nver, in_flight=in_flight[s], microbatches=microbatches)
        if schedule == "async":
            term = t_rep / r
        else:  # flush: per-microbatch compute; all-reduce tail paid once per minibatch
            speed = min(cm.cluster.speed(w) for w in ws)
            comp = float(cm.pf[b] - cm.pf[a] + cm.pb[b] - cm.pb[a]) / speed
            term = comp / microbatches / r
        terms.append(term)
        stages.append(Stage(index=s, start=a, end=b, replicas=r, ranks=tuple(range(rank, rank + r)),
                            in_flight=in_flight[s], versions=nver, time_s=t_rep, memory_bytes=mem["total"]))
        for k in range(rank, rank + r):
            mem_per_worker[k] = mem["total"]
        rank += r
    # cut terms: last worker of stage s sends to first worker of stage s+1 (contiguous ranks)
    cut_terms, first = [], 0
    for s in range(P - 1):
        first += replicas[s]
        src, dst = cut_links[s] if cut_links is not None else (phys[first - 1], phys[first])
        cut_terms.append(cut_time_s(cm, cuts[s + 1] - 1, src, dst,
                                    microbatches if schedule == "flush" else 1) / cut_share)
    if schedule == "async":
        time = max([*terms, *cut_terms])
    else:
        step = max([*terms, *cut_terms])
        tails = [st.time_s / st.replicas - terms[i] * microbatches for i, st in enumerate(stages)]
        time = (microbatches + P - 1) * step + max(0.0, max(tails))
    if dp_time is None:
        from pipelab.partition.dp import dp_time_s

        dp_time = dp_time_s(cm, phys)
    return Plan(stages=tuple(stages), num_layers=n, method=method, profile_fingerprint=prof.fingerprint(),
                model=prof.model, cluster=cm.cluster.name, batch_size=prof.batch_size,
                time_per_minibatch=time, speedup_over_dp=dp_time / time if time > 0 else float("inf"),
                memory_per_worker=tuple(mem_per_worker),
                notes={"schedule": schedule, "microbatches": microbatches,
                       "stage_terms_s": terms, "cut_terms_s": cut_terms,
                       "compression_ratio": cm.compression_ratio, "optimizer": cm.optimizer,
                       **({"workers": phys} if ranks_of is not None else {}), **(notes or {})})


def check_memory(plan: Plan, cm: CostModel, memory_limit: float | None, ranks_of: Sequence[int] | None = None) -> None:
    """Raise ``ValueError`` naming the first worker whose predicted memory exceeds its limit."""
    phys = list(ranks_of) if ranks_of is not None else list(range(plan.num_workers))
    for r, m in enumerate(plan.memory_per_worker):
        lim = memory_limit if memory_limit is not None else cm.cluster.memory(phys[r])
        if m > lim:
            st = plan.stage_of_rank(r)
            raise ValueError(f"no plan fits in memory: stage {st.index} (layers [{st.start}, {st.end})) needs "
                             f"{m / 2**30:.2f} GiB per worker but the limit is {lim / 2**30:.2f} GiB; "
                             f"use more workers, microbatches, a smaller batch, or raise memory_limit")
