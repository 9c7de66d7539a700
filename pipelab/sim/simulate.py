"""``simulate`` and ``SimResult``: time a schedule on a cluster with the one cost model.

The simulator executes the very :class:`~pipelab.schedules.Schedule` the runtime runs
(:mod:`pipelab.schedules.dataflow`), each action priced by :class:`pipelab.costs.CostModel`: compute,
transfers through the ports they cross, all-reduce as ``allreduce_overlap`` says, the optimizer step.
Memory per worker over time follows what the runtime holds (docs/cost_model.md). A stage of tensor
degree ``t`` is priced as one member of its group sees it (:mod:`pipelab.costs.tensor`, by the split
rule the runtime cuts with, recorded on the Profile), its collectives inside its ``F`` and ``B``; its
groups sit on the cluster as :mod:`pipelab.sim.tensor` places them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pipelab.methods as methods
import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab.batching import check_divides
from pipelab.cluster import Cluster
from pipelab.costs import CostModel, compression_ratio_of
from pipelab.costs.prices import span
from pipelab.costs.tensor import GroupComm, check_priceable, group_comm, layer_degrees, per_device
from pipelab.partition.plan import Plan
from pipelab.partition.virtual import virtual_plan
from pipelab.schedules import build
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import Costs, Deadlock, UnitCosts, run
from pipelab.schedules.groups import member_numbers, worker_degrees
from pipelab.schedules.steps import ScheduleError
from pipelab.sim.host_effects import HostCosts, HostEffects
from pipelab.sim.tensor import comm_events, member_events, place_groups
from pipelab.ties import StageTie, TieError, across_stages, check_tie_method
from pipelab.trace import Event, Trace

if TYPE_CHECKING:
    from pipelab.profile.records import Profile


def _synchronous(method: str) -> bool:
    """Whether ``method`` flushes every minibatch (an unregistered name counts as one)."""
    spec = methods.METHODS.get(method)
    return spec is None or spec.synchronous


def _order(method: str) -> str | None:
    """The builder key of ``method`` (None for an unregistered name)."""
    spec = methods.METHODS.get(method)
    return spec.order if spec is not None else None


@dataclass(frozen=True, repr=False)
class SimResult(Described):
    """What a simulated run did and what it measured (times in seconds, memory in bytes)."""

    schedule: Schedule
    trace: Trace
    time_per_minibatch: float
    throughput: float                     # samples per second (minibatch / time_per_minibatch)
    utilization: tuple[float, ...]        # per worker: busy fraction of the measured window
    bubble_fraction: tuple[float, ...]    # per worker: 1 - utilization
    peak_memory: tuple[int, ...]
    memory_timeline: dict[int, list[tuple[float, int]]] = field(default_factory=dict, repr=False)
    window: tuple[float, float] = (0.0, 0.0)   # the measured interval (steady state for async methods)
    batch_size: int = 1
    #: the tensor groups' other members' copies of their leader's events (worker: the member's process
    #: rank, ``trace.meta["tensor_groups"]``); drawn by ``pl.views.gantt_groups(result, expand=True)``
    member_events: tuple[Event, ...] = field(default=(), repr=False)

    @property
    def makespan(self) -> float:
        """Seconds from the first action's start to the last action's end."""
        return self.trace.makespan

    @property
    def memory(self) -> tuple[int, ...]:
        """Peak bytes per worker (alias of ``peak_memory``; the timeline is ``memory_timeline``)."""
        return self.peak_memory

    @property
    def bubble_time(self) -> tuple[float, ...]:
        """Per worker: idle seconds inside the measured window."""
        span = self.window[1] - self.window[0]
        return tuple(b * span for b in self.bubble_fraction)

    @property
    def assumes(self) -> str:
        """What ``time_per_minibatch`` assumes: microbatches, samples per replica, flush or not."""
        M, B = self.schedule.microbatches, self.batch_size
        if _order(self.schedule.method) == "dp":
            per = f"M={M}: each replica takes whole minibatches of {B} samples"
        else:
            per = f"M={M} microbatches of {B // M if B % M == 0 else B / M:g} samples"
        if _synchronous(self.schedule.method):
            K = self.schedule.minibatches
            return f"{per}; over {K} minibatch{'es' if K != 1 else ''}, fill and drain (flush) included"
        return f"{per}; steady state between minibatch completions, fill and drain left out"

    def describe(self) -> str:
        """The summary, what it assumes, and each worker's utilization and peak memory."""
        lines = [f"simulated {self.summary()}", f"    (assumes {self.assumes})"]
        groups = self.trace.meta.get("tensor_devices")
        if groups:
            lines.append("    tensor groups (one member priced per worker; memory per member): "
                         + ", ".join(f"w{w} on devices {list(g)}" for w, g in enumerate(groups)))
        lines += [f"  worker {w:3d}: utilization {u:6.1%}  peak memory {m / 2**30:7.3f} GiB"
                  for w, (u, m) in enumerate(zip(self.utilization, self.peak_memory))]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line for humans."""
        util = sum(self.utilization) / max(len(self.utilization), 1)
        return (f"{self.schedule.method}: {self.time_per_minibatch * 1e3:.3f} ms/minibatch, "
                f"{self.throughput:.1f} samples/s, mean utilization {util:.1%}, "
                f"peak memory {max(self.peak_memory, default=0) / 2**30:.2f} GiB")


@dataclass(frozen=True)
class StageMemory:
    """The byte terms of one stage that the memory timeline (:func:`_memory`) adds and removes."""

    #: weights, gradients and optimizer state of one copy: ``(2 + state) * weights``
    model_states: int
    #: activations one in-flight microbatch keeps until its (weight-gradient) backward
    activations: int
    #: one copy of the weights
    weights: int
    #: weight-sized buffers always kept (PipeMare's delta)
    buffers: int = 0
    #: the output gradient a split backward keeps from ``B`` to ``W``
    grad_out: int = 0


class ProfileCosts(Costs):
    """Costs of a schedule's actions from a :class:`CostModel` and the plan's layer ranges."""

    def __init__(self, model: CostModel, ranges: list[tuple[int, int]], microbatches: int,
                 memory_bandwidth: float | None = None, workers: list[int] | None = None,
                 recompute_forward: bool = False, tie_s: dict[int, float] | None = None,
                 tensor_comm: Mapping[int, GroupComm] | None = None) -> None:
        """``ranges[s]``: stage ``s``'s layers; ``workers[r]``: rank ``r``'s cluster worker (default
        identity); ``recompute_forward``: every ``B`` first runs its stage's forward again; ``tie_s[s]``:
        seconds of the all-reduce of the shared parameters stage ``s`` holds, part of its ``U``;
        ``tensor_comm[s]``: stage ``s``'s tensor-group collectives, inside its ``F`` and ``B``."""
        self.model = model
        self.tensor_comm = dict(tensor_comm or {})
        self.tie_s = dict(tie_s or {})
        self.recompute_forward = recompute_forward
        self.ranges = ranges
        self.M = microbatches
        self.memory_bandwidth = memory_bandwidth
        self.phys = workers
        self._cache: dict[tuple[int, int], tuple[float, float]] = {}
        self._sends: dict[tuple[int, int, int, str], tuple[float, int]] = {}
        self._channels: dict[tuple[int, int], tuple[Hashable, ...]] = {}

    def _w(self, rank: int) -> int:
        return rank if self.phys is None else self.phys[rank]

    def compute(self, worker: int, action: Action, split: bool) -> float:
        split_bw = split and action.kind in ("B", "W")    # cached apart: (B, W) rather than (F, B)
        key = (-1 - action.stage if split_bw else action.stage, worker)
        a, e = self.ranges[action.stage]
        if key not in self._cache:
            price = self.model.backward_split_s if split_bw else self.model.compute_s
            self._cache[key] = price(a, e, self._w(worker), microbatches=self.M)
        comm = self.tensor_comm.get(action.stage)
        tf, tb = (comm.forward_s, comm.backward_s) if comm is not None else (0.0, 0.0)
        if self.recompute_forward:
            tb += tf
        if split_bw:
            return self._cache[key][0] + tb if action.kind == "B" else self._cache[key][1]
        f, b = self._cache[key]
        if action.kind == "F":
            return f + tf
        if action.kind == "B":
            if self.recompute_forward:
                b += self.model.layers_s(a, e, self._w(worker), microbatches=self.M)[0]
            return b + tb
        tie = self.tie_s.get(action.stage, 0.0)
        return self.model.update_s(a, e, self._w(worker), self.memory_bandwidth) + tie

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        key = (src, dst, action.stage, action.kind)
        hit = self._sends.get(key)
        if hit is None:
            a, e = self.ranges[action.stage]
            boundary = e - 1 if action.kind == "F" else a - 1
            nbytes = self.model.cut_bytes(boundary, self.M)
            hit = self._sends[key] = (self.model.transfer_s(nbytes, self._w(src), self._w(dst)), nbytes)
        return hit

    def channels(self, src: int, dst: int) -> tuple[Hashable, ...]:
        """The sender's egress and the receiver's ingress port (:meth:`CostModel.ports`)."""
        hit = self._channels.get((src, dst))
        if hit is None:
            hit = self._channels[(src, dst)] = self.model.ports(self._w(src), self._w(dst))
        return hit

    def channel_slots(self, channel: Hashable) -> int:
        """A port has ``Level.uplinks`` independent links (:meth:`CostModel.port_slots`)."""
        return self.model.port_slots(channel) if isinstance(channel, tuple) else 1

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        """See :meth:`Costs.allreduce`; the formulas of :meth:`CostModel.replica_time_s`."""
        a, e = self.ranges[stage]
        cm = self.model
        nbytes = cm.param_bytes(a, e)
        phys = [self._w(w) for w in workers]
        slowest = min(phys, key=cm.cluster.speed)
        f, b = cm.compute_s(a, e, slowest, microbatches=self.M)
        work = -(-self.M // len(phys)) * (f + b)
        kappa, fixed = cm.allreduce_coeffs(phys, work)
        if kappa == 0.0 or nbytes == 0:
            return grad_s, 0.0, nbytes
        if cm.allreduce_overlap == "none":
            comm = cm.allreduce_s(nbytes, phys, work)
            return grad_s + comm, comm, nbytes
        # one microbatch's backward of layers [ly, e) on the slowest replica, then the all-reduce of [a, ly]
        tail = max(cm.compute_s(ly, e, slowest, microbatches=self.M)[1]
                   + kappa * span(cm.param_bytes_prefix, a, ly + 1) for ly in range(a, e))
        return max(grad_s, float(tail) + fixed), cm.allreduce_s(nbytes, phys, work), nbytes


def simulate_schedule(schedule: Schedule, costs: Costs | None = None, *, batch_size: int = 1,
                      memory: Mapping[int, StageMemory] | None = None,
                      minibatch_scale: int = 1) -> SimResult:
    """Run ``schedule`` under ``costs`` (default :class:`UnitCosts`) and measure it (async methods without
    warm-up and drain). ``minibatch_scale`` divides the time per minibatch (``M`` for ``dp``); ``memory``:
    stage -> its :class:`StageMemory`."""
    costs = costs if costs is not None else UnitCosts()
    try:
        events = run(schedule, costs)
    except Deadlock as exc:
        raise ScheduleError(f"{exc}\n{schedule.grid(mark=exc.stuck[0][:2], max_steps=26)}") from None
    trace = Trace.from_events(events, method=schedule.method, microbatches=schedule.microbatches,
                              minibatches=schedule.minibatches, stages=schedule.num_stages)
    comp = metrics.compute_events(events)
    M, K = schedule.microbatches, schedule.minibatches
    end = max((e.end_s for e in events), default=0.0)
    window = (0.0, end)
    tpm = end / K
    if not _synchronous(schedule.method):
        # replicas complete out of order, in groups: count completions in multiples of lcm(replicas)
        done = metrics.minibatch_completions(comp, M, K)
        w = schedule.warmup_minibatches()
        L = math.lcm(*(len(r) for r in schedule.stage_ranks)) if M == 1 else 1
        steady = metrics.steady_window(done, w, L)
        if steady is not None:
            window = (steady[0], steady[1])
            tpm = (window[1] - window[0]) / steady[2]
    tpm /= minibatch_scale
    span = window[1] - window[0]
    busy = metrics.busy_time(comp, range(schedule.num_workers), window[0], window[1])
    util = tuple(b / span if span > 0 else 0.0 for b in busy.values())
    timeline = _memory(schedule, comp, memory) if memory is not None else {}
    peak = tuple(max((b for _, b in timeline.get(w, [])), default=0) for w in range(schedule.num_workers))
    return SimResult(schedule=schedule, trace=trace, time_per_minibatch=tpm,
                     throughput=batch_size / tpm if tpm > 0 else math.inf, utilization=util,
                     bubble_fraction=tuple(1.0 - u for u in util), peak_memory=peak, memory_timeline=timeline,
                     window=window, batch_size=batch_size)


def _memory(schedule: Schedule, comp: list[Event], memory: Mapping[int, StageMemory]
            ) -> dict[int, list[tuple[float, int]]]:
    """Per worker, (time, bytes) after every change, as the runtime holds them (docs/cost_model.md)."""
    split = {e.stage for e in comp if e.kind == "W"}
    by_worker: dict[int, list[Event]] = {}
    for e in comp:
        by_worker.setdefault(e.worker, []).append(e)
    out: dict[int, list[tuple[float, int]]] = {}
    for w, evs in by_worker.items():
        evs.sort(key=lambda e: e.step)
        hosted = schedule.stages_of(w)
        weights = sum(memory[s].weights + memory[s].buffers for s in hosted)
        alive = schedule.versions_alive(w)
        live: set[tuple[int, int]] = set()   # (stage, microbatch) holding activations
        grads: set[int] = set()              # stages whose gradient buffer is allocated
        stepped: set[int] = set()            # stages whose optimizer state is allocated
        extra_of = {s: 0 for s in hosted}
        acts = extra = 0
        line = [(0.0, weights)]
        for e in evs:
            s = e.stage
            last_grad = e.kind == "W" or (e.kind == "B" and s not in split)
            gout = memory[s].grad_out
            if e.kind == "F":
                live.add((s, e.microbatch))
                acts += memory[s].activations
            elif last_grad and (s, e.microbatch) in live:
                live.discard((s, e.microbatch))
                acts -= memory[s].activations + (gout if s in split else 0)
            elif e.kind == "B" and s in split:
                acts += gout
            if last_grad:
                grads.add(s)
            elif e.kind == "U":
                grads.discard(s)
                stepped.add(s)
            n_versions = alive[e.step]
            extra += (n_versions - 1) * memory[s].weights - extra_of[s]
            extra_of[s] = (n_versions - 1) * memory[s].weights
            state = sum(max(memory[x].model_states - 2 * memory[x].weights, 0) for x in stepped)
            t = e.start_s if e.kind == "F" else e.end_s
            line.append((t, weights + sum(memory[x].weights for x in grads) + state + extra + acts))
        out[w] = line
    return out


def _host_effects_of(host_effects: HostEffects | bool, cluster: Cluster) -> HostEffects | None:
    """The record ``simulate(host_effects=...)`` asks for (None: the core model alone)."""
    if isinstance(host_effects, HostEffects):
        return host_effects
    if host_effects is True:
        if cluster.calibration is None:
            raise ValueError(f"host_effects=True takes the calibrated host's record, but cluster "
                             f"{cluster.name!r} is not calibrated: calibrate it (pl.calibrate) or pass a "
                             "HostEffects")
        return cluster.calibration.host_effects
    if host_effects is False or host_effects is None:
        return None
    raise ValueError(f"host_effects={host_effects!r} must be True, False or a HostEffects record")


def _stage_plan(plan: Plan | int, profile: Profile, method: str, options: dict[str, Any]) -> Plan:
    """``plan`` as a checked Plan (an int P: an even straight plan; interleaved: its virtual stages)."""
    if not isinstance(plan, Plan):
        if isinstance(plan, bool) or not isinstance(plan, int):
            raise ScheduleError(f"plan must be a pipelab Plan or an int (stages); got {plan!r}")
        plan = Plan.even(len(profile), plan, batch_size=profile.batch_size)
    plan.validate(profile)
    v = methods.get(method).virtual_stages(options)
    tensor = [s for s in plan.stages if s.tensor > 1]
    if tensor and (v > 1 or _order(method) == "dp"):
        what = f"{v} virtual stages per worker" if v > 1 else "data parallelism alone"
        raise ScheduleError(f"stage {tensor[0].index} has tensor degree {tensor[0].tensor}, but method "
                            f"{method!r} runs {what}; a plan with tensor groups is simulated (and run) "
                            "with a schedule of the plan's own stages: use gpipe, 1f1b-flush, pipedream, "
                            "... or tensor=1")
    if v > 1 and plan.num_stages == plan.num_workers:
        try:
            plan = virtual_plan(plan, profile, v)
        except ValueError as exc:
            raise ScheduleError(str(exc)) from None
    return plan


def _fits(sch: Schedule, plan: Plan, cluster: Cluster, is_dp: bool) -> list[int] | None:
    """Check that ``sch`` fits ``plan`` and ``cluster``; the plan's physical workers (None: the ranks)."""
    if not is_dp and sch.num_stages != plan.num_stages:
        raise ScheduleError(f"schedule has {sch.num_stages} stages but the plan has {plan.num_stages}; "
                            f"build the schedule from this plan")
    if max(max(r) for r in sch.stage_ranks) >= cluster.num_workers:
        raise ScheduleError(f"the schedule uses {sch.num_workers} workers but cluster {cluster.name!r} has "
                            f"{cluster.num_workers}; use a bigger cluster or a plan for this one")
    phys = plan.notes.get("workers") if not is_dp else None
    phys = [int(w) for w in phys] if phys else None
    if max(phys or [0]) >= cluster.num_workers:
        raise ScheduleError(f"plan.notes['workers'] names workers beyond cluster {cluster.name!r}")
    return phys


def tie_allreduce_s(cm: CostModel, profile: Profile, ranges: list[tuple[int, int]], schedule: Schedule,
                    workers: list[int] | None) -> dict[int, float]:
    """Per stage: seconds of the all-reduce of each shared parameter it holds (``Profile.ties`` used on two
    or more stages) among every worker holding a copy, over the cluster's links (pipelab.runtime.ties)."""
    out: dict[int, float] = {}
    for tie, stages in across_stages(profile.ties, ranges):
        ranks = sorted({r for s in stages for r in schedule.stage_ranks[s]})
        secs = cm.allreduce_s(tie.nbytes, [r if workers is None else workers[r] for r in ranks])
        for s in stages:
            out[s] = out.get(s, 0.0) + secs
    return out


def _stage_memory(cm: CostModel, profile: Profile, ranges: list[tuple[int, int]], micro: int,
                  spec: Any, recompute: bool) -> dict[int, StageMemory]:
    """Per stage: the byte terms of :func:`_memory`."""
    buffers = 1 if spec is not None and spec.weights == "pipemare" else 0
    mem: dict[int, StageMemory] = {}
    for s, (a, e) in enumerate(ranges):
        p = cm.param_bytes(a, e)
        gout = -(-int(profile.cut_bytes[e - 1]) // micro) if e < len(profile) else 0
        mem[s] = StageMemory(model_states=(2 + cm.state_factor) * p,
                             activations=cm.activation_bytes(a, e, micro, recompute=recompute), weights=p,
                             buffers=buffers * p, grad_out=gout)
    return mem


def simulate(plan: Plan | int, profile: Profile, cluster: Cluster | str, method: str = "pipedream", *,
             microbatches: int | None = None, minibatches: int | None = None,
             compression: str | float | None = None,
             optimizer: str = "sgd-momentum", memory_bandwidth: float | None = None,
             allreduce_overlap: str = "ddp", allreduce_bandwidth: float | None = None,
             schedule: Schedule | None = None, host_staging_bandwidth: float | None = None,
             host_effects: HostEffects | bool = False, **options: Any) -> SimResult:
    """Simulate ``method`` on ``plan`` with ``profile``'s costs on ``cluster``.

    Args:
        plan: a Plan, or an int P (an even plan); ``chunks=v`` re-splits it into ``v * P`` virtual stages.
        cluster: a Cluster or a spec string (``"flat:2"``, a preset).
        compression: ``"fp16"``, ``"bf16"``, ``"int8"`` or a ratio.
        allreduce_overlap: ``"ddp"`` (behind the backward) or ``"none"`` (after it, as pipelab's runtime).
        host_staging_bandwidth: bytes/s of the device-host copies of CUDA stages over gloo.
        host_effects: ``True`` for the cluster's calibrated record, a record, or ``False`` (the core alone).
    """
    cluster = Cluster.of(cluster)
    host = _host_effects_of(host_effects, cluster)
    plan = _stage_plan(plan, profile, method, options)
    sch = schedule if schedule is not None else build(method, plan, microbatches=microbatches,
                                                      minibatches=minibatches, **options)
    is_dp = _order(method) == "dp" or _order(sch.method) == "dp"
    ranges = [(0, len(profile))] if is_dp else [(s.start, s.end) for s in plan.stages]
    check_tie_methods(profile, ranges, sch)
    tensor = not is_dp and any(s.tensor > 1 for s in plan.stages)
    phys, groups = _tensor_groups(plan, sch, cluster, profile, ranges) if tensor else \
        (_fits(sch, plan, cluster, is_dp), [])
    spec = methods.METHODS.get(sch.method)
    device_profile = per_device(profile, layer_degrees(profile, ranges, [s.tensor for s in plan.stages])) \
        if tensor else profile
    cm = CostModel(device_profile, cluster, compression_ratio=compression_ratio_of(compression),
                   optimizer=optimizer, allreduce_overlap=allreduce_overlap,
                   allreduce_bandwidth=allreduce_bandwidth, host_staging_bandwidth=host_staging_bandwidth)
    micro = 1 if is_dp else sch.microbatches
    if profile.source != "synthetic":   # a synthetic profile's times split into any M (tests, teaching)
        check_divides(profile.batch_size, micro)
    # a backward that reads the newest weights recomputes its forward
    recompute = spec is not None and spec.versions == "latest"
    comm = {s: group_comm(cm, profile, a, e, groups[sch.stage_ranks[s][0]], micro)
            for s, (a, e) in enumerate(ranges) if plan.stages[s].tensor > 1} if tensor else {}
    core = ProfileCosts(cm, ranges, micro, memory_bandwidth, workers=phys, recompute_forward=recompute,
                        tie_s=tie_allreduce_s(cm, device_profile, ranges, sch, phys), tensor_comm=comm)
    costs: Costs = core if host is None else HostCosts(core, host)
    mem = _stage_memory(cm, device_profile, ranges, micro, spec, recompute)
    res = simulate_schedule(sch, costs, batch_size=profile.batch_size, memory=mem,
                            minibatch_scale=sch.microbatches if is_dp else 1)
    res.trace.meta.update(config=plan.config, cluster=cluster.name, model=profile.model)
    if not tensor:
        return res
    ranks = member_numbers([len(g) for g in groups])
    events = [*res.trace.events, *comm_events(res.trace.events, comm, recompute)]
    meta = {**res.trace.meta, "tensor_groups": [list(r) for r in ranks],
            "tensor_devices": [list(g) for g in groups]}
    return dataclasses.replace(res, trace=Trace.from_events(events, **meta),
                               member_events=tuple(member_events(events, ranks)))


def check_tie_methods(profile: Profile, ranges: list[tuple[int, int]], schedule: Schedule) -> None:
    """Refuse, as ``train`` does (:func:`pipelab.ties.check_tie_method`), an asynchronous method whose
    stages would each update their own copy of a parameter shared across stages (``TieError``)."""
    ties = [StageTie(names=tuple((s, tie.name) for s in stages), nbytes=tie.nbytes,
                     shape=tie.shape) for tie, stages in across_stages(profile.ties, ranges)]
    if schedule.method not in methods.METHODS:
        return
    try:
        check_tie_method(ties, schedule)
    except TieError as exc:
        raise TieError(f"pl.simulate refuses what train refuses: {exc}") from None


def _tensor_groups(plan: Plan, schedule: Schedule, cluster: Cluster, profile: Profile,
                   ranges: list[tuple[int, int]]) -> tuple[list[int], list[tuple[int, ...]]]:
    """A plan with tensor groups checked against the profile and placed on ``cluster``: each schedule
    worker's leader device and its group's devices (:func:`pipelab.sim.tensor.place_groups`)."""
    if schedule.num_stages != plan.num_stages:
        raise ScheduleError(f"the {schedule.method} schedule has {schedule.num_stages} stage(s) for a plan "
                            f"of {plan.num_stages}: tensor degrees > 1 run with a schedule of the plan's "
                            "stages")
    if plan.notes.get("workers"):
        raise ScheduleError("plan.notes['workers'] places one device per worker, but this plan's workers are "
                            "tensor groups, which pl.simulate places contiguously (pipelab.sim.tensor); drop "
                            "the note")
    degrees = [plan.stages[s].tensor for s in range(plan.num_stages)]
    try:
        check_priceable(profile, ranges, degrees)
        groups = place_groups(worker_degrees(plan, schedule), cluster)
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None
    return [g[0] for g in groups], groups
