"""Primitive prices of the cost model: compute, transfers, ports, all-reduce and a replica's minibatch.

Prices are closed forms over named prefix sums of the profile's layers (``forward_prefix[i]``: the
forward seconds of layers ``[0, i)``, and so on for backward, weight-gradient, fixed parts, parameter
bytes and tensors, activation bytes),
so a layer range costs O(1); their assumptions are stated once, in docs/cost_model.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipelab.cluster import Cluster
from pipelab.costs.devices import check_device

if TYPE_CHECKING:
    from pipelab.profile.records import Profile

HBM_BYTES_PER_S = 900e9   # NVIDIA V100 data sheet: 900 GB/s HBM2

#: a replicated stage's all-reduce: ``"ddp"`` layer by layer behind backward, ``"none"`` after it
ALLREDUCE_OVERLAP = ("ddp", "none")

#: float32 bytes per byte on the wire, per codec of ``train(compression=...)`` (int8's scale: negligible)
CODEC_RATIOS: dict[str, float] = {"none": 1.0, "fp16": 2.0, "bf16": 2.0, "int8": 4.0}


def compression_ratio_of(compression: str | float | None = None) -> float:
    """The compression ratio of a codec name (``"fp16"`` -> 2.0; None -> 1.0) or of a number (itself)."""
    if compression is None:
        return 1.0
    if isinstance(compression, str):
        name = compression.lower()
        if name not in CODEC_RATIOS:
            raise ValueError(f"unknown compression {compression!r}; use one of {', '.join(CODEC_RATIOS)}, "
                             "None, or a ratio >= 1")
        return CODEC_RATIOS[name]
    if isinstance(compression, bool) or not isinstance(compression, (int, float)):
        raise ValueError(f"compression={compression!r} must be a codec name or a number >= 1")
    return float(compression)


def span(prefix: np.ndarray, start: int, end: int) -> float:
    """The total of layers ``[start, end)`` from a prefix-sum array (``prefix[end] - prefix[start]``)."""
    return float(prefix[end] - prefix[start])


# optimizer state bytes per parameter byte (momentum buffer; Adam's two moments)
OPTIMIZER_STATE: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class Prices:
    """The records and primitive prices of :class:`~pipelab.costs.CostModel` (see :mod:`pipelab.costs`)."""

    profile: Profile
    cluster: Cluster
    compression_ratio: float = 1.0
    optimizer: str = "sgd-momentum"
    allreduce_overlap: str = "ddp"
    allreduce_bandwidth: float | None = None
    #: CUDA stages over gloo: bytes/s of the two device<->host copies every message and all-reduce pays
    host_staging_bandwidth: float | None = None
    # prefix sums over the profile's layers: index i holds the total of layers [0, i) (the calibrated
    # factor of each kind applied to times), so any range [a, b) costs array[b] - array[a]
    forward_prefix: np.ndarray = field(init=False, repr=False, compare=False)        # forward seconds
    backward_prefix: np.ndarray = field(init=False, repr=False, compare=False)       # backward seconds
    wgrad_prefix: np.ndarray = field(init=False, repr=False, compare=False)          # weight-gradient part
    forward_fixed_prefix: np.ndarray = field(init=False, repr=False, compare=False)  # batch-independent part
    backward_fixed_prefix: np.ndarray = field(init=False, repr=False, compare=False)
    param_bytes_prefix: np.ndarray = field(init=False, repr=False, compare=False)
    param_tensors_prefix: np.ndarray = field(init=False, repr=False, compare=False)
    activation_prefix: np.ndarray = field(init=False, repr=False, compare=False)     # bytes kept for backward
    cuts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_options()
        object.__setattr__(self, "cluster", Cluster.of(self.cluster))
        check_device(self.profile, self.cluster)
        self._prefix_sums()

    def _check_options(self) -> None:
        """Raise ``ValueError`` on a bad compression ratio, optimizer, overlap or bandwidth."""
        def positive(v: object) -> bool:
            return isinstance(v, (int, float)) and math.isfinite(v) and v > 0

        if not (positive(self.compression_ratio) and self.compression_ratio >= 1.0):
            raise ValueError(f"compression_ratio={self.compression_ratio!r} must be a finite number >= 1 "
                             f"(2.0 for fp16 activations, 4.0 for int8)")
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZER_STATE)}")
        if self.allreduce_overlap not in ALLREDUCE_OVERLAP:
            raise ValueError(f"allreduce_overlap={self.allreduce_overlap!r} is not one of "
                             f"{ALLREDUCE_OVERLAP}: 'ddp' overlaps the all-reduce with backward layer by "
                             "layer (PyTorch DDP), 'none' all-reduces after backward (pipelab's runtime)")
        if self.allreduce_bandwidth is not None and not positive(self.allreduce_bandwidth):
            raise ValueError(f"allreduce_bandwidth={self.allreduce_bandwidth!r} must be None (the links' "
                             f"bandwidth) or a finite number of bytes/s > 0")
        hs = self.host_staging_bandwidth
        if hs is not None and not positive(hs):
            raise ValueError(f"host_staging_bandwidth={hs!r} must be None (no staging) or a finite number of "
                             "bytes/s > 0 (a device-to-host copy's speed, e.g. 12e9 over PCIe 3 x16)")

    def _prefix_sums(self) -> None:
        """Fill the prefix sums; times carry the calibrated factor of each kind (``W`` scales with ``B``)."""
        layers = self.profile.layers
        f, b, p, saved, out = (np.array([getattr(layer, k) for layer in layers], dtype=np.float64)
                               for k in ("fwd_s", "bwd_s", "param_bytes", "saved_bytes", "out_bytes"))
        # activations kept for backward: saved_bytes where the profile has them (PipeDream's: outputs),
        # plus what the loss saves, on the last layer (the last stage holds it until its backward)
        loss_saved = float(self.profile.loss_saved_bytes)
        act = saved if saved.sum() > 0 or loss_saved > 0 else out
        act = np.concatenate([act[:-1], act[-1:] + loss_saved])
        for label, arr in (("fwd_s", f), ("bwd_s", b), ("param_bytes", p), ("activation bytes", act)):
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"profile has NaN, infinite or negative {label}; fix the profile")
        cal = self.cluster.calibration
        kf, kb = (cal.factor("F"), cal.factor("B")) if cal is not None else (1.0, 1.0)
        # weight-gradient part of each backward (half where the profiler did not measure it)
        w = np.array([layer.bwd_s / 2 if layer.wgrad_s is None else layer.wgrad_s for layer in layers])
        sums: dict[str, Any] = {"forward_prefix": f * kf, "backward_prefix": b * kb, "wgrad_prefix": w * kb,
                                "param_bytes_prefix": p, "activation_prefix": act,
                                "forward_fixed_prefix": [layer.fwd_fixed_s * kf for layer in layers],
                                "backward_fixed_prefix": [layer.bwd_fixed_s * kb for layer in layers],
                                "param_tensors_prefix": [layer.param_tensors or 0 for layer in layers]}
        for name, values in sums.items():
            object.__setattr__(self, name, np.concatenate([np.zeros(1), np.cumsum(values)]))
        object.__setattr__(self, "cuts", np.array(self.profile.cut_bytes, dtype=np.float64))

    @property
    def num_layers(self) -> int:
        """Layers in the profile."""
        return len(self.profile)

    def _range(self, start: int, end: int) -> None:
        n = len(self.profile)
        if not (0 <= start < end <= n):
            raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{n}")

    def overhead_s(self, kind: str) -> float:
        """The runtime's own seconds per action of ``kind`` (F, B, W, U); 0 on an uncalibrated cluster."""
        cal = self.cluster.calibration
        return cal.overhead(kind) if cal is not None else 0.0

    def layers_s(self, start: int, end: int, worker: int, microbatches: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of the layers alone for one microbatch, without the runtime's work."""
        self._range(start, end)
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches} must be >= 1")
        speed = self.cluster.speed(worker)
        fixed_f = self.forward_fixed_prefix[end] - self.forward_fixed_prefix[start]
        fixed_b = self.backward_fixed_prefix[end] - self.backward_fixed_prefix[start]
        f = fixed_f + (self.forward_prefix[end] - self.forward_prefix[start] - fixed_f) / microbatches
        b = fixed_b + (self.backward_prefix[end] - self.backward_prefix[start] - fixed_b) / microbatches
        return float(f) / speed, float(b) / speed

    def compute_s(self, start: int, end: int, worker: int, microbatches: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of one microbatch: :meth:`layers_s` plus :meth:`runtime_work_s`."""
        f, b = self.layers_s(start, end, worker, microbatches)
        rf, rb = self.runtime_work_s(start, end)
        return f + rf, b + rb

    def runtime_work_s(self, start: int, end: int) -> tuple[float, float]:
        """The runtime's own (forward, backward) seconds of a stage: per action, plus per message to and
        from each neighbour (0 on an uncalibrated cluster)."""
        into, out = start > 0, end < self.num_layers
        send, recv = self.message_s("send"), self.message_s("recv")
        return (self.overhead_s("F") + into * recv + out * send,
                self.overhead_s("B") + out * recv + into * send)

    def message_s(self, role: str) -> float:
        """The runtime's own seconds per message of ``role`` (``"send"``, ``"recv"``); 0 if uncalibrated."""
        cal = self.cluster.calibration
        return float(cal.message_s.get(role, 0.0)) if cal is not None else 0.0

    def backward_split_s(self, start: int, end: int, worker: int,
                         microbatches: int = 1) -> tuple[float, float]:
        """(``B``, ``W``) seconds of one microbatch with overheads: ``B`` the input gradients (none at the
        first stage), ``W`` every weight gradient plus the input gradients of all layers but the first."""
        fixed = self.runtime_work_s(start, end)[1]     # B takes the gradient in and sends its own out
        b = self.layers_s(start, end, worker, microbatches)[1]
        full = float(self.backward_prefix[end] - self.backward_prefix[start])
        if full <= 0:
            return fixed, self.overhead_s("W")
        wgt = span(self.wgrad_prefix, start, end) / full          # weight-gradient share
        one = start + 1
        first_in = (span(self.backward_prefix, start, one) - span(self.wgrad_prefix, start, one)) / full
        b_in, w = (0.0, b) if start == 0 else (b * (1 - wgt), b * (1 - first_in))
        return b_in + fixed, w + self.overhead_s("W")

    def param_bytes(self, start: int, end: int) -> int:
        """Parameter bytes of layers ``[start, end)``, with its own copy of every shared parameter (a tie,
        ``Profile.ties``) that a layer of the range uses but the profile counted on an earlier layer."""
        self._range(start, end)
        own = int(self.param_bytes_prefix[end] - self.param_bytes_prefix[start])
        return own + self.tie_copy_bytes(start, end)

    def tie_copy_bytes(self, start: int, end: int) -> int:
        """Bytes of the shared parameters that layers ``[start, end)`` use but the profile counts before
        ``start`` (on their first user): the copy a stage of those layers holds."""
        return sum(t.nbytes for t in self.profile.ties
                   if t.layers[0] < start and any(start <= i < end for i in t.layers))

    def param_tensors(self, start: int, end: int) -> int:
        """Parameter tensors of layers ``[start, end)`` (0 for layers whose profile did not count them)."""
        self._range(start, end)
        return int(self.param_tensors_prefix[end] - self.param_tensors_prefix[start])

    def update_s(self, start: int, end: int, worker: int, memory_bandwidth: float | None = None) -> float:
        """Seconds of the optimizer step with the ``U`` overhead: the calibrated step, else weights,
        gradients and state streamed once through memory (the calibrated host's, else HBM2)."""
        cal = self.cluster.calibration
        if memory_bandwidth is None:
            memory_bandwidth = cal.memory_bandwidth if cal is not None else HBM_BYTES_PER_S
        if not memory_bandwidth > 0:
            raise ValueError(f"memory_bandwidth={memory_bandwidth!r} must be > 0 bytes/s")
        nbytes = self.param_bytes(start, end)
        step = cal.optimizer_step_s(self.optimizer, nbytes, self.param_tensors(start, end)) \
            if cal is not None else None
        if step is not None:
            return step / self.cluster.speed(worker) + self.overhead_s("U")
        return nbytes * (3 + self.state_factor) / (memory_bandwidth * self.cluster.speed(worker)) \
            + self.overhead_s("U")

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
        return lv.latency + nbytes / self.compression_ratio / lv.transfer_bandwidth + self.staging_s(nbytes)

    def staging_s(self, nbytes: int) -> float:
        """Seconds of a message's two device<->host copies (0 without ``host_staging_bandwidth``)."""
        if self.host_staging_bandwidth is None:
            return 0.0
        return 2.0 * nbytes / self.compression_ratio / self.host_staging_bandwidth

    def ports(self, src: int, dst: int) -> tuple[Hashable, Hashable]:
        """The sender's egress and the receiver's ingress port of ``src -> dst``, owned by their blocks
        one level below the level crossed (two GPUs of a server share its NIC)."""
        k = self.cluster.level_between(src, dst)
        if k < 0:
            raise ValueError(f"ports({src}, {dst}): a worker does not send to itself over a link")
        inner = self.cluster.block_size(k - 1)
        return ("out", k, src // inner), ("in", k, dst // inner)

    def port_slots(self, port: Hashable) -> int:
        """Transfers a port (from :meth:`ports`) carries at once: its level's ``uplinks``."""
        return self.cluster.levels[port[1]].uplinks  # type: ignore[index]

    def port_share(self, workers: Sequence[int], level: int) -> float:
        """Largest fraction of a stage's round-robin traffic at ``level`` that one port (link) carries."""
        ws = list(workers)
        if not ws:
            raise ValueError("port_share needs at least one worker")
        inner = self.cluster.block_size(level - 1)
        return max(Counter(w // inner for w in ws).values()) / len(ws) / self.cluster.levels[level].uplinks

    def stage_port_s(self, start: int, end: int, workers: Sequence[int], prev: int | None = None,
                     nxt: int | None = None, copies: int = 1) -> float:
        """The partitioners' additive port term: busy seconds per minibatch of a stage's busiest port
        from its own two cuts (both cuts at one level load the same ports: their times add).

        Args:
            workers: the stage's contiguous workers.
            prev, nxt: the previous stage's last and the next's first worker (None at the ends).
            copies: pipelines in disjoint blocks that share the minibatches.
        """
        self._range(start, end)
        ws = list(workers)
        terms: list[tuple[int, float]] = []
        for other, boundary, first in ((prev, start - 1, ws[0]), (nxt, end - 1, ws[-1])):
            if other is None:
                continue
            if not 0 <= boundary < len(self.cuts):
                raise ValueError(f"stage [{start}, {end}) has a neighbour across boundary {boundary}, "
                                 f"which is not a cut of the model")
            k = self.cluster.level_between(other, first)
            if k < 0:
                continue
            x = self.transfer_s(int(self.cuts[boundary]), other, first)
            terms.append((k, x * self.port_share(ws, k) / copies))
        if len(terms) == 2 and terms[0][0] == terms[1][0]:
            return terms[0][1] + terms[1][1]
        return max((t for _, t in terms), default=0.0)

    def allreduce_coeffs(self, workers: Sequence[int], compute_s: float | None = None) -> tuple[float, float]:
        """``(seconds per byte, fixed seconds)`` of a hierarchical (or the cluster's ``"flat"``) ring
        all-reduce over ``workers``; on a calibrated cluster ``compute_s`` before it picks the latency."""
        ws = sorted(set(int(w) for w in workers))
        for w in ws:
            self.cluster.speed(w)
        if len(ws) <= 1:
            return 0.0, 0.0
        cal = self.cluster.calibration
        if cal is not None and len(self.cluster.levels) == 1:
            p = len(ws)
            bw = cal.allreduce_bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
            return 2.0 * (p - 1) / p / bw, 2.0 * (p - 1) * cal.allreduce_latency(compute_s)
        per_byte, fixed = 0.0, 0.0
        crossed = []
        for lv, p, links in self.cluster.ring_levels(ws):
            bw = lv.ring_bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
            crossed.append((bw, lv.latency))
            per_byte += 2.0 * (p - 1) / p / (bw * links)
            fixed += 2.0 * (p - 1) * lv.latency
        if self.cluster.allreduce_ring == "flat" and crossed:
            # one ring through all: as fast as its slowest link, each step the slowest latency crossed
            n = len(ws)
            return (2.0 * (n - 1) / n / min(bw for bw, _ in crossed),
                    2.0 * (n - 1) * max(lat for _, lat in crossed))
        return per_byte, fixed

    def allreduce_latency_steps(self, workers: Sequence[int]) -> float:
        """``2 (p - 1)`` ring latencies where the latency depends on the compute before it
        (``Calibration.allreduce_after``); 0 where :meth:`allreduce_coeffs`' fixed part holds."""
        cal = self.cluster.calibration
        p = len(set(int(w) for w in workers))
        if cal is None or not cal.allreduce_after or len(self.cluster.levels) != 1 or p <= 1:
            return 0.0
        return 2.0 * (p - 1)

    def allreduce_s(self, nbytes: int, workers: Sequence[int], compute_s: float | None = None) -> float:
        """Seconds of an all-reduce of ``nbytes`` over ``workers`` after ``compute_s`` of compute."""
        kappa, fixed = self.allreduce_coeffs(workers, compute_s)
        if kappa == 0.0 or nbytes == 0:
            return 0.0
        staged = 0.0 if self.host_staging_bandwidth is None else 2.0 * nbytes / self.host_staging_bandwidth
        return fixed + kappa * nbytes + staged

    def replica_time_s(self, start: int, end: int, workers: Sequence[int], microbatches: int = 1) -> float:
        """Seconds one replica (the slowest) needs for a whole minibatch with its all-reduce over ``workers``:
        ``F + max_l [B(l..end) + kappa * P(start..l]] + fixed`` (``"ddp"``), ``F + B + kappa * P + fixed``."""
        self._range(start, end)
        ws = list(workers)
        if not ws:
            raise ValueError("replica_time_s needs at least one worker")
        speed = min(self.cluster.speed(w) for w in ws)
        f = span(self.forward_prefix, start, end) / speed + sum(self.runtime_work_s(start, end))
        work = float(f + (self.backward_prefix[end] - self.backward_prefix[start]) / speed)
        kappa, fixed = self.allreduce_coeffs(ws, work)
        if kappa == 0.0:
            return work
        if self.allreduce_overlap == "none":
            return work + self.allreduce_s(int(span(self.param_bytes_prefix, start, end)), ws, work)
        ls = np.arange(start, end)
        pp = self.param_bytes_prefix
        pb = self.backward_prefix
        tail = (pb[end] - pb[ls]) / speed + kappa * (pp[ls + 1] - pp[start])
        return float(f + tail.max() + (fixed if pp[end] > pp[start] else 0.0))

    def replica_time_matrix(self, speed: float, kappa: float, fixed: float, steps: float = 0.0, *,
                            transpose: bool = False) -> np.ndarray:
        """``T[i, j]`` = :meth:`replica_time_s` of ``[i, j)`` for all ranges (``inf`` where ``j <= i``);
        ``steps`` from :meth:`allreduce_latency_steps`; ``transpose=True``: ``T.T``, contiguous over ``i``."""
        n = self.num_layers
        # forward, backward seconds and parameter bytes of layers [0, i), at this speed
        pf, pb, pp = self.forward_prefix / speed, self.backward_prefix / speed, self.param_bytes_prefix
        i = np.arange(n + 1)[:, None]
        j = np.arange(n + 1)[None, :]
        overheads = self.overhead_s("F") + self.overhead_s("B")
        per_cut = self.message_s("send") + self.message_s("recv")
        cuts = ((i > 0).astype(float) + (j < n).astype(float)) * per_cut if per_cut else 0.0
        cal = self.cluster.calibration
        if steps > 0 and cal is not None and cal.allreduce_after:
            work = (pf + pb)[None, :] - (pf + pb)[:, None] + overheads + cuts
            fixed_m: float | np.ndarray = steps * cal.allreduce_latencies(work)
        else:
            fixed_m = fixed
        if kappa == 0.0:
            out = (pf + pb)[None, :] - (pf + pb)[:, None]
        elif self.allreduce_overlap == "none":
            out = (pf + pb + kappa * pp)[None, :] - (pf + pb + kappa * pp)[:, None]
            out += np.where(pp[None, :] > pp[:, None], fixed_m, 0.0)
        else:
            g = kappa * pp[1:] - pb[:-1]          # g[l] = kappa * P[0..l] - B[0..l)
            run = np.where(j[:, 1:] > i, g[None, :], -np.inf)   # [i, l], l < n
            np.maximum.accumulate(run, axis=1, out=run)           # run[i, l] = max g[i..l]
            out = np.empty((n + 1, n + 1))
            out[:, 0] = np.inf
            out[:, 1:] = (pf[None, 1:] - pf[:, None]) + pb[None, 1:] - kappa * pp[:, None] + run
            fx = fixed_m[:, 1:] if isinstance(fixed_m, np.ndarray) else fixed_m
            out[:, 1:] += np.where(pp[None, 1:] > pp[:, None], fx, 0.0)
        out += overheads
        if per_cut:
            out += cuts
        out[j <= i] = np.inf
        return np.ascontiguousarray(out.T) if transpose else out

    @property
    def state_factor(self) -> int:
        """Optimizer state bytes per parameter byte."""
        return OPTIMIZER_STATE[self.optimizer]
