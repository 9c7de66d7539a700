"""The planner for transformer LLMs: tensor x pipeline x data degrees and the rest, ranked under memory.

``plan_llm(model, cluster, global_batch)`` enumerates every :class:`~pipelab.llm.parallel.Parallel` that
uses the cluster's GPUs: tensor degree (inside a node), pipeline degree, data degree, microbatch size
and count, pipeline order and virtual stages, recomputation and optimizer sharding. Each candidate is

1. checked (:meth:`Parallel.check`: heads, layers and batch divide) and priced in memory
   (:func:`pipelab.llm.memory.memory_per_device`): over the device's memory, it is refused;
2. estimated in closed form from its stage costs (:func:`closed_form_s`: the pipeline's fill and drain
   as bubbles, Narayanan et al. SC'21 §2.2; Qi et al. ICLR'24 §3 for ZB-H1);
3. the ``shortlist`` fastest estimates are simulated (:func:`pipelab.sim.llm.simulate_llm`) and ranked
   by simulated time per iteration.

Invariant: every row of the table fits memory; the pick is the simulated fastest of the shortlist.
:meth:`LlmPlanTable.explain` says, in figures, why the pick beats the runner-up.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelab._display import Described
from pipelab._io import read_record, write_record
from pipelab.cluster import Cluster
from pipelab.llm.costs import stage_costs
from pipelab.llm.memory import MemoryBreakdown, memory_per_device
from pipelab.llm.parallel import Parallel, ParallelError
from pipelab.llm.shape import Transformer
from pipelab.sim.llm import LlmResult, simulate_llm, stage_times

if TYPE_CHECKING:
    import pandas as pd

#: the search's default choices (each a keyword of :func:`plan_llm`)
DEFAULT_SCHEDULES = ("1f1b", "interleaved", "zb-h1")
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL = (2, 4)
DEFAULT_RECOMPUTE = ("none", "selective", "full")
DEFAULT_SHARDING = ("none", "zero1")


#: version of the JSON form :meth:`LlmPlanTable.save` writes
SCHEMA = 1


class PlanInfeasible(ValueError):
    """No configuration asked for fits: the message names the per-device memory, its parts and the limit."""


@dataclass(frozen=True)
class LlmCandidate:
    """One configuration: its degrees, closed-form estimate, memory and (if simulated) result."""

    parallel: Parallel
    estimate_s: float
    memory: MemoryBreakdown
    result: LlmResult | None = field(default=None, repr=False)

    @property
    def time_s(self) -> float:
        """The simulated time per iteration, or the estimate when not simulated."""
        return self.result.time_per_iteration_s if self.result is not None else self.estimate_s

    def row(self) -> dict[str, Any]:
        """The candidate as one table row."""
        p, r = self.parallel, self.result
        return {"tensor": p.tensor, "pipeline": p.pipeline, "data": p.data,
                "microbatch_size": p.microbatch_size, "microbatches": p.microbatches,
                "schedule": p.schedule, "virtual": p.virtual,
                "recompute": p.recompute, "sharding": p.sharding,
                "estimate_s": self.estimate_s, "simulated_s": r.time_per_iteration_s if r else None,
                "model_tflops_per_gpu": r.model_tflops_per_gpu if r else None,
                "mfu": r.model_flops_utilization if r else None,
                "bubble": r.bubble_fraction if r else None, "memory_gib": int(self.memory.total) / 2**30}


@dataclass(frozen=True, repr=False)
class LlmPlanTable(Described):
    """The planner's answer: simulated candidates ranked fastest first, then the estimated rest."""

    model: Transformer
    cluster: str
    global_batch: int
    candidates: tuple[LlmCandidate, ...]
    considered: int                  # configurations enumerated
    refused_memory: int              # of those, over the device's memory
    refused_shape: int               # of those, not dividing heads, layers or batch
    memory_limit: int

    @property
    def best(self) -> LlmCandidate:
        """The pick: the simulated fastest."""
        return self.candidates[0]

    @property
    def simulated(self) -> tuple[LlmCandidate, ...]:
        """The candidates that were simulated, fastest first."""
        return tuple(c for c in self.candidates if c.result is not None)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate (simulated ones first), for a notebook."""
        import pandas as pd
        return pd.DataFrame([c.row() for c in self.candidates])

    def explain(self) -> str:
        """Why the pick beats the runner-up, in figures: bubble, communication, recompute, memory."""
        sim = self.simulated
        if len(sim) < 2:
            return f"only one configuration fits: {sim[0].parallel.describe()}"
        return compare(sim[0], sim[1])

    def describe(self) -> str:
        """The pick, the search's counts and the top rows."""
        b = self.best
        head = [f"plan_llm: {self.model.name} on {self.cluster}, global batch {self.global_batch}: "
                f"{self.considered} configurations, {self.refused_shape} not dividing, {self.refused_memory} "
                f"over {self.memory_limit / 2**30:.0f} GiB, {len(self.simulated)} simulated",
                f"  pick: {b.parallel.describe()}",
                f"        {b.result.summary() if b.result else f'{b.estimate_s:.3f} s estimated'}"]
        for i, c in enumerate(self.simulated[1:6], start=2):
            head.append(f"  #{i}: {c.parallel.describe()}: {c.time_s:.3f} s, "
                        f"{int(c.memory.total) / 2**30:.1f} GiB")
        return "\n".join(head)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: the search's inputs and counts, each candidate's record (not its trace)."""
        return {"model": self.model.to_dict(), "cluster": self.cluster, "global_batch": self.global_batch,
                "considered": self.considered, "refused_memory": self.refused_memory,
                "refused_shape": self.refused_shape, "memory_limit": self.memory_limit,
                "candidates": [{"parallel": c.parallel.to_dict(), "estimate_s": c.estimate_s,
                                "memory": asdict(c.memory), "simulated": c.result is not None}
                               for c in self.candidates]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlmPlanTable:
        """Inverse of :meth:`to_dict`; the simulated rows are simulated again (the simulation is a pure
        function of model, cluster and plan, so their results are the saved table's)."""
        model = Transformer.from_dict(d["model"])
        cands = []
        for c in d["candidates"]:
            par = Parallel.from_dict(c["parallel"])
            res = simulate_llm(model, d["cluster"], par) if c["simulated"] else None
            cands.append(LlmCandidate(parallel=par, estimate_s=float(c["estimate_s"]),
                                      memory=MemoryBreakdown(**c["memory"]), result=res))
        return cls(model=model, cluster=d["cluster"], global_batch=int(d["global_batch"]),
                   candidates=tuple(cands), considered=int(d["considered"]),
                   refused_memory=int(d["refused_memory"]), refused_shape=int(d["refused_shape"]),
                   memory_limit=int(d["memory_limit"]))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the table as JSON, atomically."""
        return write_record(path, "llm-plan", SCHEMA, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LlmPlanTable:
        """Read a table :meth:`save` wrote."""
        doc = read_record(path, "llm-plan", SCHEMA)
        return cls.from_dict({k: v for k, v in doc.items() if k not in ("pipelab", "schema")})

    def _repr_html_(self) -> str:
        return self.to_dataframe().head(20).to_html(index=False, float_format=lambda x: f"{x:.4g}")


def compare(first: LlmCandidate, second: LlmCandidate) -> str:
    """Why ``first`` is faster than ``second``: the time difference split into bubble, tensor and data
    communication, and recomputation, with their memory."""
    a, b = first.result, second.result
    assert a is not None and b is not None
    gap = b.time_per_iteration_s - a.time_per_iteration_s

    def terms(r: LlmResult) -> dict[str, float]:
        t = r.time_per_iteration_s
        rate = r.hardware_flops / max(t - r.bubble_fraction * t, 1e-12)   # FLOP/s while busy, whole job
        return {"pipeline bubble": r.bubble_fraction * t, "tensor collectives": r.tensor_s,
                "exposed data-parallel sync": r.data_exposed_s,
                "recomputation": (r.hardware_flops - r.model_flops) / rate}

    ta, tb = terms(a), terms(b)
    diffs = sorted(((tb[k] - ta[k], k) for k in ta), reverse=True)
    if gap <= 1e-9 * b.time_per_iteration_s:
        return (f"{first.parallel.describe()}\n  ties with {second.parallel.describe()} "
                f"({a.time_per_iteration_s:.3f} s); memory {a.peak_memory / 2**30:.1f} GiB vs "
                f"{b.peak_memory / 2**30:.1f} GiB")
    lines = [f"{first.parallel.describe()}",
             f"  beats {second.parallel.describe()}",
             f"  by {gap:.3f} s per iteration ({gap / b.time_per_iteration_s:.1%}): "
             f"{a.time_per_iteration_s:.3f} s vs {b.time_per_iteration_s:.3f} s"]
    for d, k in diffs:
        lines.append(f"  {k:28s} {ta[k]:8.3f} s vs {tb[k]:8.3f} s ({'saves' if d >= 0 else 'costs'} "
                     f"{abs(d):.3f} s)")
    lines.append(f"  {'memory per device (peak)':28s} {a.peak_memory / 2**30:8.1f} GiB vs "
                 f"{b.peak_memory / 2**30:8.1f} GiB (limit {a.memory_limit / 2**30:.0f} GiB)")
    top = diffs[0]
    lines.append(f"  mostly: {top[1]} ({top[0]:.3f} s of the {gap:.3f} s)" if top[0] > 0 else
                 "  no single term explains it: the stages' compute differs")
    return "\n".join(lines)


def closed_form_s(model: Transformer, parallel: Parallel, cluster: Cluster) -> float:
    """Time per iteration from bubbles alone: ``m`` rounds of the slowest stage plus the fill and drain
    (``(p - 1) / v`` rounds for 1F1B and interleaving; ``(p - 1)`` times ``F + B - W`` for ZB-H1), the
    point-to-point sends of the fill, then the step's end (exposed gradient sync and optimizer)."""
    costs = stage_costs(model, parallel, cluster)
    st = stage_times(model, parallel, costs)
    v, p, m = parallel.virtual, parallel.pipeline, parallel.microbatches
    per_worker = [0.0] * p
    fb = [0.0] * p
    weight = [0.0] * p
    for s, x in enumerate(st):
        w = s % p
        f = x.forward_s + x.tensor_forward_s
        b = x.backward_input_s + x.tensor_backward_s
        split = parallel.schedule == "zb-h1"      # W its own action: nothing hides behind B's GEMMs
        per_worker[w] += f + x.backward_s(split) + (x.backward_weight_s if split else 0.0)
        fb[w] += f + b
        weight[w] += x.backward_weight_s
    slow = max(range(p), key=per_worker.__getitem__)
    if parallel.schedule == "zb-h1":
        fill = (p - 1) * max(fb[slow] - weight[slow], 0.0)
    elif parallel.schedule == "gpipe":
        fill = (p - 1) * per_worker[slow]
    else:
        fill = (p - 1) * per_worker[slow] / v
    sends = 2 * (p - 1) * max((x.send_s for x in st), default=0.0)
    step_end = costs.dp_exposed_s + costs.sharding_gather_s + costs.optimizer_s
    return m * per_worker[slow] + fill + sends + step_end


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _choices(given: int | Sequence[int] | None, default: Iterable[int]) -> list[int]:
    if given is None:
        return list(default)
    return [given] if isinstance(given, int) else list(given)


def _strs(given: str | Sequence[str] | None, default: Iterable[str]) -> list[str]:
    if given is None:
        return list(default)
    return [given] if isinstance(given, str) else list(given)


def enumerate_parallel(model: Transformer, cluster: Cluster, global_batch: int, *, gpus: int | None = None,
                       tensor: int | Sequence[int] | None = None, pipeline: int | Sequence[int] | None = None,
                       microbatch_size: int | Sequence[int] | None = None,
                       schedule: str | Sequence[str] | None = None,
                       virtual: int | Sequence[int] | None = None,
                       recompute: str | Sequence[str] | None = None,
                       sharding: str | Sequence[str] | None = None,
                       sequence_parallel: bool = True) -> Iterable[Parallel]:
    """Every Parallel of the search space that uses ``gpus`` devices (default: all of the cluster's); the
    data degree follows from the other two, the microbatch count from the batch."""
    n = gpus if gpus is not None else cluster.num_workers
    fast = cluster.block_size(0)
    ts = _choices(tensor, [t for t in _divisors(fast) if n % t == 0])
    ps = _choices(pipeline, _divisors(model.layers))
    bs = _choices(microbatch_size, DEFAULT_MICROBATCH_SIZES)
    vs = _choices(virtual, DEFAULT_VIRTUAL)
    orders = _strs(schedule, DEFAULT_SCHEDULES)
    policies = _strs(recompute, DEFAULT_RECOMPUTE)
    if "selective-op" in policies:
        raise ValueError("recompute='selective-op' is priced for memory only (memory_per_device); the "
                         f"planner ranks by time: choose among {DEFAULT_RECOMPUTE}")
    shardings = _strs(sharding, DEFAULT_SHARDING)
    for t, p, b, sched, rc, sh in product(ts, ps, bs, orders, policies, shardings):
        if n % (t * p) or global_batch % ((n // (t * p)) * b):
            continue
        d = n // (t * p)
        m = global_batch // (d * b)
        if sh != "none" and d == 1:
            continue    # nothing to shard over
        if p == 1 and sched != "1f1b":
            continue    # one stage: every order is the same sequence of forwards and backwards
        for v in (vs if sched == "interleaved" else [1]):
            if sched == "interleaved" and (v < 2 or p == 1):
                continue
            yield Parallel(tensor=t, pipeline=p, data=d, microbatch_size=b, microbatches=m, virtual=v,
                           recompute=rc, sequence_parallel=sequence_parallel and t > 1, sharding=sh,
                           schedule=sched)


def plan_llm(model: Transformer, cluster: Cluster | str, global_batch: int, *, gpus: int | None = None,
             tensor: int | Sequence[int] | None = None, pipeline: int | Sequence[int] | None = None,
             microbatch_size: int | Sequence[int] | None = None, schedule: str | Sequence[str] | None = None,
             virtual: int | Sequence[int] | None = None, recompute: str | Sequence[str] | None = None,
             sharding: str | Sequence[str] | None = None, sequence_parallel: bool = True,
             shortlist: int = 6) -> LlmPlanTable:
    """Search and rank the parallel configurations of ``model`` on ``cluster`` for ``global_batch``.

    Args:
        gpus: devices to use (default: all of the cluster's).
        tensor, pipeline, microbatch_size, virtual, schedule, recompute, sharding: one value or a list to
            search (default: tensor degrees dividing a node, pipeline degrees dividing the layers, the
            module's ``DEFAULT_*`` tuples for the rest).
        sequence_parallel: use sequence parallelism with every tensor degree above 1.
        shortlist: how many of the best closed-form estimates to simulate.

    Returns:
        An :class:`LlmPlanTable`. Raises :class:`PlanInfeasible` when nothing asked for fits memory (naming
        the smallest per-device figure, its parts and the limit) or divides.
    """
    cluster = Cluster.of(cluster)
    if shortlist < 1:
        raise ValueError(f"shortlist={shortlist} must be >= 1")
    limit = int(cluster.devices[0].memory_bytes)
    fits: list[LlmCandidate] = []
    considered = refused_shape = 0
    smallest: tuple[Parallel, MemoryBreakdown] | None = None
    shape_error = ""
    for par in enumerate_parallel(model, cluster, global_batch, gpus=gpus, tensor=tensor, pipeline=pipeline,
                                  microbatch_size=microbatch_size, schedule=schedule, virtual=virtual,
                                  recompute=recompute, sharding=sharding,
                                  sequence_parallel=sequence_parallel):
        considered += 1
        try:
            par.check(model, cluster, global_batch)
        except ParallelError as exc:
            refused_shape += 1
            shape_error = shape_error or str(exc)
            continue
        mem = _peak(memory_per_device(model, par))
        if int(mem.total) > limit:
            if smallest is None or int(mem.total) < int(smallest[1].total):
                smallest = (par, mem)
            continue
        fits.append(LlmCandidate(parallel=par, estimate_s=closed_form_s(model, par, cluster), memory=mem))
    if not fits:
        if smallest is not None:
            par, mem = smallest
            parts = ", ".join(f"{k} {int(v) / 2**30:.1f} GiB" for k, v in mem.parts().items() if k != "total")
            raise PlanInfeasible(
                f"no configuration of {model.name} on {cluster.name} fits {limit / 2**30:.1f} GiB per "
                f"device; the smallest, {par.describe()}, needs {int(mem.total) / 2**30:.1f} GiB per device "
                f"({parts}); "
                "allow more pipeline or tensor stages, recompute='full', sharding='zero1', or more GPUs")
        raise PlanInfeasible(f"no configuration of {model.name} divides on {cluster.name} with global batch "
                             f"{global_batch} ({considered} tried)"
                             f"{': ' + shape_error if shape_error else ''}")
    fits.sort(key=lambda c: c.estimate_s)
    top = [LlmCandidate(parallel=c.parallel, estimate_s=c.estimate_s, memory=c.memory,
                        result=simulate_llm(model, cluster, c.parallel)) for c in fits[:shortlist]]
    top.sort(key=lambda c: c.time_s)
    return LlmPlanTable(model=model, cluster=cluster.name, global_batch=global_batch,
                        candidates=tuple(top + fits[shortlist:]), considered=considered,
                        refused_memory=considered - refused_shape - len(fits), refused_shape=refused_shape,
                        memory_limit=limit)


def _peak(mem: Sequence[MemoryBreakdown]) -> MemoryBreakdown:
    """The stage with the most memory per device."""
    return max(mem, key=lambda x: int(x.total))
