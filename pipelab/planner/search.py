"""The planner's search: candidates priced by closed-form bounds, simulated in order of their bound.

A candidate is skipped once a simulated one that fits is at least as fast as its bound and no larger
than its memory floor. Deterministic: candidates are ordered by (bound, key). docs/planner.md.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

import pipelab.methods as registry
from pipelab._display import html_pre, short
from pipelab.batching import default_microbatches, divisors
from pipelab.cluster import Cluster
from pipelab.costs import CostModel, compression_ratio_of
from pipelab.partition import partition
from pipelab.partition.balance import balance_by_time, uniform_cuts
from pipelab.partition.plan import Plan
from pipelab.planner.decide import NO_MARGIN, ONE_STAGE_ASYNC, ONE_STAGE_SYNC, Margin, decide, resolve_margin
from pipelab.profile.records import Layer, Profile
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.worker_view import stage_delays
from pipelab.sim.simulate import SimResult, simulate, virtual_plan
from pipelab.ties import across_stages

#: every registered method but the ablations (naive-async; buffered at K=2 is 2bw) and hetpipe
DEFAULT_METHODS = ("dp", "gpipe", "1f1b-flush", "interleaved-1f1b", "zb-h1", "pipedream", "2bw", "pipemare")
SPLITS = ("uniform", "balanced", "prefix-sum")   # straight pipelines' partitioners, at every stage count
COLUMNS = ("rank", "method", "synchronous", "partitioner", "config", "stages", "workers", "microbatches",
           "chunks", "recompute", "compression", "throughput", "time_per_minibatch_s", "bound_s",
           "peak_memory", "fits", "bubble_fraction", "versions", "delay", "staleness_risk", "pareto",
           "vs_default", "needs_vs_default", "within_error", "pick", "equivalent", "status")


@dataclass(frozen=True)
class Candidate:
    """One point of the search: a plan, a method and its knobs."""

    method: str
    partitioner: str
    plan: Plan
    microbatches: int
    chunks: int | None = None
    recompute: bool = False
    compression: str | None = None

    def key(self) -> tuple[Any, ...]:
        """A total order for ties (determinism)."""
        bounds = tuple((s.start, s.end, s.replicas) for s in self.plan.stages)
        return (self.method, self.partitioner, bounds, self.microbatches, self.chunks or 0, self.recompute,
                self.compression or "")

    def options(self) -> dict[str, Any]:
        """The keyword options of ``simulate``/``train`` for this candidate."""
        given = {"chunks": self.chunks, "compression": self.compression, "recompute": self.recompute or None}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True, repr=False)
class PlanTable:
    """The planner's answer: ``table`` (ranked DataFrame, see :data:`COLUMNS`) and what made each row."""

    table: pd.DataFrame
    candidates: tuple[Candidate, ...]
    profile: Profile = field(repr=False)
    cluster: Cluster = field(repr=False)
    memory_limit: tuple[int, ...] = ()
    optimizer: str = "sgd-momentum"
    allreduce_overlap: str = "ddp"
    default_row: int | None = None   # what torch or Megatron users get: 1F1B on a uniform layer split
    margin: Margin = 0.0             # the simulator's relative error, one or per method (plan())
    margin_source: str = NO_MARGIN   # where the margin came from (plan()), shown by describe()

    @property
    def default(self) -> pd.Series:
        """The default's row: 1F1B-flush on a uniform split over the most stages, ``M = P``."""
        if self.default_row is None:
            raise ValueError("the default (1f1b-flush on a uniform split) was not searched: add '1f1b-flush' "
                             "to methods")
        return self.table.iloc[list(self.table.index).index(self.default_row)]

    @property
    def pareto(self) -> pd.DataFrame:
        """The rows on the Pareto front of throughput against peak memory (among those that fit)."""
        return self.table[self.table["pareto"]].sort_values("peak_memory")

    @property
    def best(self) -> pd.Series:
        """The planner's pick (column ``pick``); raises when none fits."""
        return _first(self.table[self.table["pick"]])

    @property
    def fastest(self) -> pd.Series:
        """The fastest predicted candidate that fits (rank 1), whatever the margin; raises when none fits."""
        return _first(self.table[self.table["rank"] == 1])

    def candidate(self, row: int | None = None) -> Candidate:
        """The candidate of table index ``row`` (default: the best)."""
        return self.candidates[int(str(self.best.name)) if row is None else int(row)]

    def simulate(self, row: int | None = None, **kw: Any) -> SimResult:
        """Simulate the candidate of table index ``row`` (default: the best) again, trace included."""
        c = self.candidate(row)
        kw.setdefault("allreduce_overlap", self.allreduce_overlap)
        return _simulate(c, self.profile, self.cluster, self.optimizer, **kw)

    def train(self, row: int | None, model_fn: Callable[[], Any], data: Callable[[], Iterable[Any]],
              loss_fn: Callable[[Any, Any], Any], optimizer: Callable[[Any], Any], *, steps: int,
              **options: Any) -> Any:
        """Train the candidate of table index ``row`` (default: the best) with :func:`pipelab.train`;
        ``options`` go to ``train`` as well (``backend``, ``timeout``, ...)."""
        from pipelab.runtime.launch import train  # the planner itself never starts a process

        c = self.candidate(row)
        plan = virtual_plan(c.plan, self.profile, c.chunks) if c.chunks else c.plan
        return train(model_fn, plan, method=c.method, data=data, loss_fn=loss_fn, optimizer=optimizer,
                     steps=steps, microbatches=c.microbatches, **{**c.options(), **options})

    def __repr__(self) -> str:
        return short(f"PlanTable: {len(self.table)} candidates on {self.cluster.name}; the top 5:\n"
                     + self.describe(5))

    def _repr_html_(self) -> str:
        return html_pre(f"PlanTable: {len(self.table)} candidates on {self.cluster.name}\n" + self.describe())

    def describe(self, top: int = 10) -> str:
        """The top rows as text."""
        cols = ["rank", "method", "partitioner", "config", "microbatches", "chunks", "recompute",
                "compression", "throughput", "vs_default", "needs_vs_default", "within_error", "pick",
                "peak_memory", "fits", "bubble_fraction", "staleness_risk"]
        sim = self.table[self.table["status"] == "simulated"]
        head = sim.assign(_k=sim["rank"].where(sim["rank"] > 0, len(sim) + 1)).sort_values(
            ["_k", "throughput"], ascending=[True, False])
        t = head.head(top)[cols].copy()
        t["peak_memory"] = (t["peak_memory"] / 2**30).map("{:.2f} GiB".format)
        t["throughput"] = t["throughput"].map("{:.1f}".format)
        t["bubble_fraction"] = t["bubble_fraction"].map("{:.1%}".format)
        for c in ("vs_default", "needs_vs_default"):
            t[c] = t[c].map("{:.2f}x".format)
        m = self.margin
        shown = ", ".join(f"{k} {_shown(v)}" for k, v in m.items()) if isinstance(m, Mapping) else _shown(m)
        head_line = (f"simulator error (margin): {shown} ({self.margin_source})\n"
                     if self.margin_source != NO_MARGIN else f"simulator error (margin): {NO_MARGIN}\n")
        head_line += (f"throughput: simulated samples/s, minibatches of {self.profile.batch_size} split "
                      "into M microbatches (dp: one per replica); synchronous methods with their flush, "
                      "asynchronous ones in steady state\n")
        return head_line + t.to_string()


