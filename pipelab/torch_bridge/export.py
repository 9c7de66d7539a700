"""pipelab plan + schedule -> torch ``PipelineStage``s and a torch schedule that runs pipelab's order.

The schedule object subclasses torch's ``_PipelineScheduleRuntime``: it sets ``pipeline_order`` to
pipelab's per-worker order and lowers it with torch's ``_prepare_schedule_with_comms``, as torch's
``_load_csv`` does. Everything else (``step``, loss and gradient scaling, p2p, FSDP) is torch's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from pipelab.graph import StageModule, layer_nodes, trace
from pipelab.partition.plan import Plan
from pipelab.schedules import build, torch_api
from pipelab.schedules.actions import Schedule
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.torch_format import to_torch_order
from pipelab.ties import stage_ties
from pipelab.tracing import resolve as resolve_tracing


@dataclass(frozen=True)
class BridgeOptions:
    """The rarely changed settings of :func:`to_torch`.

    Args:
        device: the stages' device (default CUDA under NCCL, else CPU).
        group: the pipeline process group (default the world).
        leaf_modules, depth: as the plan's profile was traced (:func:`pipelab.graph.trace`); default
            the plan's own record (``plan.tracing``).
        scale_grads: divide gradients by the microbatches, so a step's gradient is the minibatch's.
    """

    device: torch.device | str | None = None
    group: Any = None
    leaf_modules: Sequence[type[nn.Module]] = ()
    depth: int | None = None
    scale_grads: bool = True


def _ranges(plan: Plan, schedule: Schedule) -> list[tuple[int, int]]:
    plan.refuse_tensor("the torch bridge (torch.distributed.pipelining runs one process per stage "
                       "replica)", "run a tensor-parallel plan with pl.train / pl.launch, whose workers are "
                       "tensor groups of processes (docs/runtime.md), or use tensor=1")
    if schedule.num_stages != plan.num_stages:
        raise ScheduleError(f"the schedule has {schedule.num_stages} stages but the plan has "
                            f"{plan.num_stages}; build the schedule from this plan (for interleaved and V "
                            "schedules the plan's stages are the virtual stages)")
    return [(s.start, s.end) for s in plan.stages]


def stage_modules(plan: Plan, schedule: Schedule, model: nn.Module, *, rank: int,
                  leaf_modules: Sequence[type[nn.Module]] = (), depth: int | None = None
                  ) -> dict[int, StageModule]:
    """Worker ``rank``'s stages, cut out of ``model`` by ``plan``'s layer ranges with pipelab's fx split
    (:class:`pipelab.graph.StageModule`), sharing the model's parameters."""
    ranges = _ranges(plan, schedule)
    if not 0 <= rank < schedule.num_workers:
        raise ValueError(f"rank {rank} is outside the schedule's workers 0..{schedule.num_workers - 1}")
    gm = trace(model, **resolve_tracing(leaf_modules, depth, recorded=plan.tracing))
    n = len(layer_nodes(gm))
    if plan.num_layers != n:
        raise ValueError(f"the plan is for a model of {plan.num_layers} layers but this model has {n}; "
                         "partition this model's profile (with the same leaf_modules/depth)")
    shared = stage_ties(gm, ranges)
    if shared:   # torch's optimizer step would update each stage's copy with its own gradient alone
        t = shared[0]
        raise ScheduleError(f"parameter {t.name} ({'x'.join(map(str, t.shape))}) is shared by stages "
                            f"{list(t.stages)}; the torch bridge does not sum a shared parameter's gradients "
                            "across stages, so its copies would silently untie. Train with pl.train (which "
                            "sums them before the update), keep every user of it on one stage, or untie it")
    return {s: StageModule(gm, *ranges[s]) for s in schedule.stages_of(rank)}


class _PassThroughGrad(nn.Module):
    """A stage that hands on a received value without gradient as a leaf that requires one.

    torch's split backward (the ``I``/``W`` of zero-bubble schedules) gets a later stage's weight
    gradients wrong when a passed-through value (a second model input, say) has no gradient
    (tests/test_torch_bridge_mp.py has the case); a leaf with one makes them exact, at the cost of that
    input gradient. Used only when the schedule splits backward.
    """

    def __init__(self, module: StageModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: Any) -> Any:
        """The stage's outputs; a received tensor without gradient handed on as a leaf that has one."""
        out = self.module(*inputs)
        if not isinstance(out, tuple):
            return out
        ids = {id(t) for t in inputs}
        return tuple(t.detach().requires_grad_() if id(t) in ids and not t.requires_grad else t
                     for t in out)


