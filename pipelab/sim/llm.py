"""A whole tensor x pipeline x data parallel LLM job, simulated as one pipeline.

``simulate_llm(model, cluster, parallel, method=...)`` builds the method's schedule for ONE pipeline
(``parallel.pipeline`` workers, ``parallel.virtual`` stages each) with :func:`pipelab.schedules.build`
and runs it on the dataflow engine (:mod:`pipelab.schedules.dataflow`): the very schedule the runtime
executes. The other two dimensions are folded in, not simulated device by device:

- tensor parallelism: each action's seconds are its stage's per-device compute plus the stage's
  tensor-group collectives per microbatch (:func:`pipelab.llm.costs.stage_costs`), drawn as ``tensor``
  events at the end of each action;
- data parallelism: the ``d`` pipelines run the same schedule in lockstep, so the step's end (``U``)
  waits for the exposed part of the gradient synchronisation (drawn as ``allreduce``), then the optimizer.

Invariants: the time per iteration is the span of that one pipeline's trace; TFLOP/s per GPU divides the
iteration's FLOPs by ``t * p * d`` GPUs and that time, for model FLOPs (each multiply-add of one forward
and its backward, counted once) and hardware FLOPs (recomputed forwards counted too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelab._display import Described
from pipelab.cluster import Cluster
from pipelab.llm.costs import LlmCosts, stage_costs
from pipelab.llm.devices import DeviceRates
from pipelab.llm.memory import MemoryBreakdown, memory_per_device
from pipelab.llm.parallel import Parallel
from pipelab.llm.shape import Transformer
from pipelab.schedules import build
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import Costs, run
from pipelab.trace import Event, Trace


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one pipeline stage's actions for one microbatch on one device of its tensor group."""

    forward_s: float           # compute of F (recomputation not included)
    backward_input_s: float    # compute of B's input gradient (with a recomputed forward, if any)
    backward_weight_s: float   # compute of the weight gradient (W, or inside B when not split off)
    tensor_forward_s: float    # the tensor group's collectives inside F
    tensor_backward_s: float   # the tensor group's collectives inside B
    send_s: float              # the activation (or its gradient) to the next (previous) stage
    send_bytes: int
    #: of tensor_backward_s, what hides behind the weight-gradient GEMMs when B computes them
    tensor_backward_hidden_s: float = 0.0

    def backward_s(self, split: bool) -> float:
        """Seconds of ``B``: its compute and exposed tensor collectives, with the weight gradients
        unless they are split off as ``W`` (then nothing hides behind them)."""
        if split:
            return self.backward_input_s + self.tensor_backward_s
        return (self.backward_input_s + self.backward_weight_s + self.tensor_backward_s
                - self.tensor_backward_hidden_s)


class FoldedCosts(Costs):
    """Prices of one pipeline's actions: each stage's :class:`StageTimes`, ``U`` the step's end."""

    def __init__(self, stages: Sequence[StageTimes], step_end_s: float, stages_per_worker: int = 1) -> None:
        self.stages = list(stages)
        self.step_end_s = step_end_s / stages_per_worker   # a worker ends the step once, over its U's

    def compute(self, worker: int, action: Action, split: bool) -> float:
        st = self.stages[action.stage]
        if action.kind == "F":
            return st.forward_s + st.tensor_forward_s
        if action.kind == "B":
            return st.backward_s(split)
        if action.kind == "W":
            return st.backward_weight_s
        return self.step_end_s

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        if src == dst:
            return 0.0, 0
        # F sends stage s's output; B sends stage s's input gradient, as large as stage s-1's output
        st = self.stages[action.stage if action.kind == "F" else action.stage - 1]
        return st.send_s, st.send_bytes

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        return grad_s, 0.0, 0    # one pipeline has no replicas: data parallelism is in U's price


