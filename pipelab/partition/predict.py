"""Turn a partition (stage boundaries and replica counts) into a Plan with predictions.

Every partitioner ends here, so every plan's ``time_per_minibatch``, per-stage ``time_s``,
``in_flight``, ``versions`` and memory come from the same cost model
(:class:`pipelab.costs.CostModel`) and the same steady-state formula:

* ``"async"`` (PipeDream, Lv et al.'s buffered pipelines; no flush): stages and transfers work
  concurrently (PipeDream §3.1), so one minibatch leaves the pipeline every
  :meth:`CostModel.steady_state` seconds: the largest of the slowest stage ``T_s / r_s`` (a
  replica's minibatch with the DDP-style overlapped all-reduce tail), the busiest network port
  (activations forward and gradients back of every cut, round-robin between replica sets), the
  round trip over the minibatches in flight (Little's law) and the 1F1B cycles through adjacent
  unreplicated stages.
* ``"flush"`` (GPipe): ``M`` microbatches fill and drain the pipeline each minibatch, all forwards
  then all backwards (GPipe §2.2). Each phase is a flow shop of ``M`` identical jobs over the
  stages and the cuts' links, which takes the sum of the per-microbatch times plus ``M - 1`` times
  the slowest; with equal stages and free transfers that is GPipe's ``(M + P - 1)`` steps.
  Plus the all-reduce tail of replicated stages.

The partitioners' searches minimise a stage-additive form of the same terms
(:func:`search_objective`): compute and each stage's own port load, which equals the steady state
when no port carries two stages' transfers and no round trip outlasts the minibatches in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipelab.costs import CostModel
from pipelab.metrics import in_flight
from pipelab.partition.plan import Plan, Stage


def in_flight_pipedream(replicas: Sequence[int]) -> list[int]:
    """PipeDream's NOAM per stage (:func:`pipelab.metrics.in_flight`, per replica)."""
    return [in_flight(replicas, s) for s in range(len(replicas))]


def cut_time_s(cm: CostModel, boundary: int, src: int, dst: int, microbatches: int = 1) -> float:
    """Transfer time of the activation crossing the cut after layer ``boundary`` from ``src`` to ``dst``."""
    return cm.transfer_s(cm.cut_bytes(boundary, microbatches), src, dst)


