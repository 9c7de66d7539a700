"""The memory meter (``measure_memory=True``): each worker's measured peak, in five parts.

After every action: the distinct storages the worker holds, each counted once in the first part
naming it: ``weights`` (stashed versions too), ``gradients``, ``optimizer``, ``activations`` (saved
for in-flight microbatches) and ``messages``. On a CUDA worker the peak is the allocator's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

PARTS = ("weights", "gradients", "optimizer", "activations", "messages")


class _Held:
    """What autograd stores in place of a saved tensor while the meter counts it."""

    __slots__ = ("t", "ptr", "meter")

    def __init__(self, t: torch.Tensor, ptr: int, meter: MemoryMeter) -> None:
        self.t, self.ptr, self.meter = t, ptr, meter

    def __del__(self) -> None:
        self.meter._release(self.ptr)


def _storage(t: Any) -> tuple[int, int] | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):    # no storage (sparse, ...)
        return None
    n = st.nbytes()
    return (st.data_ptr(), n) if n else None


class MemoryMeter:
    """One worker's memory; :meth:`sample` after every action (``cuda``: the allocator's peak)."""

    def __init__(self, stages: dict[int, Any],
                 messages: Callable[[], Iterable[torch.Tensor]] | None = None) -> None:
        self.stages, self.messages = stages, messages
        self.cuda: torch.device | None = None    # set by use_cuda
        self._saved: dict[int, list[int]] = {}      # storage ptr -> [holders alive, nbytes]
        self._weights: set[int] = set()
        self.peak = 0                 # the reported peak (CUDA allocator's, or the storage count)
        self.peak_held = 0            # the storage count's peak
        self.peak_state = 0           # the storage count's peak without messages (the simulator's terms)
        self.breakdown: dict[str, int] = dict.fromkeys(PARTS, 0)   # the storage count at its peak
        self.timeline: list[tuple[int, int]] = []    # (action index, bytes held after it)

    def use_cuda(self, device: torch.device) -> None:
        """Report ``torch.cuda.max_memory_allocated(device)`` from now on (a worker process only)."""
        self.cuda = device
        torch.cuda.reset_peak_memory_stats(device)

    def _pack(self, t: torch.Tensor) -> Any:
        key = _storage(t)
        if key is None or key[0] in self._weights:
            return t
        self._saved.setdefault(key[0], [0, key[1]])[0] += 1
        # a detached alias: a tensor autograd saves may be an output of the very node that saves it
        # (ReLU saves its result); holding it with its grad_fn would make a cycle through C++ that no
        # collector breaks, so a node a split backward never runs (one only on the input's path, run by
        # B with retain_graph) would keep its saved tensors, and the count would grow every minibatch
        return _Held(t.detach(), key[0], self)

    @staticmethod
    def _unpack(h: Any) -> Any:
        return h.t if isinstance(h, _Held) else h

    def _release(self, ptr: int) -> None:
        ent = self._saved.get(ptr)
        if ent is not None:
            ent[0] -= 1
            if ent[0] <= 0:
                del self._saved[ptr]

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Count what autograd saves inside this block (wrap a forward in it)."""
        self._weights = {k[0] for t in self._weight_tensors() if (k := _storage(t)) is not None}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def _weight_tensors(self) -> Iterator[torch.Tensor]:
        for st in self.stages.values():
            pol = st.policy
            yield from st.params.values()
            for version in getattr(pol, "stash", {}).values():
                yield from version.values()
            yield from getattr(pol, "anchor", {}).values()                  # HetPipe
            yield from getattr(getattr(pol, "state", None), "delta", [])     # PipeMare's delta buffer

    def _activation_tensors(self) -> Iterator[Any]:
        for st in self.stages.values():
            for pend in st.pending.values():
                yield from pend.inputs
                yield from pend.outputs
                yield from pend.grad_outputs or ()
                yield from pend.grad_targets or ()

    def count(self) -> dict[str, int]:
        """The bytes held right now, per part (see the module doc), and their ``total``."""
        seen: set[int] = set()
        out = dict.fromkeys(PARTS, 0)

        def add(part: str, tensors: Iterable[Any]) -> None:
            for t in tensors:
                key = _storage(t)
                if key is not None and key[0] not in seen:
                    seen.add(key[0])
                    out[part] += key[1]

        weights = list(self._weight_tensors())
        add("weights", weights)
        add("gradients", (t.grad for t in weights))
        add("optimizer", (v for st in self.stages.values() if st.optimizer is not None
                          for state in st.optimizer.state.values() for v in state.values()))
        for ptr, (_, n) in list(self._saved.items()):   # (autograd may free on its own threads)
            if ptr not in seen:
                seen.add(ptr)
                out["activations"] += n
        add("activations", self._activation_tensors())
        if self.messages is not None:
            add("messages", self.messages())
        out["total"] = sum(out[p] for p in PARTS)
        return out

    def sample(self, step: int) -> int:
        """Count after action ``step``; update the peaks and the timeline; returns the bytes held."""
        c = self.count()
        held = c["total"]
        self.timeline.append((step, held))
        self.peak_state = max(self.peak_state, held - c["messages"])
        if held > self.peak_held:
            self.peak_held = held
            self.breakdown = {p: c[p] for p in PARTS}
        cuda_peak = torch.cuda.max_memory_allocated(self.cuda) if self.cuda is not None else None
        self.peak = self.peak_held if cuda_peak is None else int(cuda_peak)
        return held
