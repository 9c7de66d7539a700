"""A worker's stages and data: each stage's state, and the feed slicing ``data()`` into microbatches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipelab.graph import StageModule
from pipelab.runtime.job import Job, as_inputs, split_microbatches
from pipelab.runtime.policies import WeightPolicy
from pipelab.runtime.reparam import Reparametrizer
from pipelab.schedules.worker_view import StageReads


class Feed:
    """This worker's view of ``data()`` (restarted when exhausted): minibatch ``k`` in microbatches."""

    def __init__(self, job: Job, device: torch.device) -> None:
        self.job, self.device = job, device
        self._it: Iterator[Any] | None = None
        self._next = 0
        self._cache: dict[int, tuple[list[Any], list[Any]]] = {}
        self._shapes: Any = None

    def _fetch(self) -> tuple[Any, Any]:
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.job.data())
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise ValueError("data() yielded no minibatch")

    def minibatch(self, k: int) -> tuple[list[Any], list[Any]]:
        """Inputs and targets of minibatch ``k`` (item ``resume_step + k`` of ``data()``), split in M."""
        k += self.job.runtime.resume_step
        while self._next <= k:
            x, y = self._fetch()
            xs = as_inputs(x)
            shapes = ([tuple(t.shape) for t in xs], _shape_tree(y))
            if self._shapes is None:
                self._shapes = shapes
            elif shapes != self._shapes:
                raise ValueError(f"minibatch {self._next} of data() has shapes {shapes} but the first had "
                                 f"{self._shapes}; every minibatch must have the same shapes (drop the last "
                                 "partial batch)")
            M = self.job.microbatches
            xs = tuple(t.to(self.device) for t in xs)
            parts_x = [tuple(p) for p in zip(*[split_microbatches(t, M) for t in xs])]
            parts_y = split_microbatches(_to(y, self.device), M)
            self._cache[self._next] = (parts_x, parts_y)
            self._cache.pop(self._next - 2, None)
            self._next += 1
        return self._cache[k]

    def inputs(self, m: int) -> tuple[torch.Tensor, ...]:
        """Model inputs of microbatch ``m``."""
        M = self.job.microbatches
        return self.minibatch(m // M)[0][m % M]

    def targets(self, m: int) -> Any:
        """Targets of microbatch ``m``."""
        M = self.job.microbatches
        return self.minibatch(m // M)[1][m % M]


def _shape_tree(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (tuple, list)):
        return tuple(_shape_tree(v) for v in x)
    return None


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


@dataclass
class Pending:
    """A microbatch between its ``F`` and its last backward action on a stage."""

    inputs: list[torch.Tensor]
    outputs: tuple[Any, ...]
    version: int
    grad_outputs: list[Any] | None = None      # kept from B for W (split backward)
    grad_targets: list[Any] | None = None


class StageState:
    """One stage hosted by this worker: module, optimizer, weight policy, in-flight microbatches."""

    def __init__(self, job: Job, gm: Any, stage: int, device: torch.device, policy_factory: Any,
                 reads: StageReads, tensor: Any = None) -> None:
        start, end = job.ranges[stage]
        self.index = stage
        self.module = StageModule(gm, start, end)
        #: tensor-parallel member (``(Group, model's plan)``): its shard of the stage, and each split
        #: parameter's cut dimension (pipelab.runtime.tensor_parallel)
        self.shard_dims: dict[str, int] = {}
        if tensor is not None:
            from pipelab.runtime.tensor_parallel import shard

            self.shard_dims = shard(self.module.graph_module, tensor[1], tensor[0])
        self.module = self.module.to(device)
        self.params: dict[str, nn.Parameter] = dict(self.module.named_parameters())
        #: calls the module on a stashed weight version (resolved once; see pipelab.runtime.reparam)
        self.reparam = Reparametrizer(self.module)
        trainable = [p for p in self.params.values() if p.requires_grad]
        self.optimizer = job.optimizer(trainable) if trainable else None
        self.policy: WeightPolicy = policy_factory(self.params, stage, reads)
        self.is_first = stage == 0
        self.is_last = stage == job.schedule.num_stages - 1
        self.syncs = job.syncs(stage)     # replicas all-reduce gradients at U
        self.pending: dict[int, Pending] = {}
        self.losses: dict[int, torch.Tensor] = {}
