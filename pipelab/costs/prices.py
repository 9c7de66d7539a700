"""Primitive prices of the cost model: compute, transfers, ports, all-reduce and a replica's minibatch.

The assumptions behind every formula are stated once, in docs/cost_model.md.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipelab.costs.devices import check_device, cluster_of

if TYPE_CHECKING:
    from pipelab.cluster import Cluster
    from pipelab.profile.records import Profile

HBM_BYTES_PER_S = 900e9   # NVIDIA V100 data sheet: 900 GB/s HBM2

#: how a replicated stage's gradient all-reduce meets its backward pass (see the module docstring):
#: ``"ddp"`` layer by layer behind backward, ``"none"`` all of it after backward
ALLREDUCE_OVERLAP = ("ddp", "none")

#: bytes on the wire per byte of a float32 activation, per codec of ``train(compression=...)``
#: (:mod:`pipelab.runtime.compress`; large tensors: int8's 4-byte scale per tensor is negligible)
CODEC_RATIOS: dict[str, float] = {"none": 1.0, "fp16": 2.0, "bf16": 2.0, "int8": 4.0}


def compression_ratio_of(compression: str | float | None = None) -> float:
    """The activation compression ratio of a codec name of ``train(compression=...)`` (``"fp16"`` -> 2.0,
    ``"int8"`` -> 4.0, None or ``"none"`` -> 1.0), or of a number (the ratio itself)."""
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
    #: CUDA stages over gloo (``train(device="cuda")``): bytes/s of a device<->host copy; every message
    #: then pays a device-to-host copy at the sender and a host-to-device copy at the receiver around the
    #: host transfer, and an all-reduce the same two copies of the gradients. None: no staging (NCCL, CPU)
    host_staging_bandwidth: float | None = None
    # prefix sums over layers (index i = total of layers [0, i)), filled in __post_init__
    pf: np.ndarray = field(init=False, repr=False, compare=False)
    pb: np.ndarray = field(init=False, repr=False, compare=False)
    pw: np.ndarray = field(init=False, repr=False, compare=False)
    qf: np.ndarray = field(init=False, repr=False, compare=False)
    qb: np.ndarray = field(init=False, repr=False, compare=False)
    pp: np.ndarray = field(init=False, repr=False, compare=False)
    pt: np.ndarray = field(init=False, repr=False, compare=False)
    pa: np.ndarray = field(init=False, repr=False, compare=False)
    cuts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.compression_ratio, (int, float)) and math.isfinite(self.compression_ratio)
                and self.compression_ratio >= 1.0):
            raise ValueError(f"compression_ratio={self.compression_ratio!r} must be a finite number >= 1 "
                             f"(2.0 for fp16 activations, 4.0 for int8)")
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZER_STATE)}"
            )
        if self.allreduce_overlap not in ALLREDUCE_OVERLAP:
            raise ValueError(
                f"allreduce_overlap={self.allreduce_overlap!r} is not one of {ALLREDUCE_OVERLAP}: "
                f"'ddp' overlaps the all-reduce with backward layer by layer (PyTorch DDP), "
                f"'none' all-reduces after backward (pipelab's runtime)"
            )
        if self.allreduce_bandwidth is not None and not (
                isinstance(self.allreduce_bandwidth, (int, float)) and math.isfinite(self.allreduce_bandwidth)
                and self.allreduce_bandwidth > 0):
            raise ValueError(f"allreduce_bandwidth={self.allreduce_bandwidth!r} must be None (the links' "
                             f"bandwidth) or a finite number of bytes/s > 0")
        hs = self.host_staging_bandwidth
        if hs is not None and not (isinstance(hs, (int, float)) and math.isfinite(hs) and hs > 0):
            raise ValueError(f"host_staging_bandwidth={hs!r} must be None (no staging) or a finite number of "
                             "bytes/s > 0 (a device-to-host copy's speed, e.g. 12e9 over PCIe 3 x16)")
        object.__setattr__(self, "cluster", cluster_of(self.cluster))
        check_device(self.profile, self.cluster)
        layers = self.profile.layers
        f = np.array([layer.fwd_s for layer in layers], dtype=np.float64)
        b = np.array([layer.bwd_s for layer in layers], dtype=np.float64)
        p = np.array([layer.param_bytes for layer in layers], dtype=np.float64)
        saved = np.array([layer.saved_bytes for layer in layers], dtype=np.float64)
        # activations stashed for backward: the profile's saved_bytes when it has them, else each
        # layer's output (PipeDream's profiles only record outputs)
        loss_saved = float(self.profile.loss_saved_bytes)
        act = saved if saved.sum() > 0 or loss_saved > 0 else np.array([layer.out_bytes for layer in layers],
                                                                        dtype=np.float64)
        # what the loss saves for its backward belongs to the last layer's range: the last stage computes
        # the loss inside its forward and holds it until its backward (0 where the profile has none)
        act = np.concatenate([act[:-1], act[-1:] + loss_saved])
        for label, arr in (("fwd_s", f), ("bwd_s", b), ("param_bytes", p), ("activation bytes", act)):
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"profile has NaN, infinite or negative {label}; fix the profile")
        z = np.zeros(1)
        # the layers' times as they run inside a run of this machine: the profile's, times the
        # calibrated factor of each kind (1 without a calibration of the model; W scales with B)
        cal = self.cluster.calibration
        kf, kb = (cal.factor("F"), cal.factor("B")) if cal is not None else (1.0, 1.0)
        object.__setattr__(self, "pf", np.concatenate([z, np.cumsum(f * kf)]))
        object.__setattr__(self, "pb", np.concatenate([z, np.cumsum(b * kb)]))
        # weight-gradient part of each backward (measured by the profiler; half where it is unknown)
        w = np.array([layer.bwd_s / 2 if layer.wgrad_s is None else layer.wgrad_s for layer in layers])
        object.__setattr__(self, "pw", np.concatenate([z, np.cumsum(w * kb)]))
        # fixed (batch-independent) parts of the times, for microbatches (see the module docstring)
        object.__setattr__(
            self, "qf", np.concatenate([z, np.cumsum([layer.fwd_fixed_s * kf for layer in layers])])
        )
        object.__setattr__(
            self, "qb", np.concatenate([z, np.cumsum([layer.bwd_fixed_s * kb for layer in layers])])
        )
        object.__setattr__(self, "pp", np.concatenate([z, np.cumsum(p)]))
        # parameter tensors (an optimizer step pays per tensor; 0 where the profile did not count them)
        tensors = [layer.param_tensors or 0 for layer in layers]
        object.__setattr__(self, "pt", np.concatenate([z, np.cumsum(tensors)]))
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

    def overhead_s(self, kind: str) -> float:
        """The runtime's own seconds per action of ``kind`` (F, B, W, U) on a calibrated cluster
        (:attr:`pipelab.cluster.Cluster.calibration`), 0 otherwise."""
        cal = self.cluster.calibration
        return cal.overhead(kind) if cal is not None else 0.0

    def layers_s(self, start: int, end: int, worker: int, microbatches: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of the layers ``[a, b)`` alone for one microbatch: affine in the
        batch, times the calibrated factor of each kind inside a run (``Calibration.compute_factor``,
        1 without one), divided by the worker's speed, without the runtime's per-action work."""
        self._range(start, end)
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches} must be >= 1")
        speed = self.cluster.speed(worker)
        qf, qb = self.qf[end] - self.qf[start], self.qb[end] - self.qb[start]
        f = qf + (self.pf[end] - self.pf[start] - qf) / microbatches
        b = qb + (self.pb[end] - self.pb[start] - qb) / microbatches
        return float(f) / speed, float(b) / speed

    def compute_s(self, start: int, end: int, worker: int, microbatches: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of one microbatch (``minibatch / microbatches``) of ``[a, b)``:
        the layers' times (affine in the batch, divided by the worker's speed) plus the runtime's
        per-action overhead of a calibrated cluster."""
        f, b = self.layers_s(start, end, worker, microbatches)
        rf, rb = self.runtime_work_s(start, end)
        return f + rf, b + rb

    def runtime_work_s(self, start: int, end: int) -> tuple[float, float]:
        """The runtime's own seconds in the forward and in the backward of stage ``[start, end)`` on
        a calibrated cluster (0 otherwise): per action, plus per message. A stage with a neighbour
        receives its input and sends its output (forward), and the other way round for gradients
        (backward)."""
        into, out = start > 0, end < self.num_layers
        send, recv = self.message_s("send"), self.message_s("recv")
        return (self.overhead_s("F") + into * recv + out * send,
                self.overhead_s("B") + out * recv + into * send)

    def message_s(self, role: str) -> float:
        """The runtime's own seconds per message on the ``"send"``-ing or ``"recv"``-ing worker of a
        calibrated cluster, 0 otherwise."""
        cal = self.cluster.calibration
        return float(cal.message_s.get(role, 0.0)) if cal is not None else 0.0

    def backward_split_s(self, start: int, end: int, worker: int,
                         microbatches: int = 1) -> tuple[float, float]:
        """(input gradient ``B``, weight gradient ``W``) seconds of one microbatch of ``[a, b)`` when
        backward is split (zero bubble), as pipelab's runtime splits it, plus each action's overhead.

        ``B`` differentiates the stage's output with respect to its input only: the chain of input
        gradients of its layers (nothing at the first stage, whose input needs no gradient). ``W``
        then differentiates with respect to the weights, which walks the same chain again down to
        the first layer's weights: every layer's weight gradient plus the input gradients of all
        layers but the first (the whole backward at the first stage). Per layer the split is the
        profile's measured one (``Layer.wgrad_s``; half of the backward where a profile lacks it).
        """
        fixed = self.runtime_work_s(start, end)[1]     # B takes the gradient in and sends its own out
        b = self.layers_s(start, end, worker, microbatches)[1]
        full = float(self.pb[end] - self.pb[start])
        if full <= 0:
            return fixed, self.overhead_s("W")
        wgt = float(self.pw[end] - self.pw[start]) / full          # weight-gradient share
        first_in = float(self.pb[start + 1] - self.pb[start] - (self.pw[start + 1] - self.pw[start])) / full
        if start == 0:
            b_in, w = 0.0, b
        else:
            b_in, w = b * (1 - wgt), b * (1 - first_in)
        return b_in + fixed, w + self.overhead_s("W")

    def param_bytes(self, start: int, end: int) -> int:
        """Parameter bytes of layers ``[start, end)``."""
        self._range(start, end)
        return int(self.pp[end] - self.pp[start])

    def param_tensors(self, start: int, end: int) -> int:
        """Parameter tensors of layers ``[start, end)`` (0 for layers whose profile did not count them)."""
        self._range(start, end)
        return int(self.pt[end] - self.pt[start])

    def update_s(self, start: int, end: int, worker: int, memory_bandwidth: float | None = None) -> float:
        """Seconds of the optimizer step of ``[start, end)``.

        On a calibrated cluster: the measured step of :attr:`optimizer` (fixed seconds, plus seconds
        per parameter byte, plus seconds per parameter tensor) plus the runtime's ``U`` overhead.
        Otherwise the step streams weights, gradients and optimizer state once through device
        memory, ``param_bytes * (3 + state) / memory_bandwidth``, scaled by the worker's speed
        (default bandwidth: the calibrated host's, else a V100's HBM2).
        """
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
        """Seconds of the two host copies (device to host, host to device) of a message of ``nbytes``
        (compressed) when CUDA stages talk over gloo; 0 without ``host_staging_bandwidth``."""
        if self.host_staging_bandwidth is None:
            return 0.0
        return 2.0 * nbytes / self.compression_ratio / self.host_staging_bandwidth

    # ------------------------------------------------------------------ ports (shared by the simulator)
    def ports(self, src: int, dst: int) -> tuple[Hashable, Hashable]:
        """The sender's egress and the receiver's ingress port of a transfer ``src -> dst``.

        At level ``k`` a port belongs to the level-``k-1`` block: a GPU inside a server, the whole
        server across servers, so that two GPUs of one server sending to another server share its
        NIC. Full duplex: egress and ingress are separate ports.
        """
        k = self.cluster.level_between(src, dst)
        if k < 0:
            raise ValueError(f"ports({src}, {dst}): a worker does not send to itself over a link")
        inner = self.cluster.block_size(k - 1)
        return ("out", k, src // inner), ("in", k, dst // inner)

    def port_slots(self, port: Hashable) -> int:
        """Transfers a port (from :meth:`ports`) carries at once: its level's ``uplinks``."""
        return self.cluster.levels[port[1]].uplinks  # type: ignore[index]

    def port_share(self, workers: Sequence[int], level: int) -> float:
        """Largest fraction of a stage's round-robin traffic at ``level`` that one port carries.

        A port at level ``k`` belongs to a level-``k-1`` block and has ``uplinks`` links; round-robin
        gives each of the stage's replicas ``1 / len(workers)`` of the minibatches.
        """
        ws = list(workers)
        if not ws:
            raise ValueError("port_share needs at least one worker")
        inner = self.cluster.block_size(level - 1)
        per: dict[int, int] = {}
        for w in ws:
            per[w // inner] = per.get(w // inner, 0) + 1
        return max(per.values()) / len(ws) / self.cluster.levels[level].uplinks

    def stage_port_s(self, start: int, end: int, workers: Sequence[int], prev: int | None = None,
                     nxt: int | None = None, copies: int = 1) -> float:
        """The partitioners' port term of one stage: busy seconds per minibatch of its busiest port
        from its own two cuts (activation in and gradient out at the input cut, activation out and
        gradient in at the output cut).

        ``workers`` are the stage's (contiguous) workers, ``prev`` the last worker of the previous
        stage and ``nxt`` the first of the next (None at the pipeline's ends); each cut is priced at
        the level of that link. When both cuts cross the same level they load the same ports, so
        their times add (a middle stage's port carries both directions of both cuts); otherwise
        they use different ports. ``copies`` pipelines replicated in disjoint blocks share the
        minibatches. It is additive over stages (what the DP needs) and equals the
        :meth:`steady_state` port term when no port carries traffic of two stages' cuts.
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
        if not terms:
            return 0.0
        if len(terms) == 2 and terms[0][0] == terms[1][0]:
            return terms[0][1] + terms[1][1]
        return max(t for _, t in terms)

    # ------------------------------------------------------------------ all-reduce
    def allreduce_coeffs(self, workers: Sequence[int], compute_s: float | None = None) -> tuple[float, float]:
        """``(seconds per byte, fixed seconds)`` of a hierarchical ring all-reduce over ``workers``
        (at ``allreduce_bandwidth`` per link where it is set), or of one flat ring through them where the
        cluster's ``allreduce_ring`` is ``"flat"``. On a calibrated cluster, ``compute_s``
        (what each replica computed since the last all-reduce) picks the ring's latency
        (:meth:`~pipelab.measured.Calibration.allreduce_latency`; None: the calibration's one)."""
        ws = sorted(set(int(w) for w in workers))
        for w in ws:
            self.cluster.speed(w)
        if len(ws) <= 1:
            return 0.0, 0.0
        cal = self.cluster.calibration
        if cal is not None and len(self.cluster.levels) == 1:
            # the calibrated ring: 2 (p - 1) steps of latency, 2 (p - 1) / p of the data per link
            p = len(ws)
            bw = cal.allreduce_bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
            return 2.0 * (p - 1) / p / bw, 2.0 * (p - 1) * cal.allreduce_latency(compute_s)
        per_byte, fixed = 0.0, 0.0
        crossed = []
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
            bw = lv.ring_bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
            crossed.append((bw, lv.latency))
            per_byte += 2.0 * (p - 1) / p / (bw * links)
            fixed += 2.0 * (p - 1) * lv.latency
        if self.cluster.allreduce_ring == "flat" and crossed:
            # one ring through all the group's workers: each moves 2 (P - 1) / P of the bytes, the ring as
            # fast as its slowest link, every step one latency of the slowest-latency level crossed
            n = len(ws)
            return (2.0 * (n - 1) / n / min(bw for bw, _ in crossed),
                    2.0 * (n - 1) * max(lat for _, lat in crossed))
        return per_byte, fixed

    def allreduce_latency_steps(self, workers: Sequence[int]) -> float:
        """How many ring latencies the all-reduce over ``workers`` pays, ``2 (p - 1)``, where the
        latency depends on the compute before it (a calibrated cluster with
        ``Calibration.allreduce_after``); 0 elsewhere, where :meth:`allreduce_coeffs`' fixed part
        holds whatever the compute."""
        cal = self.cluster.calibration
        p = len(set(int(w) for w in workers))
        if cal is None or not cal.allreduce_after or len(self.cluster.levels) != 1 or p <= 1:
            return 0.0
        return 2.0 * (p - 1)

    def allreduce_s(self, nbytes: int, workers: Sequence[int], compute_s: float | None = None) -> float:
        """Seconds of a hierarchical ring all-reduce of ``nbytes`` over ``workers`` (0 for one worker),
        after ``compute_s`` of compute on each replica (:meth:`allreduce_coeffs`)."""
        kappa, fixed = self.allreduce_coeffs(workers, compute_s)
        if kappa == 0.0 or nbytes == 0:
            return 0.0
        staged = 0.0 if self.host_staging_bandwidth is None else 2.0 * nbytes / self.host_staging_bandwidth
        return fixed + kappa * nbytes + staged

    # ------------------------------------------------------------------ a replica's minibatch
    def replica_time_s(self, start: int, end: int, workers: Sequence[int], microbatches: int = 1) -> float:
        """Seconds one replica of ``[start, end)`` needs for a minibatch, all-reduce over ``workers``.

        Backward runs from layer ``end-1`` down to ``start``. With ``allreduce_overlap="ddp"`` layer
        ``l``'s gradient is all-reduced when its backward is done and the previous reduction has
        finished, so ``T = F + max_l [B(l..end) + kappa * P(start..l]] + fixed``; with ``"none"``
        the stage's gradients are all-reduced in one call after backward,
        ``T = F + B + kappa * P(start..end) + fixed``. Replicas run at the slowest one's speed (they
        wait for each other in the all-reduce). ``microbatches`` is accepted for the callers that
        price a minibatch of several microbatches; the time is the whole minibatch's either way.
        """
        self._range(start, end)
        ws = list(workers)
        if not ws:
            raise ValueError("replica_time_s needs at least one worker")
        speed = min(self.cluster.speed(w) for w in ws)
        f = (self.pf[end] - self.pf[start]) / speed + sum(self.runtime_work_s(start, end))
        # the replica computes the range's forward and backward between two all-reduces
        work = float(f + (self.pb[end] - self.pb[start]) / speed)
        kappa, fixed = self.allreduce_coeffs(ws, work)
        if kappa == 0.0:
            return work
        if self.allreduce_overlap == "none":
            return work + self.allreduce_s(int(self.pp[end] - self.pp[start]), ws, work)
        ls = np.arange(start, end)
        tail = (self.pb[end] - self.pb[ls]) / speed + kappa * (self.pp[ls + 1] - self.pp[start])
        return float(f + tail.max() + (fixed if self.pp[end] > self.pp[start] else 0.0))

    def replica_time_matrix(
        self, speed: float, kappa: float, fixed: float, steps: float = 0.0, *, transpose: bool = False
    ) -> np.ndarray:
        """``T[i, j]`` = :meth:`replica_time_s` of ``[i, j)`` for all ranges at once
        (``inf`` where ``j <= i``). ``steps`` > 0 (:meth:`allreduce_latency_steps`): the all-reduce's
        fixed part is ``steps`` latencies at the range's own compute, as :meth:`replica_time_s` takes
        it, instead of ``fixed``.

        Vectorised: ``max_l`` over ``[i, j)`` is a running maximum along each row of a triangular
        matrix, one ``np.maximum.accumulate`` call (``allreduce_overlap="ddp"``; with ``"none"`` it
        is ``F + B + kappa * P + fixed`` of the range). ``transpose=True`` returns ``T.T`` (rows
        ``j``), contiguous for reductions over ``i``.
        """
        n = self.num_layers
        pf, pb, pp = self.pf / speed, self.pb / speed, self.pp
        i = np.arange(n + 1)[:, None]
        j = np.arange(n + 1)[None, :]
        # per range, besides its layers: the runtime's F and B overheads, a message at each cut
        overheads = self.overhead_s("F") + self.overhead_s("B")
        per_cut = self.message_s("send") + self.message_s("recv")
        cuts = ((i > 0).astype(float) + (j < n).astype(float)) * per_cut if per_cut else 0.0
        cal = self.cluster.calibration
        if steps > 0 and cal is not None and cal.allreduce_after:
            # each range's compute between two all-reduces, as replica_time_s has it
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
