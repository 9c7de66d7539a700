"""The one cost model: compute, point-to-point transfers, all-reduce and memory of a layer range.

Partitioners and the simulator both ask this module what things cost, so a plan's prediction and
a simulated run agree by construction. All times are seconds, sizes bytes.

Assumptions (stated once, used everywhere):

* Compute of layers ``[a, b)`` on worker ``w`` is the profiled time divided by ``cluster.speed(w)``;
  a microbatch of ``minibatch / M`` samples takes ``1/M`` of the minibatch's time (linear in batch
  size, which holds well once a GPU is saturated; small microbatches are slower in reality).
* A transfer of ``n`` bytes from ``a`` to ``b`` takes ``latency + n / compression_ratio / bandwidth``
  of the link it crosses (:meth:`Cluster.link`). Links are full duplex: activations going forward and
  gradients going back use opposite directions and do not slow each other.
* All-reduce of ``n`` bytes over a set of workers is a hierarchical ring (reduce-scatter inside the
  innermost blocks, all-reduce across the next level, all-gather back): at each level with ``p``
  participating sub-blocks it costs ``2 (p - 1) / p * n / bandwidth + 2 (p - 1) * latency``
  (Patarasuk & Yuan's bandwidth-optimal ring), summed over levels. Where a sub-block has several
  uplinks (``Level.uplinks``) the participating GPUs of that sub-block drive them in parallel.
  Gradients are not compressed (compression applies to activations/gradients across cuts only).
* Gradient all-reduce overlaps the backward pass the way DDP does: layer ``l``'s gradient can be
  reduced as soon as its backward finishes, one reduction at a time, in backward order. The finish
  time of one replica's minibatch is then ``F + max_l [B(l..end) + kappa * P(start..l)]``: all of the
  all-reduce hides behind backward except what cannot start before the last (earliest) layers'
  gradients exist (:meth:`CostModel.replica_time_s`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipelab.cluster import Cluster
    from pipelab.profile.records import Profile

# optimizer state bytes per parameter byte (momentum buffer; Adam's two moments)
OPTIMIZER_STATE: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class CostModel:
    """Costs of layer ranges of ``profile`` on ``cluster`` (see the module docstring)."""

    profile: Profile
    cluster: Cluster
    compression_ratio: float = 1.0
    optimizer: str = "sgd-momentum"
    # prefix sums over layers (index i = total of layers [0, i)), filled in __post_init__
    pf: np.ndarray = field(init=False, repr=False, compare=False)
    pb: np.ndarray = field(init=False, repr=False, compare=False)
    pp: np.ndarray = field(init=False, repr=False, compare=False)
    pa: np.ndarray = field(init=False, repr=False, compare=False)
    cuts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.compression_ratio, (int, float)) and math.isfinite(self.compression_ratio)
                and self.compression_ratio >= 1.0):
            raise ValueError(f"compression_ratio={self.compression_ratio!r} must be a finite number >= 1 "
                             f"(2.0 for fp16 activations, 4.0 for int8)")
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZER_STATE)}")
        layers = self.profile.layers
        f = np.array([layer.fwd_s for layer in layers], dtype=np.float64)
        b = np.array([layer.bwd_s for layer in layers], dtype=np.float64)
        p = np.array([layer.param_bytes for layer in layers], dtype=np.float64)
        saved = np.array([layer.saved_bytes for layer in layers], dtype=np.float64)
        # activations stashed for backward: the profile's saved_bytes when it has them, else each
        # layer's output (PipeDream's profiles only record outputs)
        act = saved if saved.sum() > 0 else np.array([layer.out_bytes for layer in layers], dtype=np.float64)
        for label, arr in (("fwd_s", f), ("bwd_s", b), ("param_bytes", p), ("activation bytes", act)):
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"profile has NaN, infinite or negative {label}; fix the profile")
        z = np.zeros(1)
        object.__setattr__(self, "pf", np.concatenate([z, np.cumsum(f)]))
        object.__setattr__(self, "pb", np.concatenate([z, np.cumsum(b)]))
        object.__setattr__(self, "pp", np.concatenate([z, np.cumsum(p)]))
        object.__setattr__(self, "pa", np.concatenate([z, np.cumsum(act)]))
        object.__setattr__(self, "cuts", np.array(self.profile.cut_bytes, dtype=np.float64))

    # ------------------------------------------------------------------ basics
    @property
    def num_layers(self) -> int:
        """Layers in the profile."""
        return len(self.profile)

    def _range(self, start: int, end: int) -> None:
        n = len(self.profile)
        if not (0 <= start < end <= n):
            raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{n}")

    def compute_s(self, start: int, end: int, worker: int, microbatches: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of one microbatch (minibatch / ``microbatches``) of ``[start, end)``."""
        self._range(start, end)
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches} must be >= 1")
        s = self.cluster.speed(worker) * microbatches
        return (float(self.pf[end] - self.pf[start]) / s, float(self.pb[end] - self.pb[start]) / s)

    def param_bytes(self, start: int, end: int) -> int:
        """Parameter bytes of layers ``[start, end)``."""
        self._range(start, end)
        return int(self.pp[end] - self.pp[start])

    def cut_bytes(self, boundary: int, microbatches: int = 1) -> int:
        """Bytes crossing the cut after layer ``boundary`` for one microbatch (gradient back: same size)."""
        if not (0 <= boundary < len(self.cuts)):
            raise ValueError(f"boundary {boundary} is outside 0..{len(self.cuts) - 1} "
                             f"(cuts lie between consecutive layers)")
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches} must be >= 1")
        return -(-int(self.cuts[boundary]) // microbatches)

    def transfer_s(self, nbytes: int, src: int, dst: int) -> float:
        """Seconds to send ``nbytes`` from ``src`` to ``dst`` (compressed by ``compression_ratio``)."""
        if src == dst:
            self.cluster.speed(src)  # validates the index
            return 0.0
        lv = self.cluster.link(src, dst)
        return lv.latency + nbytes / self.compression_ratio / lv.bandwidth

    # ------------------------------------------------------------------ all-reduce
    def allreduce_coeffs(self, workers: Sequence[int]) -> tuple[float, float]:
        """``(seconds per byte, fixed seconds)`` of a hierarchical ring all-reduce over ``workers``."""
        ws = sorted(set(int(w) for w in workers))
        for w in ws:
            self.cluster.speed(w)
        if len(ws) <= 1:
            return 0.0, 0.0
        per_byte, fixed = 0.0, 0.0
        for k, lv in enumerate(self.cluster.levels):
            inner, outer = self.cluster.block_size(k - 1), self.cluster.block_size(k)
            groups: dict[int, set[int]] = {}
            members: dict[int, int] = {}
            for w in ws:
                groups.setdefault(w // outer, set()).add(w // inner)
                members[w // inner] = members.get(w // inner, 0) + 1
            p = max(len(g) for g in groups.values())
            if p <= 1:
                continue
            links = min(lv.uplinks, max(members.values()))
            per_byte += 2.0 * (p - 1) / p / (lv.bandwidth * links)
            fixed += 2.0 * (p - 1) * lv.latency
        return per_byte, fixed

    def allreduce_s(self, nbytes: int, workers: Sequence[int]) -> float:
        """Seconds of a hierarchical ring all-reduce of ``nbytes`` over ``workers`` (0 for one worker)."""
        kappa, fixed = self.allreduce_coeffs(workers)
        return 0.0 if kappa == 0.0 or nbytes == 0 else fixed + kappa * nbytes

    # ------------------------------------------------------------------ a replica's minibatch
    def replica_time_s(self, start: int, end: int, workers: Sequence[int], microbatches: int = 1) -> float:
        """Seconds one replica of ``[start, end)`` needs for a minibatch, all-reduce over ``workers``.

        Backward runs from layer ``end-1`` down to ``start``; layer ``l``'s gradient is all-reduced
        when its backward is done and the previous reduction has finished (DDP-style overlap), so
        ``T = F + max_l [B(l..end) + kappa * P(start..l]] + fixed``. Replicas run at the slowest
        one's speed (they wait for each other in the all-reduce).
        """
        self._range(start, end)
        ws = list(workers)
        if not ws:
            raise ValueError("replica_time_s needs at least one worker")
        speed = min(self.cluster.speed(w) for w in ws)
        kappa, fixed = self.allreduce_coeffs(ws)
        f = (self.pf[end] - self.pf[start]) / speed
        if kappa == 0.0:
            return float(f + (self.pb[end] - self.pb[start]) / speed)
        ls = np.arange(start, end)
        tail = (self.pb[end] - self.pb[ls]) / speed + kappa * (self.pp[ls + 1] - self.pp[start])
        return float(f + tail.max() + (fixed if self.pp[end] > self.pp[start] else 0.0))

    def replica_time_matrix(self, speed: float, kappa: float, fixed: float, *, transpose: bool = False) -> np.ndarray:
        """``T[i, j]`` = :meth:`replica_time_s` of ``[i, j)`` for all ranges at once (``inf`` where ``j <= i``).

        Vectorised: ``max_l`` over ``[i, j)`` is a running maximum along each row of a triangular
        matrix, one ``np.maximum.accumulate`` call. ``transpose=True`` returns ``T.T`` (rows ``j``),
        contiguous for reductions over ``i``.
        """
        n = self.num_layers
        pf, pb, pp = self.pf / speed, self.pb / speed, self.pp
        i = np.arange(n + 1)[:, None]
        j = np.arange(n + 1)[None, :]
        if kappa == 0.0:
            out = (pf + pb)[None, :] - (pf + pb)[:, None]
        else:
            g = kappa * pp[1:] - pb[:-1]          # g[l] = kappa * P[0..l] - B[0..l)
            run = np.where(j[:, 1:] > i, g[None, :], -np.inf)   # [i, l], l < n
            np.maximum.accumulate(run, axis=1, out=run)           # run[i, l] = max g[i..l]
            out = np.empty((n + 1, n + 1))
            out[:, 0] = np.inf
            out[:, 1:] = (pf[None, 1:] - pf[:, None]) + pb[None, 1:] - kappa * pp[:, None] + run
            out[:, 1:] += np.where(pp[None, 1:] > pp[:, None], fixed, 0.0)
        out[j <= i] = np.inf
        return np.ascontiguousarray(out.T) if transpose else out

    # ------------------------------------------------------------------ memory
    def activation_bytes(self, start: int, end: int, microbatches: int = 1) -> int:
        """Bytes one in-flight microbatch keeps on a stage ``[start, end)`` until its backward."""
        self._range(start, end)
        inp = self.profile.input_bytes if start == 0 else int(self.cuts[start - 1])
        return -(-int(self.pa[end] - self.pa[start] + inp) // microbatches)

    def memory_bytes(self, start: int, end: int, *, versions: int, in_flight: int,
                     microbatches: int = 1) -> dict[str, int]:
        """Peak bytes of one replica of ``[start, end)``.

        ``weights`` + ``stashed_weights`` (``versions - 1`` extra copies, PipeDream's weight stashing)
        + ``gradients`` (one buffer) + ``optimizer`` state + ``activations`` of ``in_flight``
        microbatches of ``minibatch / microbatches`` samples each.
        """
        if versions < 1 or in_flight < 1:
            raise ValueError(f"versions={versions} and in_flight={in_flight} must be >= 1")
        p = self.param_bytes(start, end)
        parts = {
            "weights": p,
            "stashed_weights": (versions - 1) * p,
            "gradients": p,
            "optimizer": OPTIMIZER_STATE[self.optimizer] * p,
            "activations": in_flight * self.activation_bytes(start, end, microbatches),
        }
        parts["total"] = sum(parts.values())
        return parts

    def memory_arrays(self, microbatches: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(P, A)`` matrices over ranges ``[i, j)``: parameter bytes and one microbatch's activation bytes.

        Memory of a range with ``v`` versions and ``k`` in flight is ``(v + 1 + opt) * P + k * A``.
        """
        inp = np.concatenate([[float(self.profile.input_bytes)], self.cuts, [0.0]])
        p = self.pp[None, :] - self.pp[:, None]
        a = np.ceil((self.pa[None, :] - self.pa[:, None] + inp[:, None]) / microbatches)
        return p, a

    @property
    def state_factor(self) -> int:
        """Optimizer state bytes per parameter byte."""
        return OPTIMIZER_STATE[self.optimizer]