def _first(rows: pd.DataFrame) -> pd.Series:
    if rows.empty:
        raise ValueError("no candidate fits in memory: raise memory_limit, add workers, or allow "
                         "recomputation / compression")
    return rows.iloc[0]


def _shown(v: float | tuple[float, float]) -> str:
    """A margin entry for people: ``30%`` (either way) or ``+15%..+29%`` (a signed range)."""
    return f"{v[0]:+.0%}..{v[1]:+.0%}" if isinstance(v, tuple) else f"{v:.0%}"


def _recompute_profile(profile: Profile) -> Profile:
    """``profile`` as recomputation runs it: every backward re-runs its forward, one byte saved per layer."""
    layers = tuple(Layer(**{**asdict(ly), "bwd_s": ly.bwd_s + ly.fwd_s,
                            "bwd_fixed_s": ly.bwd_fixed_s + ly.fwd_fixed_s, "saved_bytes": 1})
                   for ly in profile.layers)
    return replace(profile, layers=layers)


def _simulate(c: Candidate, profile: Profile, cluster: Cluster, optimizer: str, **kw: Any) -> SimResult:
    """Simulate candidate ``c``: recomputation on a copy of the profile; dp with each of its ``M``
    microbatches (one per replica) ``1/M`` of the minibatch, as the runtime trains it."""
    opts: dict[str, Any] = {k: v for k, v in c.options().items() if k != "recompute"}
    prof = _recompute_profile(profile) if c.recompute else profile
    if registry.get(c.method).order == "dp":
        prof = prof.at_batch_size(max(1, profile.batch_size // c.microbatches))
    return simulate(c.plan, prof, cluster, c.method, microbatches=c.microbatches, optimizer=optimizer,
                    **opts, **kw)


def _stage_counts(workers: int, layers: int) -> list[int]:
    """2, 4, 8, ... up to the workers (and the workers themselves), at most one per layer."""
    out = [2 ** k for k in range(1, min(workers, layers).bit_length())]
    if 2 <= workers <= layers and workers not in out:
        out.append(workers)
    return out


def _plans(profile: Profile, cluster: Cluster, need: set[str], optimizer: str) -> list[tuple[str, Plan]]:
    """(partitioner, plan) pairs to try, deduplicated on their stages."""
    W, n, bs = cluster.num_workers, len(profile), profile.batch_size
    out: list[tuple[str, Plan]] = []
    seen: set[tuple[Any, ...]] = set()

    def add(name: str, plan: Plan) -> None:   # dp's plan stays apart from a one-stage pipeline plan
        k = (name == "dp",) + tuple((s.start, s.end, s.ranks) for s in plan.stages)
        if k not in seen:
            seen.add(k)
            out.append((name, plan))

    if "pipelined" in need:
        times = [ly.fwd_s + ly.bwd_s for ly in profile.layers]
        for S in _stage_counts(W, n):
            reps = [W // S] * S if W % S == 0 else [1] * S
            cuts = {"uniform": uniform_cuts(n, S),
                    "balanced": list(itertools.accumulate(balance_by_time(S, times)[:-1]))}
            with contextlib.suppress(ValueError, ScheduleError):
                ps = partition(profile, cluster, "prefix-sum", stages=S, optimizer=optimizer,
                               memory_limit=math.inf)
                cuts["prefix-sum"] = [st.start for st in ps.stages[1:]]
            for name in SPLITS:
                if name in cuts:
                    add(name, Plan.from_boundaries(n, cuts[name], reps, method=name, batch_size=bs))
        for straight in (False, True):
            with contextlib.suppress(ValueError, ScheduleError):
                add("pipedream" if not straight else "pipedream-straight",
                    partition(profile, cluster, "pipedream", straight=straight, optimizer=optimizer,
                              memory_limit=math.inf))
    if "dp" in need:
        add("dp", Plan.from_boundaries(n, [], [W], method="dp", batch_size=bs))
    if "hetpipe" in need:
        with contextlib.suppress(ValueError, ScheduleError):
            add("hetpipe", partition(profile, cluster, "hetpipe", optimizer=optimizer, memory_limit=math.inf))
    return out


def _microbatch_counts(stages: int, batch: int, opts: Sequence[int] | None, *, divide: bool = True
                       ) -> list[int]:
    """``opts`` (or P, 2P, 4P) that divide the batch (``divide=False``: any, for synthetic profiles)."""
    cands = list(opts) if opts is not None else [default_microbatches(stages) * k for k in (1, 2, 4)]
    if not divide:
        return sorted({m for m in cands if 1 <= m <= batch}) or [1]
    out = sorted({m for m in cands if 1 <= m <= batch and batch % m == 0})
    if out or batch < 1:
        return out or [1]
    return [max(d for d in divisors(batch) if d <= max(stages, 1))]


@dataclass(frozen=True)
class _Space:
    """What :func:`plan` searches besides the partitions (its keywords of the same names)."""

    methods: tuple[str, ...]
    microbatches: Sequence[int] | None
    chunks: Sequence[int]
    recompute: Sequence[bool]
    compression: Sequence[str | None]


def _candidates(profile: Profile, cluster: Cluster, space: _Space, optimizer: str) -> list[Candidate]:
    """Every candidate of the search space (before pruning)."""
    specs = [registry.get(m) for m in space.methods]
    need = {"dp" if s.order == "dp" else "hetpipe" if s.order == "hetpipe" else "pipelined" for s in specs}
    plans = _plans(profile, cluster, need, optimizer)
    synthetic = profile.source == "synthetic"   # its times split into any microbatch count
    out: list[Candidate] = []
    for spec in specs:
        for pname, plan in plans:
            is_dp, is_het = pname == "dp", pname == "hetpipe"
            if (spec.order == "dp") != is_dp or (spec.order == "hetpipe") != is_het:
                continue
            P = plan.num_stages
            replicated = any(s.replicas > 1 for s in plan.stages)
            if spec.order == "interleaved" and (pname != "balanced" or replicated):
                continue   # the virtual stages are re-balanced from any straight split: one is enough
            if (not spec.synchronous and spec.update != "minibatch"
                    and across_stages(profile.ties, [(s.start, s.end) for s in plan.stages])):
                continue   # per-microbatch asynchronous updates refuse a tie across stages (runtime.ties)
            if not spec.synchronous and spec.update == "microbatch":
                ms = [1]
            elif is_dp:
                ms = [cluster.num_workers] if cluster.num_workers <= profile.batch_size else []
            else:
                ms = _microbatch_counts(P, profile.batch_size, space.microbatches, divide=not synthetic)
            cks: list[int | None] = [None]
            if spec.order == "interleaved":
                cks = [v for v in space.chunks if v * P <= len(profile)]
            rcs, comps = space.recompute if not is_dp else (False,), space.compression if P > 1 else (None,)
            out += [Candidate(spec.name, pname, plan, m, v, rc, comp)
                    for m, v, rc, comp in itertools.product(ms, cks, rcs, comps)]
    return out


def _bound(c: Candidate, cms: Mapping[bool, CostModel], memory_bandwidth: float | None
           ) -> tuple[float, int]:
    """(seconds per minibatch no schedule can beat, bytes the busiest worker cannot go below): its
    compute and updates (a flushed pipeline's fill and drain too); its weights, optimizer state and
    held activations (docs/planner.md)."""
    cm = cms[c.recompute]
    spec = registry.get(c.method)
    is_dp = spec.order == "dp"
    busy: dict[int, float] = {}
    floor: dict[int, int] = {}
    stages = [(0, cm.num_layers, tuple(range(cm.cluster.num_workers)))] if is_dp else \
        [(s.start, s.end, s.ranks) for s in c.plan.stages]
    M = c.microbatches   # dp: one microbatch, 1/M of the minibatch, per replica
    phys = c.plan.notes.get("workers") if not is_dp else None
    held = 0 if spec.versions == "latest" else M if spec.order == "gpipe" else 1
    per_minibatch = spec.update == "minibatch" or spec.synchronous
    per_stage: list[tuple[float, float, float]] = []
    for a, e, ranks in stages:
        for r in ranks:
            w = int(phys[r]) if phys else r
            f, b = cm.compute_s(a, e, w, microbatches=M)
            u = cm.update_s(a, e, w, memory_bandwidth) if per_minibatch else 0.0
            busy[w] = busy.get(w, 0.0) + (f + b) * (M / len(ranks)) + u
            act = cm.activation_bytes(a, e, M) * held
            floor[w] = floor.get(w, 0) + int((1 + cm.state_factor) * cm.param_bytes(a, e)) + act
            if len(ranks) == 1:   # an unreplicated stage: its one worker's times
                bi = cm.backward_split_s(a, e, w, microbatches=M)[0] if spec.order == "zb-h1" else b
                per_stage.append((f, b, bi))
    t = max(busy.values())
    if spec.synchronous and not is_dp and spec.order != "interleaved" and len(per_stage) == len(stages):
        up = 0.0
        for f, b, bi in per_stage:
            t = max(t, up + M * (f + b))
            up += f + bi
    return t, max(floor.values())


def _staleness(res: SimResult, synchronous: bool) -> tuple[int, int]:
    """(most weight versions a stage holds, most updates a read lags behind): (1, 0) when synchronous."""
    if synchronous:
        return 1, 0
    sch = res.schedule
    versions = max((max(sch.versions_alive(w), default=1) for w in range(sch.num_workers)), default=1)
    try:
        delay = max((max(d) for d in stage_delays(sch).values()), default=0)
    except ValueError:
        delay = 0
    return int(versions), int(delay)


def _progress(total: int, progress: bool | Callable[[int, int], None]) -> Callable[[int], None]:
    """A step function: tqdm's bar on stderr, a user callback ``(done, total)``, or nothing."""
    if callable(progress):
        return lambda done: progress(done, total)
    if not progress:
        return lambda done: None
    from tqdm.auto import tqdm
    bar = tqdm(total=total, desc="planning", unit="candidate", file=sys.stderr, leave=False)

    def step(done: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
    return step


def plan(profile: Profile, cluster: Cluster | str, memory_limit: float | Sequence[float] | None = None,
         methods: Iterable[str] | None = None, *, microbatches: Sequence[int] | None = None,
         chunks: Sequence[int] = (2, 4), recompute: Sequence[bool] = (False, True),
         compression: Sequence[str | None] = (None, "fp16"), optimizer: str = "sgd-momentum",
         memory_bandwidth: float | None = None, allreduce_overlap: str = "ddp", prune: bool = True,
         margin: Margin | str | Path | None = None,
         progress: bool | Callable[[int, int], None] = False) -> PlanTable:
    """Search methods x partitions x microbatches x options for ``profile`` on ``cluster`` (docs/planner.md).

    Args:
        memory_limit: bytes per worker, one number or one per worker (default: each device's memory).
        methods: registry names (default :data:`DEFAULT_METHODS`; on mixed devices also the
            heterogeneous ones).
        microbatches: counts to try for pipelined methods (default P, 2P, 4P, at most the batch).
        prune: skip candidates whose bound cannot reach the front (False: simulate every one).
        margin: the simulator's relative throughput error on this machine: a number, a mapping
            method -> error or signed range, or the path of the errors file a
            ``reproductions/sim_accuracy`` run wrote here. None: no error is known; the table says
            so (a warning once) and ranks by prediction alone.
        progress: a tqdm bar, or a callback ``(done, total)``.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"plan() needs a pipelab Profile, got {type(profile).__name__}; load one with "
                        f"Profile.open('gnmt16') or pl.profile(model, x)")
    cl = Cluster.of(cluster)
    W = cl.num_workers
    limit = _limits(cl, memory_limit)
    margin, margin_source = resolve_margin(margin)
    if margin_source == NO_MARGIN:
        warnings.warn(NO_MARGIN, UserWarning, stacklevel=2)
    names = _method_names(cl, methods)
    for comp in compression:
        compression_ratio_of(comp)
    cms = {rc: CostModel(_recompute_profile(profile) if rc else profile, cl, optimizer=optimizer,
                         allreduce_overlap=allreduce_overlap)
           for rc in set(recompute) | {False}}
    space = _Space(names, microbatches, chunks, recompute, compression)
    cands = _candidates(profile, cl, space, optimizer)
    if not cands:
        raise ValueError(f"no candidate for methods {list(names)} on {W} workers and {len(profile)} layers")
    bounds = [_bound(c, cms, memory_bandwidth) for c in cands]
    default = _default_index(cands)
    sim = _Simulation(profile, cl, cms[False], optimizer, memory_bandwidth, allreduce_overlap, limit)
    rows = _rows(cands, bounds, default, sim, prune, _progress(len(cands), progress))
    table = decide(_rank(pd.DataFrame(rows)), default, margin)
    return PlanTable(table=table[list(COLUMNS)], candidates=tuple(cands), profile=profile, cluster=cl,
                     memory_limit=limit, optimizer=optimizer, allreduce_overlap=allreduce_overlap,
                     default_row=default, margin=margin, margin_source=margin_source)


def _rows(cands: Sequence[Candidate], bounds: Sequence[tuple[float, int]], default: int | None,
          sim: _Simulation, prune: bool, step: Callable[[int], None]) -> list[dict[str, Any]]:
    """Every candidate's row, simulated in order of its bound unless it is skipped (and why)."""
    rows: list[dict[str, Any]] = [{} for _ in cands]
    done_pts: list[tuple[float, int]] = []   # (time, peak) of simulated candidates that fit
    order = sorted(range(len(cands)), key=lambda i: (bounds[i][0], cands[i].key()))
    for n_done, i in enumerate(order, 1):
        c = cands[i]
        b_time, b_mem = bounds[i]
        row = rows[i] = _base_row(c, b_time, sim.cluster.num_workers)
        spec = registry.get(c.method)
        if c.plan.num_stages == 1 and spec.order != "dp" and not spec.synchronous:
            row["status"] = ONE_STAGE_ASYNC
        elif b_mem > max(sim.limit):
            row["status"] = "skipped: weights and optimizer state alone exceed memory"
        elif prune and i != default and any(t <= b_time and m <= b_mem for t, m in done_pts):
            row["status"] = "skipped: dominated by its bound"
        else:
            simulated, point = sim.row(c)
            row.update(simulated)
            if point is not None:
                done_pts.append(point)
        step(n_done)
    return rows


def _method_names(cl: Cluster, methods: Iterable[str] | None) -> tuple[str, ...]:
    """The methods to search, each checked against the registry (an unknown one raises MethodError)."""
    hetero = len({cl.speed(w) for w in range(cl.num_workers)}) > 1
    mixed = tuple(n for n in registry.names() if registry.get(n).heterogeneous) if hetero else ()
    names = tuple(methods) if methods is not None else DEFAULT_METHODS + mixed
    for name in names:
        registry.get(name)
    return names


def _default_index(cands: Sequence[Candidate]) -> int | None:
    """The default's candidate: the baseline method on a uniform split over every worker, ``M = P``."""
    uniform = [i for i, c in enumerate(cands)
               if registry.get(c.method).baseline and c.partitioner == "uniform" and not c.recompute
               and c.compression is None and c.microbatches == c.plan.num_stages]
    return max(uniform, key=lambda i: (cands[i].plan.num_stages, -cands[i].plan.num_workers), default=None)


def _limits(cl: Cluster, memory_limit: float | Sequence[float] | None) -> tuple[int, ...]:
    """Bytes per worker: each device's memory, one number for all, or one per worker (checked)."""
    W = cl.num_workers
    if memory_limit is None:
        limit = tuple(cl.memory(w) for w in range(W))
    elif isinstance(memory_limit, (int, float)):
        limit = (int(memory_limit),) * W
    else:
        limit = tuple(int(x) for x in memory_limit)
        if len(limit) != W:
            raise ValueError(f"memory_limit has {len(limit)} entries but cluster {cl.name!r} has {W} workers")
    if any(x <= 0 for x in limit):
        raise ValueError(f"memory_limit must be positive bytes per worker; got {memory_limit!r}")
    return limit


def _base_row(c: Candidate, bound_s: float, W: int) -> dict[str, Any]:
    """A candidate's row before simulation: what it is, its bound, nothing measured."""
    spec = registry.get(c.method)
    row: dict[str, Any] = dict(
        method=c.method, synchronous=spec.synchronous, partitioner=c.partitioner, config=c.plan.config,
        stages=c.plan.num_stages, workers=c.plan.num_workers if spec.order != "dp" else W,
        microbatches=c.microbatches, chunks=c.chunks or 0, recompute=c.recompute,
        compression=c.compression or "none", bound_s=bound_s, throughput=math.nan,
        time_per_minibatch_s=math.nan, peak_memory=math.nan, fits=False, bubble_fraction=math.nan,
        versions=0, delay=0, staleness_risk="", pareto=False, equivalent="")
    if c.plan.num_stages == 1 and spec.order != "dp":
        row["equivalent"] = ONE_STAGE_SYNC if spec.synchronous else "dp"
    return row


@dataclass(frozen=True)
class _Simulation:
    """What every candidate of one search is simulated with."""

    profile: Profile
    cluster: Cluster
    cm: CostModel
    optimizer: str
    memory_bandwidth: float | None
    allreduce_overlap: str
    limit: tuple[int, ...]

    def row(self, c: Candidate) -> tuple[dict[str, Any], tuple[float, int] | None]:
        """The simulated columns of ``c``'s row, and its (time per minibatch, peak) when it fits."""
        try:
            res = _simulate(c, self.profile, self.cluster, self.optimizer,
                            memory_bandwidth=self.memory_bandwidth, allreduce_overlap=self.allreduce_overlap)
        except (ScheduleError, ValueError) as exc:
            return {"status": f"error: {str(exc).splitlines()[0][:120]}"}, None
        synchronous = registry.get(c.method).synchronous
        peak, cm = list(res.peak_memory), self.cm
        hosted = _hosted(res, cm, c) if synchronous or c.recompute else []
        if synchronous:   # the optimizer state a flushed method's first update allocates (torch: lazily)
            peak = [p + sum(int(cm.state_factor * cm.param_bytes(a, e)) for a, e in ranges)
                    for p, ranges in zip(peak, hosted)]
        if c.recompute:   # one microbatch's activations of the worker's largest stage
            M = 1 if registry.get(c.method).order == "dp" else c.microbatches
            peak = [p + max((cm.activation_bytes(a, e, M) for a, e in ranges), default=0)
                    for p, ranges in zip(peak, hosted)]
        fits = all(p <= self.limit[w] for w, p in enumerate(peak) if w < self.cluster.num_workers)
        versions, delay = _staleness(res, synchronous)
        tpm = self.profile.batch_size / res.throughput   # dp's own time_per_minibatch is per microbatch
        cols = dict(throughput=res.throughput, time_per_minibatch_s=tpm, peak_memory=max(peak), fits=fits,
                    bubble_fraction=sum(res.bubble_fraction) / len(res.bubble_fraction),
                    versions=versions, delay=delay, status="simulated",
                    staleness_risk=(f"weights up to {delay} updates stale, {versions} "
                                    f"version{'s' if versions != 1 else ''} held"
                                    if delay > 0 else ""))
        return cols, ((tpm, max(peak)) if fits else None)


def _hosted(res: SimResult, cm: CostModel, c: Candidate) -> list[list[tuple[int, int]]]:
    """Per worker, the layer ranges of the stages it hosts in ``res``'s schedule."""
    sch = res.schedule
    if registry.get(c.method).order == "dp":
        return [[(0, cm.num_layers)] for _ in range(sch.num_workers)]
    plan_ = c.plan if c.chunks is None else virtual_plan(c.plan, cm.profile, c.chunks)
    return [[(plan_.stages[s].start, plan_.stages[s].end) for s in sch.stages_of(w)]
            for w in range(sch.num_workers)]


def _rank(table: pd.DataFrame) -> pd.DataFrame:
    """Rank the fitting rows by throughput (1 = fastest) and mark their Pareto front against memory."""
    table = table.copy()
    ok = (table["status"] == "simulated") & table["fits"]
    # fastest first; a tie (to 9 significant digits) goes to the smaller peak memory, then to row order
    thr, peak = table["throughput"].to_dict(), table["peak_memory"].to_dict()
    order = sorted(table.index[ok], key=lambda i: (-float(f"{float(thr[i]):.9g}"), float(peak[i]), i))
    table["rank"] = 0
    table.loc[order, "rank"] = list(range(1, len(order) + 1))
    fit = table[ok].sort_values(["peak_memory", "throughput"], ascending=[True, False])
    best, front = -math.inf, []
    for idx, r in fit.iterrows():
        if r["throughput"] > best * (1 + 1e-9):   # a float tie is no better
            front.append(idx)
            best = r["throughput"]
    table["pareto"] = table.index.isin(front)
    return table
