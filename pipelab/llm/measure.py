"""Measured memory of a real training step: the bytes of the distinct tensor storages alive, op by op.

A :class:`StorageMeter` is a torch dispatch mode. Every operator's outputs that own a storage not seen
before add its bytes; the storage's release (its last tensor gone, autograd's saved copies included)
takes them away. The count is what an allocator without caching or rounding would hold, so its peak is
the quantity :func:`pipelab.llm.memory_per_device` predicts (allocated bytes), measured on any device
torch runs on, the meta device included (shapes only, so a full-size model costs no memory).

Invariants: a storage is counted once however many views share it; storages alive before the meter
starts count only when passed as ``held``; with ``record=True`` the meter keeps the ordered
``("alloc" | "free", key, bytes)`` events, the trace an allocator replay consumes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: one trace event: ``("alloc", key, bytes)`` or ``("free", key, bytes)``
Event = tuple[str, int, int]


class StorageMeter(TorchDispatchMode):
    """Counts the bytes of live storages created under it (and of ``held``); ``peak`` is their maximum.

    Args:
        held: tensors alive before the step (weights, gradients, inputs), counted from the start.
        record: keep the ordered alloc/free :attr:`events`.
    """

    def __init__(self, held: Iterable[torch.Tensor] = (), *, record: bool = False) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self.record = record
        self.events: list[Event] = []
        for t in held:
            self.track(t)
        self.held = self.current

    def track(self, t: Any) -> None:
        """Count ``t``'s storage if it is a tensor whose storage is new to the meter."""
        if not isinstance(t, torch.Tensor) or t.is_sparse:
            return
        st = t.untyped_storage()
        key, n = st._cdata, st.nbytes()
        if n == 0 or key in self.live:
            return
        self.live[key] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        if self.record:
            self.events.append(("alloc", key, n))
        weakref.finalize(st, self._release, key)

    def _release(self, key: int) -> None:
        n = self.live.pop(key, 0)
        self.current -= n
        if self.record and n:
            self.events.append(("free", key, n))

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
