"""Tied parameters in a run: one logical weight held by several stages, kept bit-identical.

Rule (synchronous methods): every stage whose module holds a shared parameter keeps its own copy; at
each minibatch, before the first ``U`` a worker executes, the workers holding a copy (every replica
of every holding stage) sum their copies' gradients in one all-reduce per tie (ties in the order of
:func:`pipelab.ties.stage_ties`), each copy's gradient becomes that sum, and each stage's ``U`` then
applies the same optimizer step to the same weights with the same gradient, so the copies stay equal
bit for bit. The gradient summed is exactly the plain model's: autograd sums a shared tensor's uses.
A tied parameter takes no part in its stage's replica all-reduce (the tie's all-reduce covers the
replicas). Megatron-LM's embedding group and DeepSpeed's ``TiedLayerSpec`` do the same.

Asynchronous methods: the tied weight's version on each stage is the version the schedule names there.
Where every holding stage reads the same version of each microbatch and all update once per minibatch
(PipeDream-2BW and the bounded buffer: minibatch ``t`` reads ``W(t - d)`` everywhere), the same rule
holds and the run is delayed SGD on the whole tied model. Otherwise (PipeDream's stashing, PipeMare,
naive-async, HetPipe: per-microbatch updates at each stage's own time) the copies would follow their
own versions, and :func:`check_tie_method` refuses the run before any process starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pipelab.schedules.actions import Schedule
from pipelab.ties import StageTie
from pipelab.ties import TieError as TieError
from pipelab.ties import check_tie_method as check_tie_method
from pipelab.ties import version_split as version_split


@dataclass(frozen=True)
class TieGroup:
    """One shared parameter in a run: the stages and workers holding a copy."""

    index: int
    tie: StageTie
    ranks: tuple[int, ...]          # every worker holding a copy (replicas included), ascending

    @property
    def key(self) -> int:
        """Its process-group key in a driver's ``groups`` (negative: stages use 0, 1, ...)."""
        return -1 - self.index


def tie_groups(ties: Sequence[StageTie], schedule: Schedule) -> tuple[TieGroup, ...]:
    """The run's tie groups: for each shared parameter, the workers hosting a stage that holds it."""
    return tuple(TieGroup(i, t, tuple(sorted({r for s in t.stages for r in schedule.stage_ranks[s]})))
                 for i, t in enumerate(ties))


def check_schedule(groups: Sequence[TieGroup], schedule: Schedule) -> None:
    """Each worker's first ``U`` of a minibatch must follow all its backward work of that minibatch on the
    stages holding a tie (true of every flush schedule); raise :class:`TieError` naming the action if not."""
    M = schedule.microbatches
    for g in groups:
        for w in g.ranks:
            acts = schedule.actions[w]
            hosted = set(g.tie.stages) & set(schedule.stages_of(w))
            first_u: dict[int, int] = {}
            seen_u: dict[int, int] = {}
            for i, a in enumerate(acts):
                if a.kind == "U":
                    k = seen_u.get(a.stage, 0)
                    seen_u[a.stage] = k + 1
                    first_u.setdefault(k, i)
            for i, a in enumerate(acts):
                if a.kind in ("B", "W") and a.stage in hosted:
                    k = a.microbatch // M
                    if k in first_u and first_u[k] < i:
                        raise TieError(f"parameter {g.tie.name}: worker {w} runs {a} after its first update "
                                       f"of minibatch {k} ({acts[first_u[k]]}), so the tie's gradients "
                                       f"cannot be summed before that update in the {schedule.method} "
                                       "schedule; use gpipe, 1f1b-flush, interleaved-1f1b or zb-h1, or keep "
                                       "the tie's users on one stage")


class TieReducer:
    """One worker's part of its tie groups: which ``U`` sums them, its copies' gradient, the result."""

    def __init__(self, groups: Sequence[TieGroup], schedule: Schedule, rank: int,
                 params: Mapping[int, Mapping[str, torch.nn.Parameter]]) -> None:
        """``params[stage]``: every named parameter (duplicates included) of each stage this worker hosts."""
        self.groups = [g for g in groups if rank in g.ranks]
        #: per group index: this worker's copies (one per hosted stage holding it)
        self.copies: dict[int, list[torch.nn.Parameter]] = {
            g.index: [params[s][g.tie.name_on(s)] for s in g.tie.stages if s in params] for g in self.groups}
        #: parameters of each hosted stage that a tie covers (left out of its replica all-reduce)
        self.tied_ids: dict[int, set[int]] = {s: set() for s in params}
        for g in self.groups:
            for s in g.tie.stages:
                if s in params:
                    self.tied_ids[s].add(id(params[s][g.tie.name_on(s)]))
        #: action index of this worker's first U of each minibatch -> the groups it reduces there
        self.due: dict[int, list[TieGroup]] = {}
        if self.groups:
            seen: dict[int, int] = {}
            firsts: set[int] = set()
            for i, a in enumerate(schedule.actions[rank]):
                if a.kind == "U":
                    k = seen.get(a.stage, 0)
                    seen[a.stage] = k + 1
                    if k not in firsts:
                        firsts.add(k)
                        self.due[i] = list(self.groups)

    def is_tied(self, stage: int, p: torch.nn.Parameter) -> bool:
        """Whether ``p`` of ``stage`` is a tie's copy (summed by the tie's all-reduce, not the replicas')."""
        return id(p) in self.tied_ids.get(stage, set())

    def contribution(self, group: TieGroup) -> torch.Tensor:
        """The sum of this worker's copies' gradients (zeros where a copy got none)."""
        ps = self.copies[group.index]
        total = torch.zeros_like(ps[0]) if ps[0].grad is None else ps[0].grad.detach().clone()
        for p in ps[1:]:
            if p.grad is not None:
                total += p.grad
        return total

    def apply(self, group: TieGroup, total: torch.Tensor) -> None:
        """Give every copy on this worker the summed gradient."""
        for p in self.copies[group.index]:
            p.grad = total.detach().clone().view_as(p)


def copies_equal(state: Mapping[str, torch.Tensor], ties: Sequence[StageTie]) -> list[str]:
    """Names of the ties whose copies in ``state`` (keys without the stage prefix) differ in any bit."""
    bad = []
    for t in ties:
        names = sorted({n.removeprefix("graph_module.") for _, n in t.names} & set(state))
        if any(not torch.equal(state[names[0]], state[n]) for n in names[1:]):
            bad.append(t.name)
    return bad


def describe_groups(groups: Sequence[TieGroup]) -> list[str]:
    """One line per tie group: the parameter, its stages and workers."""
    return [f"{g.tie.name}: stages {list(g.tie.stages)}, workers {list(g.ranks)}, {g.tie.nbytes:,} bytes"
            for g in groups]