@dataclass(frozen=True, repr=False)
class LlmResult(Described):
    """One iteration of a whole LLM job, from its one simulated pipeline (times in s, bytes, FLOPs)."""

    model: Transformer
    parallel: Parallel
    cluster: str
    method: str
    time_per_iteration_s: float
    model_flops: float              # per iteration, whole job: forward + backward, no recomputation
    hardware_flops: float           # per iteration, whole job: recomputed forwards counted too
    peak_flops_per_gpu: float       # the device's dense peak at the model's precision (its data table)
    bubble_fraction: float          # idle share of each worker before the step's end, mean over workers
    tensor_s: float                 # per device per iteration: seconds of tensor-group collectives
    data_exposed_s: float           # per iteration: gradient synchronisation not hidden behind compute
    optimizer_s: float             # per iteration, with the sharding's gathers when sharded
    memory: tuple[MemoryBreakdown, ...]   # per pipeline worker (device of that stage's tensor group)
    memory_limit: int
    schedule: Schedule = field(repr=False)
    trace: Trace = field(repr=False)
    costs: LlmCosts | None = field(default=None, repr=False)

    @property
    def gpus(self) -> int:
        """Devices of the whole job: tensor x pipeline x data."""
        p = self.parallel
        return p.tensor * p.pipeline * p.data

    @property
    def model_tflops_per_gpu(self) -> float:
        """Model FLOPs per second per GPU, in TFLOP/s."""
        return self.model_flops / self.time_per_iteration_s / self.gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        """Hardware FLOPs (recomputation counted) per second per GPU, in TFLOP/s."""
        return self.hardware_flops / self.time_per_iteration_s / self.gpus / 1e12

    @property
    def model_flops_utilization(self) -> float:
        """Model FLOP/s per GPU as a share of the device's peak (MFU)."""
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops_per_gpu

    @property
    def hardware_flops_utilization(self) -> float:
        """Hardware FLOP/s per GPU as a share of the device's peak (HFU)."""
        return self.hardware_tflops_per_gpu * 1e12 / self.peak_flops_per_gpu

    @property
    def peak_memory(self) -> int:
        """The largest per-device memory over the pipeline's stages, bytes."""
        return max(int(m.total) for m in self.memory)

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second by the whole job."""
        p = self.parallel
        return p.data * p.microbatches * p.microbatch_size * self.model.seq / self.time_per_iteration_s

    def describe(self) -> str:
        """What was simulated, the time, both FLOP rates, the bubble and memory per device."""
        p = self.parallel
        gib = 2**30
        lines = [
            f"{self.model.name} on {self.gpus} GPUs ({self.cluster}), {self.method}: simulated one pipeline "
            f"of {p.pipeline} stages x {p.virtual} virtual; tensor parallelism t={p.tensor} folded into each "
            f"stage's cost, data parallelism d={p.data} folded into the step's end",
            f"  time per iteration {self.time_per_iteration_s:.3f} s "
            f"({p.data * p.microbatches * p.microbatch_size} sequences, {self.tokens_per_s:,.0f} tokens/s)",
            f"  model FLOPs:    {self.model_tflops_per_gpu:6.1f} TFLOP/s per GPU = "
            f"{self.model_flops_utilization:5.1%} of peak (MFU)",
            f"  hardware FLOPs: {self.hardware_tflops_per_gpu:6.1f} TFLOP/s per GPU = "
            f"{self.hardware_flops_utilization:5.1%} of peak (HFU, recomputation counted)",
            f"  pipeline bubble {self.bubble_fraction:.1%}; tensor collectives {self.tensor_s:.3f} s/device; "
            f"exposed data-parallel sync {self.data_exposed_s:.3f} s; optimizer {self.optimizer_s:.3f} s",
            f"  memory per device: peak {self.peak_memory / gib:.1f} GiB of "
            f"{self.memory_limit / gib:.1f} GiB "
            f"(stage 0: {_parts_text(self.memory[0])})",
        ]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line for tables."""
        return (f"{self.time_per_iteration_s:.3f} s/iteration, {self.model_tflops_per_gpu:.1f} TFLOP/s/GPU "
                f"(MFU {self.model_flops_utilization:.1%}), bubble {self.bubble_fraction:.1%}, "
                f"{self.peak_memory / 2**30:.1f} GiB")


def model_flops(model: Transformer, sequences: int) -> float:
    """Model FLOPs of one iteration over ``sequences`` sequences: forward and backward, each counted once."""
    return float(model.flops_per_iteration(sequences))


