"""Memory of a stage replica: weights, stashed versions, gradients, optimizer state, activations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelab.costs.prices import OPTIMIZER_STATE, Prices, span


@dataclass(frozen=True)
class Memory(Prices):
    """Memory prices over :class:`Prices` (mixed into :class:`~pipelab.costs.CostModel`)."""

    def activation_bytes(self, start: int, end: int, microbatches: int = 1, *,
                         recompute: bool = False) -> int:
        """Bytes one in-flight microbatch keeps on a stage until its backward: what autograd saves, the
        input, and the output where no layer saves it (with ``recompute``: input and output only)."""
        self._range(start, end)
        inp = self.profile.input_bytes if start == 0 else int(self.cuts[start - 1])
        if recompute:
            out = int(self.cuts[end - 1]) if end < len(self.profile) else 0
            return -(-(inp + out) // microbatches)
        last = self.profile.layers[end - 1]
        held_out = last.out_bytes if end < len(self.profile) and last.out_saved is False else 0
        return -(-int(span(self.activation_prefix, start, end) + inp + held_out) // microbatches)

    def memory_bytes(self, start: int, end: int, *, versions: int, in_flight: int,
                     microbatches: int = 1) -> dict[str, int]:
        """Peak bytes of one replica of ``[start, end)`` by part, and their ``total``."""
        if versions < 1 or in_flight < 1:
            raise ValueError(f"versions={versions} and in_flight={in_flight} must be >= 1")
        p = self.param_bytes(start, end)
        parts = {"weights": p, "stashed_weights": (versions - 1) * p, "gradients": p,
                 "optimizer": OPTIMIZER_STATE[self.optimizer] * p,
                 "activations": in_flight * self.activation_bytes(start, end, microbatches)}
        parts["total"] = sum(parts.values())
        return parts

    def memory_arrays(self, microbatches: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(P, A)`` over ranges ``[i, j)``: parameter bytes and one microbatch's activation bytes."""
        inp = np.concatenate([[float(self.profile.input_bytes)], self.cuts, [0.0]])
        layers, n = self.profile.layers, len(self.profile)
        out = np.array([0.0] + [float(layers[j - 1].out_bytes) if j < n and layers[j - 1].out_saved is False
                                else 0.0 for j in range(1, n + 1)])
        p = self.param_bytes_prefix[None, :] - self.param_bytes_prefix[:, None]
        acts = self.activation_prefix
        a = np.ceil((acts[None, :] - acts[:, None] + inp[:, None] + out[None, :]) / microbatches)
        return p, a
