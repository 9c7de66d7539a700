"""Turn a partition (stage boundaries and replica counts) into a Plan with predictions.

Every partitioner ends here, so every plan's predictions come from the one cost model and the same
formula: ``"async"`` is :meth:`CostModel.steady_state`, ``"flush"`` GPipe's fill-drain as two flow
shops. The searches minimise a stage-additive form of the same terms (:func:`search_objective`).
docs/partitioning.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipelab.costs import CostModel
from pipelab.costs.prices import span
from pipelab.metrics import in_flight
from pipelab.partition.plan import Plan, Stage


def in_flight_pipedream(replicas: Sequence[int]) -> list[int]:
    """PipeDream's NOAM per stage (:func:`pipelab.metrics.in_flight`, per replica)."""
    return [in_flight(replicas, s) for s in range(len(replicas))]


def block_workers(cm: CostModel, block: int, w: int, m: int) -> list[int]:
    """Cluster workers of inner workers ``[w, w+m)`` in every copy of a ``block``-worker block, ordered
    so that replica ``k`` of every stage lies in block ``k % copies`` (docs/partitioning.md)."""
    return [c * block + x for x in range(w, w + m) for c in range(cm.cluster.num_workers // block)]


def dp_time_s(cm: CostModel, workers: Sequence[int]) -> float:
    """Seconds per minibatch of plain data parallelism over ``workers``."""
    return cm.replica_time_s(0, cm.num_layers, list(workers)) / len(workers)


def search_objective(cm: CostModel, bounds: Sequence[int], replicas: Sequence[int],
                     block: int | None = None) -> tuple[list[float], list[float]]:
    """The DP's per-stage terms of a plan on contiguous ranks: ``(T_s / r_s, port term_s)``; with
    ``block``, ``replicas`` are per block (:func:`block_workers`). The DP minimises their max."""
    n, Wall = cm.num_layers, cm.cluster.num_workers
    W = sum(replicas)
    copies = 1 if block is None else Wall // block
    cuts = [0, *bounds, n]
    comp, port, w = [], [], 0
    for s, m in enumerate(replicas):
        a, b = cuts[s], cuts[s + 1]
        phys = list(range(w, w + m)) if block is None else block_workers(cm, block, w, m)
        comp.append(cm.replica_time_s(a, b, phys) / (m * copies))
        port.append(cm.stage_port_s(a, b, range(w, w + m), w - 1 if s > 0 else None,
                                    w + m if w + m < W else None, copies=copies))
        w += m
    return comp, port


def refine_bounds(cm: CostModel, bounds: Sequence[int], stage_workers: Sequence[Sequence[int]], *,
                  memory_limit: float | None = None, max_evals: int = 400, window: int = 16) -> list[int]:
    """Move stage boundaries, one at a time (within ``window`` layers, at most ``max_evals`` tries), to
    where :meth:`CostModel.steady_state` is smallest; replicas, ranks and memory limits kept."""
    flights = in_flight_pipedream([len(w) for w in stage_workers])

    def fits(s: int, a: int, b: int) -> bool:
        lim = min(cm.cluster.memory(w) for w in stage_workers[s]) if memory_limit is None else memory_limit
        return cm.memory_bytes(a, b, versions=flights[s], in_flight=flights[s])["total"] <= lim

    def cost(c: list[int]) -> float:
        return cm.steady_state(list(zip(c[:-1], c[1:])), stage_workers, in_flight=flights).time_s

    return descend([0, *bounds, cm.num_layers], cost,
                   lambda c, s: fits(s - 1, c[s - 1], c[s]) and fits(s, c[s], c[s + 1]), max_evals, window)[1]


def descend(cuts: list[int], cost: Callable[[list[int]], float], fits: Callable[[list[int], int], bool],
            max_evals: int = 400, window: int = 16) -> tuple[float, list[int]]:
    """Coordinate descent of the inner ``cuts`` (``[0, ..., n]``) on ``cost``: each cut tries every
    position within ``window`` of it where ``fits(trial, moved cut)``; ``(cost, inner cuts)``."""
    cur, best = cuts, cost(cuts)
    evals, improved = 1, True
    while improved and evals < max_evals:
        improved = False
        for s in range(1, len(cur) - 1):
            for b in range(max(cur[s - 1] + 1, cur[s] - window), min(cur[s + 1] - 1, cur[s] + window) + 1):
                if b == cur[s] or evals >= max_evals:
                    continue
                trial = [*cur[:s], b, *cur[s + 1:]]
                if not fits(trial, s):
                    continue
                t = cost(trial)
                evals += 1
                if t < best * (1 - 1e-9):
                    best, cur, improved = t, trial, True
    return best, cur[1:-1]


@dataclass(frozen=True)
class Pipelining:
    """How a plan's stages run: ``"async"`` (a version per minibatch in flight, ``in_flight`` default
    PipeDream's) or ``"flush"`` of ``microbatches`` (one version, ``M`` in flight)."""

    schedule: Literal["async", "flush"] = "async"
    microbatches: int = 1
    in_flight: Sequence[int] | None = None


def build_plan(cm: CostModel, bounds: Sequence[int], replicas: Sequence[int], *, method: str,
               run: Pipelining = Pipelining(), ranks_of: Sequence[int] | None = None,
               block: int | None = None, notes: dict[str, Any] | None = None) -> Plan:
    """A Plan for stages cut at ``bounds`` (layer indices) with ``replicas``, with every prediction.

    ``ranks_of`` maps plan rank -> cluster worker (default identity). ``block``: the plan is a pipeline
    over one ``block`` of workers replicated in every block (``ranks_of`` from :func:`block_workers`);
    only ``notes["search_objective_s"]`` depends on it.
    """
    prof, n, M = cm.profile, cm.num_layers, run.microbatches
    cuts = [0, *bounds, n]
    W, P = sum(replicas), len(replicas)
    phys = list(ranks_of) if ranks_of is not None else list(range(W))
    if len(phys) != W:
        raise ValueError(f"ranks_of has {len(phys)} workers but the replicas add up to {W}")
    flush = run.schedule == "flush"
    flights = list(run.in_flight) if run.in_flight is not None else \
        [M] * P if flush else in_flight_pipedream(replicas)
    starts = [sum(replicas[:s]) for s in range(P)]
    stage_ws = [phys[starts[s]:starts[s] + replicas[s]] for s in range(P)]
    stages = []
    for s in range(P):
        a, b, r = cuts[s], cuts[s + 1], replicas[s]
        nver = 1 if flush else flights[s]
        mem = cm.memory_bytes(a, b, versions=nver, in_flight=flights[s], microbatches=M)
        stages.append(Stage(index=s, start=a, end=b, replicas=r, ranks=tuple(range(starts[s], starts[s] + r)),
                            in_flight=flights[s], versions=nver, memory_bytes=mem["total"],
                            time_s=cm.replica_time_s(a, b, stage_ws[s], microbatches=1)))
    if flush:   # per-microbatch compute; all-reduce tail paid once per minibatch
        terms = [(span(cm.forward_prefix, st.start, st.end) + span(cm.backward_prefix, st.start, st.end))
                 / min(cm.cluster.speed(w) for w in ws) / M / st.replicas for st, ws in zip(stages, stage_ws)]
    else:
        terms = [st.time_s / st.replicas for st in stages]
    # one transfer of each cut between the stages' first workers (uncontended), for reports
    cut_terms = [cm.transfer_s(cm.cut_bytes(cuts[s + 1] - 1, M if flush else 1), stage_ws[s][0],
                               stage_ws[s + 1][0]) for s in range(P - 1)]
    if flush:
        time, extra = _flush_time(cm, stages, stage_ws, terms, cut_terms, M)
    else:
        ss = cm.steady_state(list(zip(cuts[:-1], cuts[1:])), stage_ws, in_flight=flights)
        time = ss.time_s
        extra = {"bottleneck": ss.bottleneck, "port_max_s": max(ss.ports_s.values(), default=0.0),
                 "round_trip_s": list(ss.round_trip_s)}
        if ranks_of is None or block is not None:
            so_comp, so_port = search_objective(cm, bounds, replicas if block is None
                                                else [r * block // W for r in replicas], block)
            extra["search_objective_s"] = max([*so_comp, *so_port])
            extra["stage_port_terms_s"] = so_port
    dp_time = dp_time_s(cm, phys)
    return Plan(stages=tuple(stages), num_layers=n, method=method, profile_fingerprint=prof.fingerprint(),
                model=prof.model, cluster=cm.cluster.name, batch_size=prof.batch_size,
                time_per_minibatch=time, speedup_over_dp=dp_time / time if time > 0 else float("inf"),
                memory_per_worker=tuple(st.memory_bytes for st in stages for _ in range(st.replicas)),
                notes={"schedule": run.schedule, "microbatches": M,
                       "stage_terms_s": terms, "cut_terms_s": cut_terms, **extra,
                       "compression_ratio": cm.compression_ratio, "optimizer": cm.optimizer,
                       "allreduce_overlap": cm.allreduce_overlap,
                       **({"allreduce_bandwidth": cm.allreduce_bandwidth} if cm.allreduce_bandwidth else {}),
                       **({"workers": phys} if ranks_of is not None else {}), **(notes or {})})


def _flush_time(cm: CostModel, stages: Sequence[Stage], stage_ws: Sequence[Sequence[int]],
                terms: Sequence[float], cut_terms: Sequence[float], M: int) -> tuple[float, dict[str, Any]]:
    """GPipe's time per minibatch: two flow shops of ``M`` identical jobs (all forwards over the stages
    and cuts' links, then all backwards), each the sum of its machines' times plus ``M - 1`` times the
    slowest, then the later of the all-reduce tails and the updates."""
    fb = [cm.compute_s(st.start, st.end, min(ws, key=cm.cluster.speed), M)
          for st, ws in zip(stages, stage_ws)]
    fwd = [f / st.replicas for (f, _), st in zip(fb, stages)]
    bwd = [b / st.replicas for (_, b), st in zip(fb, stages)]
    fwd_span = sum(fwd) + sum(cut_terms) + (M - 1) * max([*fwd, *cut_terms])
    bwd_span = sum(bwd) + sum(cut_terms) + (M - 1) * max([*bwd, *cut_terms])
    tails = [st.time_s / st.replicas - terms[i] * M for i, st in enumerate(stages)]
    # each stage's update follows its last backward, which is earlier the later the stage
    lag, upd = 0.0, 0.0
    for s, (st, ws) in enumerate(zip(stages, stage_ws)):
        upd = max(upd, cm.update_s(st.start, st.end, ws[0]) - lag)
        lag += bwd[s] + (cut_terms[s] if s < len(stages) - 1 else 0.0)
    return fwd_span + bwd_span + max(0.0, max(tails), upd), {"forward_span_s": fwd_span,
                                                              "backward_span_s": bwd_span}


def check_memory(plan: Plan, cm: CostModel, memory_limit: float | None,
                 ranks_of: Sequence[int] | None = None) -> None:
    """Raise ``ValueError`` naming the first worker whose predicted memory exceeds its limit."""
    phys = list(ranks_of) if ranks_of is not None else list(range(plan.num_workers))
    for r, m in enumerate(plan.memory_per_worker):
        lim = memory_limit if memory_limit is not None else cm.cluster.memory(phys[r])
        if m > lim:
            st = plan.stage_of_rank(r)
            raise ValueError(f"no plan fits in memory: stage {st.index} (layers [{st.start}, {st.end})) "
                             f"needs {m / 2**30:.2f} GiB per worker but the limit is {lim / 2**30:.2f} GiB; "
                             "use more workers, microbatches, a smaller batch, or raise memory_limit")
