"""The one cost model: compute, point-to-point transfers, all-reduce and memory of a layer range.

Partitioners and the simulator both ask this module what things cost, so a plan's prediction and
a simulated run agree by construction. All times are seconds, sizes bytes.

Assumptions (stated once, used everywhere):

* Compute of layers ``[a, b)`` on worker ``w`` is the profiled time divided by ``cluster.speed(w)``;
  a microbatch of ``minibatch / M`` samples takes ``fixed + (t - fixed) / M`` of the minibatch's
  time ``t``, where ``fixed`` is the layers' ``fwd_fixed_s``/``bwd_fixed_s``: the per-call part
  that a smaller batch still pays (measured by ``pl.profile(..., small_batch=...)``; zero, i.e.
  linear in batch size, for profiles without it such as PipeDream's, which holds well once a GPU is
  saturated).
* A transfer of ``n`` bytes from ``a`` to ``b`` takes ``latency + n / compression_ratio / bandwidth``
  of the link it crosses (:meth:`Cluster.link`). Links are full duplex: activations going forward and
  gradients going back use opposite directions and do not slow each other.
* All-reduce of ``n`` bytes over a set of workers is a hierarchical ring (reduce-scatter inside the
  innermost blocks, all-reduce across the next level, all-gather back): at each level with ``p``
  participating sub-blocks it costs ``2 (p - 1) / p * n / bandwidth + 2 (p - 1) * latency``
  (Patarasuk & Yuan's bandwidth-optimal ring), summed over levels. Where a sub-block has several
  uplinks (``Level.uplinks``) the participating GPUs of that sub-block drive them in parallel.
  Gradients are not compressed (compression applies to activations/gradients across cuts only).
* Gradient all-reduce of a replicated stage, ``allreduce_overlap`` (:data:`ALLREDUCE_OVERLAP`):

  - ``"ddp"`` (default): it overlaps the backward pass the way PyTorch DDP does: layer ``l``'s
    gradient can be reduced as soon as its backward finishes, one reduction at a time, in backward
    order. The finish time of one replica's minibatch is then
    ``F + max_l [B(l..end) + kappa * P(start..l)]``: all of the all-reduce hides behind backward
    except what cannot start before the last (earliest) layers' gradients exist;
  - ``"none"``: one all-reduce of all the stage's gradients after the minibatch's backward is
    complete, ``F + B + kappa * P(start..end) + fixed``. This is what pipelab's own runtime does
    (its ``U`` action flattens every gradient and all-reduces them in one call), so a model of a
    pipelab run uses it (:func:`pipelab.reproduce.measure.measure_row`).

  Both in :meth:`CostModel.replica_time_s` (and its matrix form) and in the simulator.
* ``allreduce_bandwidth`` (bytes/s, default None: each level's ``bandwidth``) is what one link
  carries inside the ring all-reduce when that differs from a point-to-point transfer: on one
  CPU, gloo's loopback "links" are memory copies by the same cores, and an all-reduce, where every
  process sends and receives at once and also sums, moves data slower than a ping-pong (measure
  mode measures both, :func:`pipelab.reproduce.measure.gloo_loopback`). It replaces the bandwidth
  of every level in the ring formula above (meant for flat clusters).
* Ports (:meth:`CostModel.ports`): a transfer crossing level ``k`` occupies the sender's egress and
  the receiver's ingress port at that level, owned by their level-``k-1`` blocks (a GPU's PCIe/NVLink
  port inside a server, the server's NIC across servers; ``Level.uplinks`` links per port). Transfers
  sharing a port take turns, so in steady state a port's busy seconds per minibatch bound the time
  per minibatch (:meth:`CostModel.steady_state`): a middle stage's port carries its forward cut's
  activations *and* its backward cut's gradients, and a server's NIC carries every cross-server
  transfer of every stage on it, under round-robin between replica sets.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipelab.cluster import Cluster
    from pipelab.profile.records import Profile

HBM_BYTES_PER_S = 900e9   # NVIDIA V100 data sheet: 900 GB/s HBM2

#: how a replicated stage's gradient all-reduce meets its backward pass (see the module docstring):
#: ``"ddp"`` layer by layer behind backward, ``"none"`` all of it after backward
ALLREDUCE_OVERLAP = ("ddp", "none")

# optimizer state bytes per parameter byte (momentum buffer; Adam's two moments)
OPTIMIZER_STATE: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class SteadyState:
    """Terms of :meth:`CostModel.steady_state` (seconds per minibatch unless said otherwise)."""

    time_s: float                              # the prediction: the largest term below
    compute_s: tuple[float, ...]               # per stage: one replica's minibatch / replicas
    ports_s: dict[Hashable, float]             # per port: busy seconds per minibatch
    round_trip_s: tuple[float, ...]            # per stage: round trip / minibatches in flight
    transfer_wait_s: tuple[float, ...]         # per cut: mean seconds of one transfer incl. burst wait
    # per window (s, e) of adjacent unreplicated stages: its 1F1B cycle / minibatches it completes
    # (only the slowest window starting at each s, and only e > s)
    cycles_s: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        """Which term sets the time: ``"compute s"``, ``"port (out, k, block)"``, ``"round trip s"`` or
        ``"1F1B cycle s-e"``."""
        for s, t in enumerate(self.compute_s):
            if t == self.time_s:
                return f"compute {s}"
        for p, t in self.ports_s.items():
            if t == self.time_s:
                return f"port {p}"
        for s, t in enumerate(self.round_trip_s):
            if t == self.time_s:
                return f"round trip {s}"
        for (s, e), t in self.cycles_s.items():
            if t == self.time_s:
                return f"1F1B cycle {s}-{e}"
        return "none"


@dataclass(frozen=True)
class CostModel:
    """Costs of layer ranges of ``profile`` on ``cluster`` (see the module docstring)."""

    profile: Profile
    cluster: Cluster
    compression_ratio: float = 1.0
    optimizer: str = "sgd-momentum"
    allreduce_overlap: str = "ddp"
    allreduce_bandwidth: float | None = None
    # prefix sums over layers (index i = total of layers [0, i)), filled in __post_init__
    pf: np.ndarray = field(init=False, repr=False, compare=False)
    pb: np.ndarray = field(init=False, repr=False, compare=False)
    qf: np.ndarray = field(init=False, repr=False, compare=False)
    qb: np.ndarray = field(init=False, repr=False, compare=False)
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
        if self.allreduce_overlap not in ALLREDUCE_OVERLAP:
            raise ValueError(f"allreduce_overlap={self.allreduce_overlap!r} is not one of {ALLREDUCE_OVERLAP}: "
                             f"'ddp' overlaps the all-reduce with backward layer by layer (PyTorch DDP), "
                             f"'none' all-reduces after backward (pipelab's runtime)")
        if self.allreduce_bandwidth is not None and not (
                isinstance(self.allreduce_bandwidth, (int, float)) and math.isfinite(self.allreduce_bandwidth)
                and self.allreduce_bandwidth > 0):
            raise ValueError(f"allreduce_bandwidth={self.allreduce_bandwidth!r} must be None (the links' "
                             f"bandwidth) or a finite number of bytes/s > 0")
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
        # fixed (batch-independent) parts of the times, for microbatches (see the module docstring)
        object.__setattr__(self, "qf", np.concatenate([z, np.cumsum([layer.fwd_fixed_s for layer in layers])]))
        object.__setattr__(self, "qb", np.concatenate([z, np.cumsum([layer.bwd_fixed_s for layer in layers])]))
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
        speed = self.cluster.speed(worker)
        qf, qb = self.qf[end] - self.qf[start], self.qb[end] - self.qb[start]
        f = qf + (self.pf[end] - self.pf[start] - qf) / microbatches
        b = qb + (self.pb[end] - self.pb[start] - qb) / microbatches
        return float(f) / speed, float(b) / speed

    def param_bytes(self, start: int, end: int) -> int:
        """Parameter bytes of layers ``[start, end)``."""
        self._range(start, end)
        return int(self.pp[end] - self.pp[start])

    def update_s(self, start: int, end: int, worker: int, memory_bandwidth: float = HBM_BYTES_PER_S) -> float:
        """Seconds of the optimizer step of ``[start, end)``: it streams weights, gradients and optimizer
        state once through device memory, ``param_bytes * (3 + state) / memory_bandwidth``, scaled by
        the worker's speed (default bandwidth: a V100's HBM2)."""
        if not memory_bandwidth > 0:
            raise ValueError(f"memory_bandwidth={memory_bandwidth!r} must be > 0 bytes/s")
        return self.param_bytes(start, end) * (3 + self.state_factor) / (
            memory_bandwidth * self.cluster.speed(worker))

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

    def steady_state(self, ranges: Sequence[tuple[int, int]], workers: Sequence[Sequence[int]], *,
                     in_flight: Sequence[int] | None = None) -> SteadyState:
        """Seconds per minibatch of an asynchronous (PipeDream-style, no flush) pipeline, with the terms.

        Stage ``s`` runs layers ``ranges[s]`` on cluster workers ``workers[s]``; minibatch ``m`` goes
        to replica ``m % r_s`` of every stage (round-robin, PipeDream SOSP'19 §3.2). The time per
        minibatch is the largest of four lower bounds, each tight in its regime:

        * compute: ``T_s / r_s`` (one replica's minibatch with the overlapped all-reduce tail);
        * ports: each port's busy seconds per minibatch (:meth:`ports`), summing activations forward
          and gradients back of every cut, over the round-robin pairs of replicas, divided by the
          port's ``uplinks``;
        * round trip (Little's law): stage ``s`` keeps ``N_s = in_flight[s] * r_s`` minibatches
          between its forward and its backward, and one minibatch needs ``R_s`` seconds for that
          (compute of every later stage plus every transfer both ways), so time >= ``R_s / N_s``.
          Replicas of a stage pair their all-reduces and so run in lock-step; their ``k`` sends
          through one port leave in a burst, and a FIFO port serves a burst of ``k`` equal
          transfers with a mean wait of ``(k + 1) / 2`` transfers, which ``R_s`` uses;
        * 1F1B cycles (PipeDream SOSP'19 §3.2's one-forward-one-backward order, a max-plus cycle of the
          schedule): in a run of adjacent unreplicated stages, stage ``s`` runs ``B(m)`` then
          ``F(m + N_s)``; that forward travels down to stage ``e``, whose next backward is
          ``B(m + N_s - N_e + 1)``, which travels back up to ``s``. So stages ``s..e`` complete
          ``N_s - N_e + 1`` minibatches per (their compute + both ways of their cuts), and the time is
          at least that ratio for every window. ``e = s`` is the compute bound and ``e = P - 1`` the
          round trip; the windows in between bind when transfers are long next to the stages'
          compute (two slow adjacent stages over a slow link). Replicated stages are left out: their
          round-robin order breaks the single cycle into several (the simulator's business).
        """
        P = len(ranges)
        if P == 0 or len(workers) != P:
            raise ValueError(f"steady_state needs one worker list per stage; got {P} ranges and "
                             f"{len(workers)} worker lists")
        compute, rep_time = [], []
        for (a, b), ws in zip(ranges, workers):
            if not ws:
                raise ValueError(f"stage [{a}, {b}) has no workers")
            t = self.replica_time_s(a, b, ws)
            speed = min(self.cluster.speed(w) for w in ws)
            compute.append(t / len(ws))
            rep_time.append(float(self.pf[b] - self.pf[a] + self.pb[b] - self.pb[a]) / speed)
        loads: dict[Hashable, float] = {}
        waits = []
        for s in range(P - 1):
            src_ws, dst_ws = list(workers[s]), list(workers[s + 1])
            nbytes = self.cut_bytes(ranges[s][1] - 1)
            L = math.lcm(len(src_ws), len(dst_ws))
            wait = 0.0
            burst: dict[tuple[int, Hashable], set[int]] = {}
            for m in range(L):
                a, b = src_ws[m % len(src_ws)], dst_ws[m % len(dst_ws)]
                if a == b:
                    continue
                x = self.transfer_s(nbytes, a, b)
                wait = max(wait, x)
                for d, (u, v) in enumerate(((a, b), (b, a))):   # activation forward, gradient back
                    for port in self.ports(u, v):
                        loads[port] = loads.get(port, 0.0) + x / L / self.port_slots(port)
                        burst.setdefault((d, port), set()).add(u)
            # lock-step replicas: a burst of k senders per port (one sender: no burst)
            k = max((len(v) for v in burst.values()), default=1)
            waits.append(wait * (k + 1) / 2 if wait > 0 else 0.0)
        rt = []
        flights = list(in_flight) if in_flight is not None else [
            math.ceil(sum(len(w) for w in workers[s:]) / len(workers[s])) for s in range(P)]
        for s in range(P):
            r = sum(rep_time[s:]) + 2 * sum(waits[s:])
            rt.append(r / (flights[s] * len(workers[s])))
        cycles = self._one_f_one_b_cycles(rep_time, waits, flights, [len(w) for w in workers])
        time = max([*compute, *loads.values(), *rt, *cycles.values()])
        return SteadyState(time_s=time, compute_s=tuple(compute), ports_s=dict(loads),
                           round_trip_s=tuple(rt), transfer_wait_s=tuple(waits), cycles_s=cycles)

    @staticmethod
    def _one_f_one_b_cycles(rep_time: Sequence[float], waits: Sequence[float], flights: Sequence[int],
                            replicas: Sequence[int]) -> dict[tuple[int, int], float]:
        """The slowest 1F1B cycle :meth:`steady_state` bounds by, per starting stage ``s`` of a window
        ``s..e`` (``e > s``) of adjacent unreplicated stages: ``{(s, e): seconds per minibatch}``.

        Window ``s..e`` takes ``sum_{s..e} compute + 2 sum_{s..e-1} transfer`` and completes
        ``N_s - N_e + 1`` minibatches (a window completing none bounds nothing and is skipped).
        Vectorised: ``O(P^2)`` numbers in a handful of numpy calls per run of unreplicated stages.
        """
        out: dict[tuple[int, int], float] = {}
        P, s0 = len(rep_time), 0
        while s0 < P:
            if replicas[s0] != 1:
                s0 += 1
                continue
            e0 = s0
            while e0 + 1 < P and replicas[e0 + 1] == 1:
                e0 += 1
            if e0 > s0:   # a run s0..e0 of two or more unreplicated stages
                c = np.concatenate([[0.0], np.cumsum(rep_time[s0:e0 + 1])])        # c[i]: compute of s0..s0+i-1
                x = np.concatenate([[0.0], np.cumsum(waits[s0:e0])])               # x[i]: cuts s0..s0+i-1
                n = np.asarray(flights[s0:e0 + 1], dtype=np.float64)
                idx = np.arange(e0 - s0 + 1)
                # window (i, j) relative to s0: compute c[j+1] - c[i], cuts i..j-1 both ways
                work = (c[None, 1:] - c[:-1, None]) + 2 * (x[None, :] - x[:, None])
                tokens = n[:, None] - n[None, :] + 1
                ok = (idx[None, :] > idx[:, None]) & (tokens >= 1)
                per = np.where(ok, work / np.where(ok, tokens, 1.0), -np.inf)
                best = per.argmax(axis=1)
                for i in range(e0 - s0):
                    if np.isfinite(per[i, best[i]]):
                        out[(s0 + i, s0 + int(best[i]))] = float(per[i, best[i]])
            s0 = e0 + 1
        return out

    # ------------------------------------------------------------------ all-reduce
    def allreduce_coeffs(self, workers: Sequence[int]) -> tuple[float, float]:
        """``(seconds per byte, fixed seconds)`` of a hierarchical ring all-reduce over ``workers``
        (at ``allreduce_bandwidth`` per link where it is set)."""
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
            bw = lv.bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
            per_byte += 2.0 * (p - 1) / p / (bw * links)
            fixed += 2.0 * (p - 1) * lv.latency
        return per_byte, fixed

    def allreduce_s(self, nbytes: int, workers: Sequence[int]) -> float:
        """Seconds of a hierarchical ring all-reduce of ``nbytes`` over ``workers`` (0 for one worker)."""
        kappa, fixed = self.allreduce_coeffs(workers)
        return 0.0 if kappa == 0.0 or nbytes == 0 else fixed + kappa * nbytes

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
        kappa, fixed = self.allreduce_coeffs(ws)
        f = (self.pf[end] - self.pf[start]) / speed
        if kappa == 0.0:
            return float(f + (self.pb[end] - self.pb[start]) / speed)
        if self.allreduce_overlap == "none":
            return float(f + (self.pb[end] - self.pb[start]) / speed
                         + self.allreduce_s(int(self.pp[end] - self.pp[start]), ws))
        ls = np.arange(start, end)
        tail = (self.pb[end] - self.pb[ls]) / speed + kappa * (self.pp[ls + 1] - self.pp[start])
        return float(f + tail.max() + (fixed if self.pp[end] > self.pp[start] else 0.0))

    def replica_time_matrix(self, speed: float, kappa: float, fixed: float, *, transpose: bool = False) -> np.ndarray:
        """``T[i, j]`` = :meth:`replica_time_s` of ``[i, j)`` for all ranges at once (``inf`` where ``j <= i``).

        Vectorised: ``max_l`` over ``[i, j)`` is a running maximum along each row of a triangular
        matrix, one ``np.maximum.accumulate`` call (``allreduce_overlap="ddp"``; with ``"none"`` it
        is ``F + B + kappa * P + fixed`` of the range). ``transpose=True`` returns ``T.T`` (rows
        ``j``), contiguous for reductions over ``i``.
        """
        n = self.num_layers
        pf, pb, pp = self.pf / speed, self.pb / speed, self.pp
        i = np.arange(n + 1)[:, None]
        j = np.arange(n + 1)[None, :]
        if kappa == 0.0:
            out = (pf + pb)[None, :] - (pf + pb)[:, None]
        elif self.allreduce_overlap == "none":
            out = (pf + pb + kappa * pp)[None, :] - (pf + pb + kappa * pp)[:, None]
            out += np.where(pp[None, :] > pp[:, None], fixed, 0.0)
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