def hardware_flops(model: Transformer, sequences: int, recompute: str) -> float:
    """FLOPs the devices execute: model FLOPs plus the recomputed forward (``"full"``: every block's;
    ``"selective"``: the attention core's, Korthikanti et al. 2022 §4)."""
    if recompute == "selective-op":
        raise ValueError("recompute='selective-op' is modelled for memory only; its recomputed FLOPs are not")
    extra = 0
    if recompute == "full":
        extra = model.layers * model.block_flops(sequences)["forward"]
    elif recompute == "selective":
        extra = model.layers * sequences * sum(m.flops for m in model.matmuls() if not m.weight)
    return float(model.flops_per_iteration(sequences) + extra)


def _parts_text(m: MemoryBreakdown) -> str:
    return ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in m.parts().items() if k != "total" and v)


#: pipelab's schedule builder (method) for each of Parallel.schedule's pipeline orders
SCHEDULE_METHODS = {"1f1b": "1f1b-flush", "interleaved": "interleaved-1f1b", "zb-h1": "zb-h1",
                    "gpipe": "gpipe"}


def method_of(parallel: Parallel, method: str | None = None) -> tuple[str, dict[str, Any]]:
    """The schedule builder's method name and options for ``parallel.schedule``; ``method``, if given,
    must agree with it. ``ValueError`` naming the valid choices otherwise."""
    order = parallel.schedule
    if order not in SCHEDULE_METHODS:
        raise ValueError(f"Parallel(schedule={order!r}) has no whole-job simulation yet; use schedule in "
                         f"{tuple(SCHEDULE_METHODS)}")
    name = SCHEDULE_METHODS[order]
    if method is not None and method != name:
        raise ValueError(f"method={method!r} disagrees with Parallel(schedule={order!r}) (method {name!r}); "
                         f"set the schedule on the Parallel record, e.g. Parallel(..., schedule="
                         f"{next((k for k, v in SCHEDULE_METHODS.items() if v == method), '1f1b')!r})")
    return name, ({"chunks": parallel.virtual} if order == "interleaved" else {})


def stage_times(model: Transformer, parallel: Parallel, costs: LlmCosts) -> list[StageTimes]:
    """Per schedule stage, the :class:`StageTimes` of ``costs`` (one entry per pipeline worker).

    With ``v`` virtual stages, worker ``w``'s costs split evenly over its chunks ``c * p + w`` (each holds
    ``1 / v`` of its blocks; the embedding and head stay counted on their worker, spread over its chunks).
    A chunk on the last worker sends to the first one over the link of the worker before it."""
    p, v = parallel.pipeline, parallel.virtual
    act = model.bytes_per_element * parallel.microbatch_size * model.seq * model.hidden
    sent = act // parallel.tensor     # each tensor rank sends its slice (Narayanan et al. SC'21 §4.1)
    out = []
    for s in range(p * v):
        w = s % p
        st = costs.stages[w]
        link = costs.stages[w if w < p - 1 else max(p - 2, 0)].p2p_s
        last = s == p * v - 1
        out.append(StageTimes(forward_s=st.forward_s / v, backward_input_s=st.backward_input_s / v,
                              backward_weight_s=st.backward_weight_s / v,
                              tensor_forward_s=st.tensor_comm_forward_s / v,
                              tensor_backward_s=st.tensor_comm_backward_s / v,
                              send_s=0.0 if last else link, send_bytes=0 if last else sent,
                              tensor_backward_hidden_s=st.tensor_comm_backward_hidden_s / v))
    return out


def peak_flops(model: Transformer, cluster: Cluster) -> float:
    """The device's dense matrix-multiply peak at the model's precision (:mod:`pipelab.llm.devices`)."""
    return DeviceRates.of(cluster.devices[0].name).peak_flops(model.precision)


