"""What the profiler measures with: a timer, how many runs, and a counter of the bytes autograd saves."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a (nested) value, in order."""
    out: list[torch.Tensor] = []
    fx.node.map_aggregate(value, lambda v: out.append(v) if isinstance(v, torch.Tensor) else None)
    return out


def detach(value: Any) -> Any:
    """``value`` with every tensor in it detached."""
    return fx.node.map_aggregate(value, lambda v: v.detach() if isinstance(v, torch.Tensor) else v)


class Timer:
    """Seconds of a region: ``perf_counter`` on CPU, CUDA events (then a sync) on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self) -> Any:
        """Mark the region's start; pass the result to :meth:`stop`."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, started: Any) -> float:
        """Seconds since ``started`` (the value :meth:`start` returned)."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return float(started.elapsed_time(end)) / 1e3
        return time.perf_counter() - started


@dataclass(frozen=True)
class Timing:
    """``warmup`` untimed runs, then ``repeats`` timed by ``timer``; a time is their median."""

    timer: Timer
    warmup: int = 1
    repeats: int = 3


class SavedBytes:
    """Counts the unique storages autograd saves for backward, weights (storage addresses ``params``)
    excluded; a saved input (``inputs``: storage address -> value name) goes to ``saved_inputs``
    instead, so that the profiler counts it once, at the layer that produces it."""

    def __init__(self, params: set[int], inputs: dict[int, str] | None = None) -> None:
        self.params, self.inputs = params, inputs or {}
        self.storages: dict[int, int] = {}
        self.saved_inputs: dict[str, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """The ``saved_tensors_hooks`` pack hook: count ``t``'s storage, return ``t``."""
        try:
            st = t.untyped_storage()
            value = self.inputs.get(st.data_ptr())
            if value is not None:
                self.saved_inputs[value] = max(self.saved_inputs.get(value, 0), st.nbytes())
            # weights (and views of them, e.g. a transposed weight) are not activations
            elif st.data_ptr() not in self.params:
                self.storages[st.data_ptr()] = max(self.storages.get(st.data_ptr(), 0), st.nbytes())
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. sparse)
            self.storages[id(t)] = t.numel() * t.element_size()
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        """The unpack hook: the tensor itself."""
        return t

    @property
    def total(self) -> int:
        """Bytes of the storages counted (inputs and weights left out)."""
        return sum(self.storages.values())
