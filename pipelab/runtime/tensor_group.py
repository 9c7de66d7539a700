"""A schedule worker as a tensor-parallel group of processes: layout, checks, messages, results.

A plan stage of tensor degree ``t`` runs each of its workers on ``t`` processes that execute the same
action list on shards of the stage (:mod:`pipelab.runtime.tensor_parallel`). The schedule's worker
``w`` keeps process rank ``w`` (member 0, the *leader*); the other members take the ranks after every
worker's, group by group (:func:`layout`).

Invariant: only the leader sends and receives the stage's activations and gradients; it broadcasts
what it receives to its group, and every member then holds the same inputs, computes the same
(whole) outputs after the split's all-reduce or gather, and drops its copy of the sends. Each member
all-reduces its shard's gradients with the same shard of the other replicas at ``U``, writes its own
checkpoint file, and returns its shard; the parent concatenates the shards (:func:`join_states`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Schedule
from pipelab.schedules.groups import member_numbers, worker_degrees


def degrees(plan: Plan, schedule: Schedule) -> list[int]:
    """The tensor degree of each schedule worker (``ValueError`` if one hosts stages of two degrees)."""
    if any(s.tensor > 1 for s in plan.stages) and schedule.num_stages != plan.num_stages:
        raise ValueError(f"the {schedule.method} schedule has {schedule.num_stages} stage(s) for a plan of "
                         f"{plan.num_stages}: tensor degrees > 1 run with a schedule of the plan's stages")
    return worker_degrees(plan, schedule)


def layout(plan: Plan, schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Per schedule worker, its group's process ranks, leader first (``()`` when every degree is 1)."""
    ts = degrees(plan, schedule)
    return () if all(t == 1 for t in ts) else member_numbers(ts)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_processes(n: int, *, per_core: int, backend: str, device: str | None) -> None:
    """Refuse ``n`` CPU worker processes beyond ``per_core`` per usable core, saying how many there are.

    What "can run" means here: each worker process computes on one thread and blocks (sleeps) while it
    waits for a message or a collective, so a few share a core and still make progress; beyond
    ``per_core`` per core the busiest ones starve and the run ends in timeouts instead of a result.
    """
    if backend != "gloo" or (device or "cpu") != "cpu":
        return
    cores = usable_cores()
    if n > per_core * cores:
        raise ValueError(f"this job needs {n} worker processes but this machine has {cores} usable core(s) "
                         f"(os.sched_getaffinity), and at most max_per_core={per_core} CPU worker processes "
                         f"per core run well ({per_core * cores}); use a plan with fewer devices "
                         "(Plan.num_devices counts replicas x tensor degree), run it under torchrun across "
                         "machines, or raise max_per_core=")


def check_model(model: torch.nn.Module, plan: Plan) -> None:
    """Refuse a tensor degree that does not divide what the model's split cuts, with the valid ones."""
    from pipelab.runtime.tensor_parallel import check_degree, check_shared, plan_of

    if not any(s.tensor > 1 for s in plan.stages):
        return
    check_shared(model, plan_of(model))
    for s in plan.stages:
        if s.tensor > 1:
            check_degree(model, s.tensor, stage=s.index)


def check_ties(ties: Sequence[Any], plan: Plan) -> None:
    """Refuse a parameter shared by stages of different tensor degrees: its copies would be cut into
    different shards, and the tie's sum runs shard by shard (:func:`tie_process_groups`)."""
    for g in ties:
        ts = {s: plan.stages[s].tensor for s in g.tie.stages}
        if len(set(ts.values())) > 1:
            said = ", ".join(f"stage {s} tensor {t}" for s, t in ts.items())
            raise ValueError(f"parameter {g.tie.name} is shared by stages of different tensor degrees "
                             f"({said}); its copies must be cut alike: give those stages one tensor degree, "
                             "or untie it")