def simulate_llm(model: Transformer, cluster: Cluster | str, parallel: Parallel, *,
                 method: str | None = None, recipe: str = "mixed-adam-fp32-grads") -> LlmResult:
    """Simulate one training iteration of ``model`` on ``cluster`` with ``parallel``'s degrees.

    Args:
        model: the transformer's shape (:class:`pipelab.llm.shape.Transformer`).
        cluster: a Cluster or preset spec (e.g. ``"dgx-a100:3072"``: 3,072 GPUs in nodes of 8).
        parallel: tensor, pipeline, data degrees, microbatches, recomputation, sharding
            (:class:`pipelab.llm.parallel.Parallel`); checked against model and cluster first.
        method: pipelab's method for ``parallel.schedule`` (:data:`SCHEDULE_METHODS`; given, it must
            agree).
        recipe: the precision recipe (:data:`pipelab.llm.memory.RECIPES`): gradient bytes, states.

    Returns:
        An :class:`LlmResult`; its ``trace`` is the one pipeline's, with ``tensor`` and ``allreduce``
        events drawn.
    """
    cluster = Cluster.of(cluster)
    method, options = method_of(parallel, method)
    global_batch = parallel.data * parallel.microbatches * parallel.microbatch_size
    parallel.check(model, cluster, global_batch)
    costs = stage_costs(model, parallel, cluster, recipe=recipe)
    stages = stage_times(model, parallel, costs)
    step_end = costs.dp_exposed_s + costs.sharding_gather_s + costs.optimizer_s
    schedule = build(method, parallel.pipeline, microbatches=parallel.microbatches, **options)
    if schedule.num_stages != len(stages):
        raise ValueError(f"the cost model priced {len(stages)} stages but {method}'s schedule has "
                         f"{schedule.num_stages}")
    events = run(schedule, FoldedCosts(stages, step_end, parallel.virtual))
    end = max(e.end_s for e in events)
    events += _drawn_communication(events, stages, costs.dp_exposed_s / parallel.virtual)
    P = parallel.pipeline
    busy = [0.0] * P
    for e in events:
        if e.kind in ("F", "B", "W"):
            busy[e.worker] += e.end_s - e.start_s
    u_s = step_end
    bubble = sum(1.0 - b / (end - u_s) for b in busy) / P if end > u_s else 0.0
    tensor_s = sum(s.tensor_forward_s + s.tensor_backward_s for s in stages) * parallel.microbatches / P
    trace = Trace.from_events(events, method=method, microbatches=parallel.microbatches, minibatches=1,
                              stages=schedule.num_stages, model=model.name, cluster=cluster.name,
                              config=f"t={parallel.tensor} p={parallel.pipeline} d={parallel.data}",
                              folded=f"one pipeline simulated; tensor t={parallel.tensor} and data "
                                     f"d={parallel.data} folded in")
    per_stage = memory_per_device(model, parallel, recipe=recipe)
    return LlmResult(
        model=model, parallel=parallel, cluster=cluster.name, method=method, time_per_iteration_s=end,
        model_flops=model_flops(model, global_batch), hardware_flops=hardware_flops(model, global_batch,
                                                                                    parallel.recompute),
        peak_flops_per_gpu=peak_flops(model, cluster), bubble_fraction=bubble, tensor_s=tensor_s,
        data_exposed_s=costs.dp_exposed_s, optimizer_s=costs.optimizer_s + costs.sharding_gather_s,
        memory=per_stage,
        memory_limit=int(cluster.devices[0].memory_bytes), schedule=schedule, trace=trace, costs=costs)


def _drawn_communication(events: list[Event], stages: Sequence[StageTimes],
                         dp_exposed_s: float) -> list[Event]:
    """The folded communication as events: each F/B's exposed tensor collectives at its end, the
    exposed data-parallel sync at the start of each ``U``."""
    out = []
    split = any(e.kind == "W" for e in events)     # W split off: nothing hides behind B's GEMMs
    for e in events:
        if e.kind in ("F", "B"):
            st = stages[e.stage]
            secs = st.tensor_forward_s if e.kind == "F" else st.tensor_backward_s - (
                0.0 if split else st.tensor_backward_hidden_s)
            if secs > 0:
                out.append(Event(e.worker, e.stage, "tensor", e.microbatch, e.end_s - secs, e.end_s))
        elif e.kind == "U" and dp_exposed_s > 0:
            out.append(Event(e.worker, e.stage, "allreduce", e.microbatch, e.start_s,
                             e.start_s + dp_exposed_s))
    return out
