"""The :class:`Calibration` record: what :func:`pipelab.calibrate.calibrate` measured on one machine.

A :class:`~pipelab.cluster.Cluster` may carry one (``Cluster.calibration``); the cost model
(:mod:`pipelab.costs.prices`) reads every term from it. JSON round-trip through ``to_dict`` /
``from_dict``; files written before a term existed load with that term's neutral value (stated per
field below).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipelab._display import Described

#: the action kinds whose layers' compute a calibration may scale (``Calibration.compute_factor``)
FACTOR_KINDS = ("F", "B")


@dataclass(frozen=True, repr=False)
class Calibration(Described):
    """What :func:`pipelab.calibrate.calibrate` measured on one machine, and where and how.

    Provenance: ``host``, ``backend`` (the process group's, e.g. ``"gloo"``), ``device`` (``"cpu"``
    or a CUDA device name), ``date`` (ISO 8601), ``torch`` (version), ``cores`` (CPU cores the
    workers shared), ``workers`` (processes measured at once).

    Terms (seconds, bytes, bytes per second), each the median of repeated measurements:

    * point to point: ``p2p_latency_s`` and ``p2p_bandwidth``, the fit ``alpha + n / beta`` of a
      one-way message of ``n`` bytes over a sweep of sizes (also the cluster's level);
    * all-reduce: ``allreduce_latency_s`` and ``allreduce_bandwidth`` of the ring model
      ``2 (p - 1) alpha + 2 (p - 1) / p * n / beta`` fitted over sizes and group sizes ``p``;
    * ``overhead_s``: the runtime's own seconds per action of each kind (``F``, ``B``, ``W``,
      ``U``) beyond the layers' compute: bookkeeping, posting receives, the trace;
    * ``message_s``: the runtime's own seconds per message on the worker's timeline, ``"send"``
      (packing, posting the send) and ``"recv"`` (posting the receive, unpacking); and
      ``"busy_sender"``, how late a late message is (one sent before its receiver began to wait and
      still not there), which the simulator adds to every message whose sender computes on at once:
      a proxy, since such a sender's messages to a receiver already waiting are only 1-8 us late
      (``reproductions/sim_accuracy/README.md``); ``"cross"``, how much longer an
      action takes when its message crosses the peer's in the opposite direction
      (:mod:`pipelab.schedules.crossing`; the simulator adds it to the actions a first pass finds
      crossed; absent, nothing, in older files); ``"cross_interleaved"``, the same measured in an
      interleaved run (:func:`pipelab.calibrate.interleaved_crossing`), which interleaved schedules
      take instead (a crossed action pays about half as much there; absent in files before
      2026-11-26 06:30, where they take ``"cross"``); ``"arrive"``, how much longer an action takes when
      a message to its worker arrives while it computes and it did not cross (added the same way;
      absent in files before 2026-11-26);
    * ``optimizer_s``: per optimizer (``"sgd"``, ``"sgd-momentum"``, ``"adam"``), ``(fixed
      seconds, seconds per parameter byte, seconds per parameter tensor)`` of one ``step()`` (torch's
      CPU optimizers loop over the tensors: a stage of many small tensors pays per tensor; a file
      written before the third term loads with 0 for it);
    * ``memory_bandwidth``: bytes per second of a large copy (read plus write);
    * ``stash_s``: ``{"call": seconds, "tensor": seconds}``, what a forward through
      the runtime's ``Reparametrizer`` on a dict of weights (how it runs a stashed weight
      version: ``pipedream``, ``2bw``) costs beyond the plain module call, per call and per parameter
      tensor; and (``version_call``, ``version_byte``, ``version_tensor``) what a stashing method's
      ``U`` pays beyond the optimizer step to keep the version in flight (the copy-on-write of the
      master into a new version: per call, per parameter byte, per parameter tensor); and
      PipeMare's weight policy (``delta_*``: what its ``U`` adds, the weight-change average;
      ``correct_*``: what each ``B`` adds, the discrepancy-corrected weights; per call, byte, tensor);
      empty or without the ``version_*``, ``delta_*``, ``correct_*`` keys (nothing) in older files;
    * ``compute_slowdown``: how much slower layers compute inside a two-worker run than the profiler
      measured them alone (the cluster's devices get speed ``1 / compute_slowdown``);
    * ``compute_factor``: per action kind (``F``, ``B``; ``W`` takes ``B``'s), how much longer the
      layers of the model ``compute_model`` take inside a two-worker run of that model than its
      profile says, the runtime's own work taken off first
      (:func:`pipelab.calibrate.model.calibrate_model`); the cost model multiplies the profile's
      times by it. Empty (every factor 1) until that model is calibrated, and in older files;
    * ``duty_slowdown``: ``(duty, factor)`` points, how much longer the same compute takes on a core
      that computes only the fraction ``duty`` of the time (idling between bursts, as a pipeline
      worker waits between actions) than on one kept busy (:func:`pipelab.calibrate.probes.duty_cycle`;
      a profile is taken on a busy core). The simulator scales each worker's compute by
      :meth:`duty_factor` of the utilization a first pass gives it. Empty (factor 1) in older files.

    * ``allreduce_after``: ``(compute seconds, latency seconds)`` points, the ring's per-step latency
      measured inside ``dp`` runs whose replicas compute that long between two all-reduces
      (:func:`pipelab.calibrate.allreduce_in_run` at two batch sizes): on this project's VM an
      all-reduce after a long compute waits several times longer than after a short one
      (``reproductions/benchmarks/allreduce_after_compute.py``). :meth:`allreduce_latency`
      interpolates it; empty (``allreduce_latency_s`` whatever the compute) in older files.

    ``spread`` holds, per figure, the relative spread of the repeats ((max - min) / median);
    ``residual`` the relative RMS error of each fit; ``samples`` the raw sweeps (small lists).
    """

    host: str
    backend: str
    device: str
    date: str
    torch: str
    cores: int
    workers: int
    p2p_latency_s: float
    p2p_bandwidth: float
    allreduce_latency_s: float
    allreduce_bandwidth: float
    overhead_s: dict[str, float]
    optimizer_s: dict[str, tuple[float, ...]]
    memory_bandwidth: float
    message_s: dict[str, float] = field(default_factory=dict)
    stash_s: dict[str, float] = field(default_factory=dict)
    compute_slowdown: float = 1.0
    compute_factor: dict[str, float] = field(default_factory=dict)
    compute_model: str = ""
    duty_slowdown: tuple[tuple[float, float], ...] = ()
    allreduce_after: tuple[tuple[float, float], ...] = ()
    spread: dict[str, float] = field(default_factory=dict)
    residual: dict[str, float] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("p2p_latency_s", "allreduce_latency_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"calibration: {name}={v!r} must be a finite number >= 0 seconds")
        for name in ("p2p_bandwidth", "allreduce_bandwidth", "memory_bandwidth"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"calibration: {name}={v!r} must be a finite number > 0 bytes/s")
        bad = sorted(set(self.overhead_s) - {"F", "B", "W", "U"})
        if bad:
            raise ValueError(f"calibration: overhead_s has kinds {bad}; use F, B, W, U")
        for k, v in self.overhead_s.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"calibration: overhead_s[{k!r}]={v!r} must be a finite number >= 0")
        opt: dict[str, tuple[float, float, float]] = {}
        for k, v in self.optimizer_s.items():
            if len(v) not in (2, 3):
                raise ValueError(f"calibration: optimizer_s[{k!r}]={tuple(v)!r} must be (fixed s, s per byte"
                                 "[, s per tensor])")
            terms = (float(v[0]), float(v[1]), float(v[2]) if len(v) == 3 else 0.0)
            if not all(math.isfinite(t) and t >= 0 for t in terms):
                raise ValueError(f"calibration: optimizer_s[{k!r}]={terms!r} must be numbers >= 0")
            opt[k] = terms
        object.__setattr__(self, "optimizer_s", opt)
        pts = []
        for pt in self.duty_slowdown:
            if len(pt) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in pt) \
                    or not (0 < pt[0] < 1) or pt[1] <= 0:
                raise ValueError(f"calibration: duty_slowdown point {tuple(pt)!r} must be (duty in (0, 1), "
                                 "factor > 0)")
            pts.append((float(pt[0]), float(pt[1])))
        object.__setattr__(self, "duty_slowdown", tuple(sorted(pts)))
        after = []
        for pt in self.allreduce_after:
            ok = all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in pt)
            if len(pt) != 2 or not ok:
                raise ValueError(f"calibration: allreduce_after point {tuple(pt)!r} must be (compute seconds "
                                 ">= 0, latency seconds >= 0)")
            after.append((float(pt[0]), float(pt[1])))
        object.__setattr__(self, "allreduce_after", tuple(sorted(after)))
        bad = sorted(set(self.compute_factor) - set(FACTOR_KINDS))
        if bad:
            raise ValueError(f"calibration: compute_factor has kinds {bad}; use {', '.join(FACTOR_KINDS)}")
        for k, v in self.compute_factor.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"calibration: compute_factor[{k!r}]={v!r} must be a finite number > 0")

    def overhead(self, kind: str) -> float:
        """The runtime's seconds per action of ``kind`` (``W`` falls back to ``B``'s, 0 if unmeasured)."""
        if kind == "W" and "W" not in self.overhead_s:
            kind = "B"
        return float(self.overhead_s.get(kind, 0.0))

    def optimizer_step_s(self, optimizer: str, param_bytes: float, tensors: float = 0) -> float | None:
        """Seconds of one ``step()`` of ``optimizer`` over ``param_bytes`` held in ``tensors`` parameter
        tensors: ``fixed + per_byte * bytes + per_tensor * tensors`` (None if not calibrated)."""
        key = {"momentum": "sgd-momentum", "adamw": "adam"}.get(optimizer, optimizer)
        if key not in self.optimizer_s:
            return None
        fixed, per_byte, per_tensor = self.optimizer_s[key]
        if param_bytes <= 0:
            return 0.0
        return fixed + per_byte * float(param_bytes) + per_tensor * float(tensors)

    def stashed_forward_s(self, tensors: int) -> float:
        """Seconds a forward over ``tensors`` parameter tensors pays for running on a stashed weight
        version (the runtime's ``Reparametrizer``) beyond the plain module call (:attr:`stash_s`)."""
        if tensors <= 0:
            return float(self.stash_s.get("call", 0.0)) if self.stash_s else 0.0
        return float(self.stash_s.get("call", 0.0)) + float(self.stash_s.get("tensor", 0.0)) * tensors

    def factor(self, kind: str) -> float:
        """How much longer the layers of ``kind`` (``F``, ``B``; ``W`` takes ``B``'s) compute inside a
        run than profiled (:attr:`compute_factor`; 1.0 where not measured)."""
        return float(self.compute_factor.get("B" if kind == "W" else kind, 1.0))

    def _affine(self, key: str, param_bytes: float, tensors: float) -> float:
        """``key_call + key_byte * bytes + key_tensor * tensors`` of :attr:`stash_s` (0 where absent)."""
        if param_bytes <= 0 or not self.stash_s:
            return 0.0
        return (float(self.stash_s.get(f"{key}_call", 0.0))
                + float(self.stash_s.get(f"{key}_byte", 0.0)) * float(param_bytes)
                + float(self.stash_s.get(f"{key}_tensor", 0.0)) * float(tensors))

    def _affine_text(self, key: str) -> str:
        """:meth:`_affine`'s three terms of ``key`` for humans."""
        return (f"{self.stash_s.get(f'{key}_call', 0.0) * 1e6:.0f} us + "
                f"{self.stash_s.get(f'{key}_byte', 0.0) * 1e12:.0f} ps/B + "
                f"{self.stash_s.get(f'{key}_tensor', 0.0) * 1e6:.1f} us/tensor")

    def delta_average_s(self, param_bytes: float, tensors: float) -> float:
        """Seconds PipeMare's ``U`` spends beyond the optimizer step on ``param_bytes`` in ``tensors``
        tensors (its weight-change average, :attr:`stash_s`' ``delta_*``; 0 where not measured)."""
        return self._affine("delta", param_bytes, tensors)

    def corrected_weights_s(self, param_bytes: float, tensors: float) -> float:
        """Seconds each PipeMare ``B`` spends building the discrepancy-corrected weights it recomputes
        with (:attr:`stash_s`' ``correct_*``; 0 where not measured)."""
        return self._affine("correct", param_bytes, tensors)

    def duty_factor(self, utilization: float) -> float:
        """How much longer compute takes on a worker busy ``utilization`` of the time than on a busy
        core: :attr:`duty_slowdown` interpolated linearly, 1 at full utilization, the lowest measured
        duty's factor below it (no extrapolation); 1 where not measured."""
        if not self.duty_slowdown or utilization >= 1.0:
            return 1.0
        pts = [*self.duty_slowdown, (1.0, 1.0)]
        if utilization <= pts[0][0]:
            return pts[0][1]
        for (u0, f0), (u1, f1) in zip(pts, pts[1:]):
            if utilization <= u1:
                return f0 + (f1 - f0) * (utilization - u0) / (u1 - u0)
        return 1.0

    def allreduce_latency(self, compute_s: float | None = None) -> float:
        """The ring's per-step latency for an all-reduce whose replicas computed ``compute_s``
        seconds since the last one (:meth:`allreduce_latencies`); :attr:`allreduce_latency_s` where
        ``compute_s`` is None or nothing was measured."""
        if compute_s is None or not self.allreduce_after:
            return self.allreduce_latency_s
        return float(self.allreduce_latencies(np.asarray(compute_s, dtype=float)))

    def allreduce_latencies(self, compute_s: np.ndarray) -> np.ndarray:
        """:meth:`allreduce_latency` of every element of ``compute_s`` at once (the partitioners'
        matrix of ranges): :attr:`allreduce_after` interpolated linearly, its end points' values
        outside them (no extrapolation); :attr:`allreduce_latency_s` everywhere where nothing was
        measured."""
        if not self.allreduce_after:
            return np.full(np.shape(compute_s), self.allreduce_latency_s)
        cs, alphas = zip(*self.allreduce_after)
        return np.interp(compute_s, cs, alphas)

    def new_version_s(self, param_bytes: float, tensors: float) -> float:
        """Seconds a stashing method's ``U`` spends making a new weight version of ``param_bytes``
        in ``tensors`` tensors while the old one is still read (:attr:`stash_s`' ``version_*``
        terms; 0 where not measured)."""
        return self._affine("version", param_bytes, tensors)

    def describe(self) -> str:
        """A few lines for humans: provenance and the fitted terms."""
        ov = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in sorted(self.overhead_s.items()))
        ov += "".join(f", {k} {v * 1e6:.0f} us/message" for k, v in sorted(self.message_s.items()))
        if self.stash_s:
            ov += (f"; a stashed forward +{self.stash_s.get('call', 0.0) * 1e6:.0f} us + "
                   f"{self.stash_s.get('tensor', 0.0) * 1e6:.1f} us/tensor")
            if "version_call" in self.stash_s:
                ov += f"; a new version at U {self._affine_text('version')}"
            if "delta_call" in self.stash_s:
                ov += f"; PipeMare's U +{self._affine_text('delta')}, its B +{self._affine_text('correct')}"
        opt = ", ".join(f"{k} {a * 1e6:.0f} us + {b * 1e12:.0f} ps/B + {c * 1e6:.1f} us/tensor"
                        for k, (a, b, c) in self.optimizer_s.items())
        fac = ""
        if self.compute_factor:
            fac = (f"; {self.compute_model or 'the model'} computes inside a run "
                   + ", ".join(f"{k} {v:.2f}x" for k, v in sorted(self.compute_factor.items()))
                   + " its profile")
        if self.duty_slowdown:
            fac += "; a core busy " + ", ".join(f"{u:.0%} of the time computes {f:.2f}x"
                                                for u, f in self.duty_slowdown)
        return (f"calibrated on {self.host} ({self.device}, {self.backend}, {self.workers} workers on "
                f"{self.cores} cores, torch {self.torch}) at {self.date}\n"
                f"  p2p: {self.p2p_latency_s * 1e6:.0f} us + n / {self.p2p_bandwidth / 1e9:.3g} GB/s; "
                f"all-reduce: {self.allreduce_latency_s * 1e6:.0f} us/step, "
                f"{self.allreduce_bandwidth / 1e9:.3g} GB/s"
                + "".join(f"; after {c * 1e3:.1f} ms of compute {a * 1e6:.0f} us/step"
                          for c, a in self.allreduce_after) + "\n"
                f"  per action: {ov}\n  optimizer step: {opt}\n"
                f"  memory: {self.memory_bandwidth / 1e9:.3g} GB/s; layers compute "
                f"{self.compute_slowdown:.2f}x slower inside a run than alone{fac}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d = asdict(self)
        d["optimizer_s"] = {k: list(v) for k, v in self.optimizer_s.items()}
        d["duty_slowdown"] = [list(p) for p in self.duty_slowdown]
        d["allreduce_after"] = [list(p) for p in self.allreduce_after]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a missing or bad field."""
        again = "re-create it with `pipelab calibrate`"
        try:
            return cls(**{**d, "optimizer_s": {k: tuple(v) for k, v in d["optimizer_s"].items()},
                          "duty_slowdown": tuple(tuple(p) for p in d.get("duty_slowdown", ())),
                          "allreduce_after": tuple(tuple(p) for p in d.get("allreduce_after", ()))})
        except KeyError as exc:
            raise ValueError(f"calibration lacks field {exc}; {again}") from None
        except TypeError as exc:
            raise ValueError(f"malformed calibration ({exc}); {again}") from None


__all__ = ["FACTOR_KINDS", "Calibration"]