@lru_cache(maxsize=1)
def _runtime_class() -> type:
    """torch's ``_PipelineScheduleRuntime`` executing a given order (built once torch's API is checked)."""
    mod = torch_api.require()

    class PipelabSchedule(mod._PipelineScheduleRuntime):  # type: ignore[name-defined]
        """A torch schedule running a pipelab schedule's order (``pipelab_schedule``); torch's ``step()``."""

        def __init__(self, stages: list[Any], n_microbatches: int, loss_fn: Callable[..., torch.Tensor],
                     *, order: dict[int, list[str]], schedule: Schedule, modules: dict[int, StageModule],
                     scale_grads: bool = True) -> None:
            super().__init__(stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
            self.pipelab_schedule = schedule
            self._pipelab_modules = modules
            self.pipeline_order = {r: [mod._Action.from_str(a) for a in row] for r, row in order.items()}
            self._prepare_schedule_with_comms(self.pipeline_order)

        @property
        def stage_modules(self) -> dict[int, nn.Module]:
            """This rank's stage modules as torch runs them (after ``wrap``), by stage index."""
            return {st.stage_index: st.submod for st in self._stages}

        def parameters(self) -> Iterator[nn.Parameter]:
            """This rank's parameters (for its optimizer)."""
            for st in self._stages:
                yield from st.submod.parameters()

        def local_state_dict(self) -> dict[str, torch.Tensor]:
            """This rank's weights, keyed as in the whole model's ``state_dict()`` (detached copies)."""
            return {k: v.detach().clone() for m in self._pipelab_modules.values()
                    for k, v in m.graph_module.state_dict().items()}

    PipelabSchedule.__module__ = __name__
    return PipelabSchedule


def to_torch(plan: Plan, schedule: Schedule | str, model: nn.Module, *,
             loss_fn: Callable[..., torch.Tensor], microbatches: int | None = None,
             wrap: Callable[[int, nn.Module], nn.Module] | None = None,
             options: BridgeOptions | None = None) -> Any:
    """This rank's part of ``plan`` run by ``schedule``, as a torch schedule object to ``.step()``.

    Call it on every rank of an initialized process group, each with the same weights in ``model``.
    Asynchronous methods and replicated stages raise :class:`ScheduleError` saying what to use instead.

    Args:
        schedule: a pipelab :class:`Schedule` for ``plan`` or a method name built with ``microbatches``.
        loss_fn: ``loss_fn(output, target)``, the mean loss of a microbatch.
        wrap: ``wrap(stage, module)`` returns the module to run instead (e.g. ``fully_shard``).
        options: device, process group, tracing rules, gradient scaling (:class:`BridgeOptions`).

    Returns: torch's schedule object (``step(*inputs, target=y, losses=[])``, then ``optimizer.step()``).
    """
    opts = options if options is not None else BridgeOptions()
    group = opts.group
    if isinstance(schedule, str):
        schedule = build(schedule, plan, microbatches=microbatches, minibatches=1)
    elif microbatches is not None and microbatches != schedule.microbatches:
        raise ValueError(f"the schedule runs {schedule.microbatches} microbatches per minibatch, not "
                         f"microbatches={microbatches}; drop microbatches= or build the schedule with it")
    order = to_torch_order(schedule)          # refuses what torch cannot run
    _ranges(plan, schedule)
    torch_api.require()
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("to_torch needs torch.distributed initialized on every rank: run under torchrun "
                           "and call torch.distributed.init_process_group(...) first (or use pipelab's own "
                           "runtime, pl.train, which starts its processes itself)")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size != schedule.num_workers:
        raise ValueError(f"the schedule has {schedule.num_workers} workers but the process group has {size} "
                         f"ranks; start {schedule.num_workers} processes (torchrun --nproc-per-node "
                         f"{schedule.num_workers}) or pass the pipeline group as group=")
    nccl = dist.get_backend(group) == "nccl" and torch.cuda.is_available()
    device = torch.device(opts.device if opts.device is not None else
                          torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
    modules = stage_modules(plan, schedule, model, rank=rank, leaf_modules=opts.leaf_modules,
                            depth=opts.depth)
    split = any("I" in a for row in order.values() for a in row)
    stages = []
    for s, m in modules.items():
        run: nn.Module = _PassThroughGrad(m.to(device)) if split else m.to(device)
        stages.append(PipelineStage(wrap(s, run) if wrap is not None else run, s, schedule.num_stages, device,
                                    group=group))
    return _runtime_class()(stages, schedule.microbatches, loss_fn, order=order, schedule=schedule,
                            modules=modules, scale_grads=opts.scale_grads)
