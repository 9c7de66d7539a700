"""Measured memory of a real training step: the bytes of the distinct tensor storages alive, op by op.

A :class:`StorageMeter` is a torch dispatch mode. Every operator's outputs that own a storage not seen
before add its bytes; the storage's release (its last tensor gone, autograd's saved copies included)
takes them away. The count is what an allocator without caching or rounding would hold, so its peak is
the quantity :func:`pipelab.llm.memory_per_device` predicts (allocated bytes), measured on any device
torch runs on, the meta device included (shapes only, so a full-size model costs no memory).

Invariants: a storage is counted once however many views share it; storages alive before the meter
starts count only when passed as ``held``, and never when passed to :meth:`StorageMeter.skip` (their
lifetimes are then stated by :meth:`StorageMeter.alloc` and :meth:`StorageMeter.free`, as an emulated
FSDP does); with ``record=True`` the meter keeps the ordered ``("alloc" | "free", key, bytes, stream)``
events, the trace :func:`pipelab.llm.allocator.replay` consumes (operators' storages are on stream
``"default"``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pipelab.llm.allocator import Event


class StorageMeter(TorchDispatchMode):
    """Counts the bytes of live storages created under it (and of ``held``); ``peak`` is their maximum.

    Args:
        held: tensors alive before the step (weights, gradients, inputs), counted from the start.
        record: keep the ordered alloc/free :attr:`events`.
    """

    def __init__(self, held: Iterable[torch.Tensor] = (), *, record: bool = False) -> None:
        super().__init__()
        self.live: dict[Hashable, tuple[int, str]] = {}
        self.skipped: set[int] = set()
        self.current = 0
        self.peak = 0
        self.record = record
        self.events: list[Event] = []
        self._emulated = 0
        for t in held:
            self.track(t)
        self.held = self.current

    def _add(self, key: Hashable, n: int, stream: str) -> None:
        self.live[key] = (n, stream)
        self.current += n
        self.peak = max(self.peak, self.current)
        if self.record:
            self.events.append(("alloc", key, n, stream))

    def track(self, t: Any) -> None:
        """Count ``t``'s storage if it is a tensor whose storage is new to the meter and not skipped."""
        if not isinstance(t, torch.Tensor) or t.is_sparse:
            return
        st = t.untyped_storage()
        key, n = st._cdata, st.nbytes()
        if n == 0 or key in self.live or key in self.skipped:
            return
        self._add(key, n, "default")
        weakref.finalize(st, self.free, key).atexit = False

    def skip(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never count these tensors' storages (views of them included)."""
        self.skipped.update(t.untyped_storage()._cdata for t in tensors)

    def alloc(self, nbytes: int, stream: str = "default") -> Hashable:
        """Count an allocation no operator makes (an emulated buffer) on ``stream``; its key."""
        self._emulated += 1
        key = ("emulated", self._emulated)
        self._add(key, nbytes, stream)
        return key

    def free(self, key: Hashable) -> None:
        """Release what ``key`` names (a storage the meter counted, or an :meth:`alloc`)."""
        if key not in self.live:
            return
        n, stream = self.live.pop(key)
        self.current -= n
        if self.record:
            self.events.append(("free", key, n, stream))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self.track(t)
        return out


@dataclass(frozen=True)
class MeasuredStep:
    """Bytes of one measured step: alive before it (``held``) and at its peak."""

    held: int
    peak: int

    @property
    def transient(self) -> int:
        """What the step added at its peak."""
        return self.peak - self.held


def measure_step(step: Callable[[], Any], held: Iterable[torch.Tensor] = ()) -> MeasuredStep:
    """Run ``step()`` under a :class:`StorageMeter` and return its held and peak bytes.

    Args:
        held: the tensors alive before the step that the peak should include (weights, their gradients
            where they persist between steps, the batch).
    """
    with StorageMeter(held) as meter:
        step()
    return MeasuredStep(held=meter.held, peak=meter.peak)