def block_workers(cm: CostModel, block: int, w: int, m: int) -> list[int]:
    """Cluster workers of inner workers ``[w, w+m)`` in every copy of a ``block``-worker block.

    Ordered block-minor (``x`` outer, copy ``c`` inner) so that replica ``k`` of every stage lies in
    block ``k % copies``: round-robin (minibatch ``t`` to replica ``t % r``) then keeps minibatch
    ``t`` inside block ``t % copies`` on every stage, as PipeDream's replicated pipelines do, and its
    cuts never leave the block.
    """
    return [c * block + x for x in range(w, w + m) for c in range(cm.cluster.num_workers // block)]


def dp_time_s(cm: CostModel, workers: Sequence[int]) -> float:
    """Seconds per minibatch of plain data parallelism over ``workers``."""
    ws = list(workers)
    return cm.replica_time_s(0, cm.num_layers, ws) / len(ws)


def search_objective(cm: CostModel, bounds: Sequence[int], replicas: Sequence[int],
                     block: int | None = None) -> tuple[list[float], list[float]]:
    """The DP's per-stage terms of a plan on contiguous ranks: ``(T_s / r_s, port term_s)``.

    ``T_s`` is one replica's minibatch (:meth:`CostModel.replica_time_s`), the port term is
    :meth:`CostModel.stage_port_s` with the neighbours' adjacent ranks. With ``block``, ``replicas``
    are per block: the pipeline lies on the first ``block`` workers and is replicated in every block
    (:func:`block_workers`). The DP minimises the max of both lists.
    """
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
    """Move stage boundaries, one at a time, to where :meth:`CostModel.steady_state` is smallest.

    The DP's objective is stage-additive and cannot see that a replicated stage's round-robin sends
    cross servers from ranks its neighbour does not touch, or that stages share a port; this
    coordinate descent on the full steady state (replicas and ranks fixed, memory respected) fixes
    the boundaries it placed by that objective. Each boundary tries every position between its
    neighbours (within ``window`` layers of where it is); at most ``max_evals`` evaluations.
    """
    n, P = cm.num_layers, len(stage_workers)
    cur = [0, *bounds, n]
    reps = [len(w) for w in stage_workers]
    flights = in_flight_pipedream(reps)

    def fits(s: int, a: int, b: int) -> bool:
        lim = (
            memory_limit if memory_limit is not None else min(cm.cluster.memory(w) for w in stage_workers[s])
        )
        return cm.memory_bytes(a, b, versions=flights[s], in_flight=flights[s])["total"] <= lim

    def cost(c: list[int]) -> float:
        return cm.steady_state(list(zip(c[:-1], c[1:])), stage_workers, in_flight=flights).time_s

    best = cost(cur)
    evals, improved = 1, True
    while improved and evals < max_evals:
        improved = False
        for s in range(1, P):
            lo, hi = max(cur[s - 1] + 1, cur[s] - window), min(cur[s + 1] - 1, cur[s] + window)
            for b in range(lo, hi + 1):
                if b == cur[s] or evals >= max_evals:
                    continue
                if not (fits(s - 1, cur[s - 1], b) and fits(s, b, cur[s + 1])):
                    continue
                trial = [*cur[:s], b, *cur[s + 1:]]
                t = cost(trial)
                evals += 1
                if t < best * (1 - 1e-9):
                    best, cur, improved = t, trial, True
    return cur[1:-1]


def build_plan(cm: CostModel, bounds: Sequence[int], replicas: Sequence[int], *, method: str,
               schedule: str = "async", microbatches: int = 1, versions: str = "in_flight",
               ranks_of: Sequence[int] | None = None, notes: dict[str, Any] | None = None,
               dp_time: float | None = None, in_flight: Sequence[int] | None = None,
               block: int | None = None) -> Plan:
    """A Plan for stages cut at ``bounds`` (layer indices) with ``replicas``, with every prediction.

    ``ranks_of`` maps plan rank -> cluster worker (default identity); ``dp_time`` is the data-parallel
    baseline's time per minibatch for ``speedup_over_dp`` (computed when omitted). ``block``: the plan
    is a pipeline over one ``block`` of workers replicated in every block (``replicas`` are totals,
    ``ranks_of`` from :func:`block_workers`); only the search objective
    noted in ``notes["search_objective_s"]`` depends on it.

    ``"async"``: ``time_per_minibatch`` is :meth:`CostModel.steady_state` (compute, ports under
    round-robin, round trip). ``"flush"``: all forwards then all backwards of ``M`` microbatches,
    each a flow shop over stages and cuts: ``sum + (M - 1) * max`` of the per-microbatch times,
    plus the all-reduce tail.
    """
    prof, n = cm.profile, cm.num_layers
    cuts = [0, *bounds, n]
    W = sum(replicas)
    phys = list(ranks_of) if ranks_of is not None else list(range(W))
    if len(phys) != W:
        raise ValueError(f"ranks_of has {len(phys)} workers but the replicas add up to {W}")
    P = len(replicas)
    if in_flight is None:
        in_flight = (in_flight_pipedream(replicas) if schedule == "async"
                     else [microbatches] * P)
    stages, terms, mem_per_worker, stage_ws = [], [], [0] * W, []
    rank = 0
    for s in range(P):
        a, b, r = cuts[s], cuts[s + 1], replicas[s]
        ws = phys[rank:rank + r]
        stage_ws.append(ws)
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
    # one transfer of each cut between the stages' first workers (uncontended), for reports
    cut_terms = [cut_time_s(cm, cuts[s + 1] - 1, stage_ws[s][0], stage_ws[s + 1][0],
                            microbatches if schedule == "flush" else 1) for s in range(P - 1)]
    extra: dict[str, Any] = {}
    if schedule == "async":
        ss = cm.steady_state(list(zip(cuts[:-1], cuts[1:])), stage_ws, in_flight=in_flight)
        time = ss.time_s
        extra = {"bottleneck": ss.bottleneck, "port_max_s": max(ss.ports_s.values(), default=0.0),
                 "round_trip_s": list(ss.round_trip_s)}
        if ranks_of is None or block is not None:
            so_comp, so_port = search_objective(cm, bounds, replicas if block is None
                                                else [r * block // W for r in replicas], block)
            extra["search_objective_s"] = max([*so_comp, *so_port])
            extra["stage_port_terms_s"] = so_port
    else:
        # GPipe's fill-drain is two flow shops of M identical jobs: all forwards (stages and the
        # cuts' links in turn), then all backwards; a flow shop of identical jobs finishes after
        # the sum of its machines' times plus (M - 1) times the slowest machine
        fwd, bwd = [], []
        for s in range(P):
            a, b = cuts[s], cuts[s + 1]
            f, bb = cm.compute_s(a, b, min(stage_ws[s], key=cm.cluster.speed), microbatches)
            fwd.append(f / replicas[s])
            bwd.append(bb / replicas[s])
        fwd_span = sum(fwd) + sum(cut_terms) + (microbatches - 1) * max([*fwd, *cut_terms])
        bwd_span = sum(bwd) + sum(cut_terms) + (microbatches - 1) * max([*bwd, *cut_terms])
        tails = [st.time_s / st.replicas - terms[i] * microbatches for i, st in enumerate(stages)]
        # each stage's optimizer step follows its last backward, which is earlier the later the
        # stage (the last microbatch's backward still has to cross the stages before it)
        lag, upd = 0.0, 0.0
        for s in range(P):
            upd = max(upd, cm.update_s(cuts[s], cuts[s + 1], stage_ws[s][0]) - lag)
            lag += bwd[s] + (cut_terms[s] if s < P - 1 else 0.0)
        time = fwd_span + bwd_span + max(0.0, max(tails), upd)
        extra = {"forward_span_s": fwd_span, "backward_span_s": bwd_span}
    if dp_time is None:

        dp_time = dp_time_s(cm, phys)
    return Plan(stages=tuple(stages), num_layers=n, method=method, profile_fingerprint=prof.fingerprint(),
                model=prof.model, cluster=cm.cluster.name, batch_size=prof.batch_size,
                time_per_minibatch=time, speedup_over_dp=dp_time / time if time > 0 else float("inf"),
                memory_per_worker=tuple(mem_per_worker),
                notes={"schedule": schedule, "microbatches": microbatches,
                       "stage_terms_s": terms, "cut_terms_s": cut_terms, **extra,
                       "compression_ratio": cm.compression_ratio, "optimizer": cm.optimizer,
                       "allreduce_overlap": cm.allreduce_overlap,
                       **({"allreduce_bandwidth": cm.allreduce_bandwidth} if cm.allreduce_bandwidth else {}),
                       **({"workers": phys} if ranks_of is not None else {}), **(notes or {})})


def check_memory(
    plan: Plan, cm: CostModel, memory_limit: float | None, ranks_of: Sequence[int] | None = None
) -> None:
    """Raise ``ValueError`` naming the first worker whose predicted memory exceeds its limit."""
    phys = list(ranks_of) if ranks_of is not None else list(range(plan.num_workers))
    for r, m in enumerate(plan.memory_per_worker):
        lim = memory_limit if memory_limit is not None else cm.cluster.memory(phys[r])
        if m > lim:
            st = plan.stage_of_rank(r)
            raise ValueError(
                f"no plan fits in memory: stage {st.index} (layers [{st.start}, {st.end})) needs "
                f"{m / 2**30:.2f} GiB per worker but the limit is {lim / 2**30:.2f} GiB; "
                f"use more workers, microbatches, a smaller batch, or raise memory_limit"
            )