def tie_process_groups(groups: Sequence[Sequence[int]], ties: Sequence[Any], rank: int) -> dict[int, Any]:
    """Per tie group (``pipelab.runtime.ties.TieGroup``, keyed by its ``key``), the process group of this
    rank's shard of the shared parameter: member ``i`` of every holding worker's tensor group (the
    workers themselves when no stage is split); every rank creates all of them, in one order."""
    out: dict[int, Any] = {}
    for g in ties:
        width = len(groups[g.ranks[0]]) if groups else 1
        for i in range(width):
            members = [groups[w][i] if groups else w for w in g.ranks]
            pg = dist.new_group(members)
            if rank in members:
                out[g.key] = pg
    return out


def make_groups(groups: Sequence[Sequence[int]], rank: int) -> Any:
    """Create every tensor group's process group (a collective: every rank calls it, in one order);
    returns this rank's (``None`` for a group of one)."""
    mine = None
    for g in groups:
        if len(g) > 1:
            pg = dist.new_group(list(g))
            if rank in g:
                mine = pg
    return mine


def replica_groups(groups: Sequence[Sequence[int]], stage_ranks: Sequence[Sequence[int]],
                   syncs: Sequence[bool], rank: int) -> dict[int, Any]:
    """Per replicated stage, the process group of this rank's shard across the stage's replicas
    (member ``i`` of each replica's group); every rank creates all of them, in one order."""
    out: dict[int, Any] = {}
    for s, ranks in enumerate(stage_ranks):
        if not syncs[s]:
            continue
        width = len(groups[ranks[0]]) if groups else 1
        for i in range(width):
            members = [groups[w][i] if groups else w for w in ranks]
            pg = dist.new_group(members)
            if rank in members:
                out[s] = pg
    return out


class GroupComm:
    """A member's transport: the leader's messages through ``inner``, broadcast to the group; the other
    members receive by that broadcast only and send nothing."""

    def __init__(self, inner: Any, group: Any, leader: int, is_leader: bool) -> None:
        self.inner, self.group, self.leader, self.is_leader = inner, group, leader, is_leader

    def post(self, r: Any) -> None:
        """Post a receive (the leader)."""
        if self.is_leader:
            self.inner.post(r)

    def wait(self, r: Any) -> list[torch.Tensor]:
        """The tensors of receive ``r``: the leader's, broadcast to every member."""
        if self.is_leader:
            ts = list(self.inner.wait(r))
        else:
            ts = [torch.empty(sp.shape, dtype=sp.torch_dtype) for sp in r.specs]
        out = []
        for t in ts:
            host = t.detach().cpu().contiguous()
            dist.broadcast(host, src=self.leader, group=self.group)
            out.append(host.to(t.device) if self.is_leader else host)
        return out if not self.is_leader else ts

    def send(self, s: Any) -> int:
        """Send (the leader); the bytes sent."""
        return int(self.inner.send(s)) if self.is_leader else 0

    def retire(self, keys: Any) -> None:
        """Release delivered sends (the leader)."""
        if self.is_leader:
            self.inner.retire(keys)

    def allreduce(self, stage: int, flat: torch.Tensor) -> torch.Tensor:
        """This shard's gradients summed with the same shard of the stage's other replicas."""
        return self.inner.allreduce(stage, flat)

    def flush(self) -> None:
        """Wait for the leader's sends."""
        if self.is_leader:
            self.inner.flush()

    def held(self) -> list[torch.Tensor]:
        """Message buffers held (the leader's)."""
        return list(self.inner.held()) if self.is_leader else []

    def close(self) -> None:
        """Close the inner transport."""
        if hasattr(self.inner, "close"):
            self.inner.close()


def join_states(states: Mapping[int, Mapping[str, torch.Tensor]], dims: Mapping[int, Mapping[str, int]],
                groups: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """The whole weights from every process's state: a group's shards joined, member order."""
    from pipelab.runtime.tensor_parallel import unshard

    out: dict[str, torch.Tensor] = {}
    for g in groups or [[r] for r in sorted(states)]:
        parts = [states[r] for r in g if r in states]
        if not parts or not parts[0]:
            continue
        out.update(unshard(parts, dims.get(g[0], {})) if len(parts) > 1 else parts[0])
    return out
