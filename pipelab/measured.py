"""What calibration measured on one machine: :class:`Calibration` (mechanisms every machine has) and
:class:`HostEffects` (what one host adds, applied only where asked).

Files round-trip through ``to_dict``/``from_dict``; a term absent from an older file loads neutral.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from pipelab._display import Described

FACTOR_KINDS = ("F", "B")

HOST_TERMS = ("busy_sender",)

_NEUTRAL: dict[str, dict[str, Any]] = {"busy_sender": {"busy_sender_s": 0.0}}


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _need(ok: bool, problem: str) -> None:
    if not ok:
        raise ValueError(f"calibration: {problem}")


@dataclass(frozen=True)
class HostEffects:
    """What one host adds to the core model (0: no effect; the terms: docs/cost_model.md)."""

    busy_sender_s: float = 0.0

    def __post_init__(self) -> None:
        v = self.busy_sender_s
        if not (_finite(v) and v >= 0):
            raise ValueError(f"host effects: busy_sender_s={v!r} must be a finite number >= 0 seconds")

    @property
    def terms(self) -> tuple[str, ...]:
        """The names (:data:`HOST_TERMS`) of the terms that have an effect."""
        return tuple(t for t in HOST_TERMS if replace(self, **_NEUTRAL[t]) != self)

    def without(self, *terms: str) -> HostEffects:
        """This record with the named terms (:data:`HOST_TERMS`) neutral: one term's effect, paired."""
        bad = sorted(set(terms) - set(HOST_TERMS))
        if bad:
            raise ValueError(f"unknown host terms {bad}; use {', '.join(HOST_TERMS)}")
        return replace(self, **{k: v for t in terms for k, v in _NEUTRAL[t].items()})

    def describe(self) -> str:
        """One line for humans: the terms that have an effect."""
        return f"a busy sender's message +{self.busy_sender_s * 1e6:.0f} us" if self.busy_sender_s else "none"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostEffects:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a retired (or unknown) field."""
        old = sorted(set(d) - {f.name for f in fields(cls)})
        if old:
            raise ValueError(f"host effects: {', '.join(old)} retired or unknown (docs/cost_model.md); "
                             "re-create the file with `pipelab calibrate`")
        return cls(**d)


@dataclass(frozen=True, repr=False)
class Calibration(Described):
    """What :func:`pipelab.calibrate.calibrate` measured on one machine: medians of repeats, their
    ``spread`` ((max - min) / median), each fit's relative RMS ``residual``, the raw ``samples``."""

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
    compute_slowdown: float = 1.0
    compute_factor: dict[str, float] = field(default_factory=dict)
    compute_model: str = ""
    transport: str = ""     # the point-to-point path measured: "shared memory" or the backend's
    host_effects: HostEffects = field(default_factory=lambda: HostEffects())
    allreduce_after: tuple[tuple[float, float], ...] = ()
    spread: dict[str, float] = field(default_factory=dict)
    residual: dict[str, float] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("p2p_latency_s", "allreduce_latency_s"):
            v = getattr(self, name)
            _need(_finite(v) and v >= 0, f"{name}={v!r} must be a finite number >= 0 seconds")
        for name in ("p2p_bandwidth", "allreduce_bandwidth", "memory_bandwidth"):
            v = getattr(self, name)
            _need(_finite(v) and v > 0, f"{name}={v!r} must be a finite number > 0 bytes/s")
        bad = sorted(set(self.overhead_s) - {"F", "B", "W", "U"})
        _need(not bad, f"overhead_s has kinds {bad}; use F, B, W, U")
        for k, v in self.overhead_s.items():
            _need(_finite(v) and v >= 0, f"overhead_s[{k!r}]={v!r} must be a finite number >= 0")
        opt: dict[str, tuple[float, float, float]] = {}
        for k, v in self.optimizer_s.items():
            _need(len(v) in (2, 3), f"optimizer_s[{k!r}]={tuple(v)!r} must be (fixed s, s per byte"
                  "[, s per tensor])")
            opt[k] = (float(v[0]), float(v[1]), float(v[2]) if len(v) == 3 else 0.0)
            _need(all(math.isfinite(t) and t >= 0 for t in opt[k]),
                  f"optimizer_s[{k!r}]={opt[k]!r} must be numbers >= 0")
        object.__setattr__(self, "optimizer_s", opt)
        bad = sorted(set(self.message_s) - {"send", "recv"})
        _need(not bad, f"message_s has {bad}; it holds the runtime's 'send' and 'recv' (a host effect goes "
              "in host_effects=HostEffects(...))")
        _need(isinstance(self.host_effects, HostEffects),
              f"host_effects={self.host_effects!r} must be a HostEffects record")
        for pt in self.allreduce_after:
            _need(len(pt) == 2 and all(_finite(v) and v >= 0 for v in pt),
                  f"allreduce_after point {tuple(pt)!r} must be (compute seconds >= 0, latency seconds >= 0)")
        after = sorted((float(c), float(a)) for c, a in self.allreduce_after)
        object.__setattr__(self, "allreduce_after", tuple(after))
        bad = sorted(set(self.compute_factor) - set(FACTOR_KINDS))
        _need(not bad, f"compute_factor has kinds {bad}; use {', '.join(FACTOR_KINDS)}")
        for k, v in self.compute_factor.items():
            _need(_finite(v) and v > 0, f"compute_factor[{k!r}]={v!r} must be a finite number > 0")

    def overhead(self, kind: str) -> float:
        """The runtime's seconds per action of ``kind`` (``W`` falls back to ``B``'s, 0 if unmeasured)."""
        if kind == "W" and "W" not in self.overhead_s:
            kind = "B"
        return float(self.overhead_s.get(kind, 0.0))

    def optimizer_step_s(self, optimizer: str, param_bytes: float, tensors: float = 0) -> float | None:
        """Seconds of one ``step()``: ``fixed + per_byte * param_bytes + per_tensor * tensors`` (None if
        ``optimizer`` was not calibrated)."""
        key = {"momentum": "sgd-momentum", "adamw": "adam"}.get(optimizer, optimizer)
        if key not in self.optimizer_s:
            return None
        fixed, per_byte, per_tensor = self.optimizer_s[key]
        if param_bytes <= 0:
            return 0.0
        return fixed + per_byte * float(param_bytes) + per_tensor * float(tensors)

    def factor(self, kind: str) -> float:
        """In-run over profiled time of ``kind``'s layers (``W`` takes ``B``'s; 1.0 if unmeasured)."""
        return float(self.compute_factor.get("B" if kind == "W" else kind, 1.0))

    def allreduce_latency(self, compute_s: float | None = None) -> float:
        """The ring's per-step latency after ``compute_s`` seconds of compute (None: the plain one)."""
        if compute_s is None or not self.allreduce_after:
            return self.allreduce_latency_s
        return float(self.allreduce_latencies(np.asarray(compute_s, dtype=float)))

    def allreduce_latencies(self, compute_s: np.ndarray) -> np.ndarray:
        """:meth:`allreduce_latency` elementwise: ``allreduce_after`` interpolated, held flat outside."""
        if not self.allreduce_after:
            return np.full(np.shape(compute_s), self.allreduce_latency_s)
        cs, alphas = zip(*self.allreduce_after)
        return np.interp(compute_s, cs, alphas)

    def describe(self) -> str:
        """A few lines for humans: provenance and the fitted terms."""
        ov = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in sorted(self.overhead_s.items()))
        ov += "".join(f", {k} {v * 1e6:.0f} us/message" for k, v in sorted(self.message_s.items()))
        opt = ", ".join(f"{k} {a * 1e6:.0f} us + {b * 1e12:.0f} ps/B + {c * 1e6:.1f} us/tensor"
                        for k, (a, b, c) in self.optimizer_s.items())
        fac = ""
        if self.compute_factor:
            fac = (f"; {self.compute_model or 'the model'} computes inside a run "
                   + ", ".join(f"{k} {v:.2f}x" for k, v in sorted(self.compute_factor.items()))
                   + " its profile")
        return (f"calibrated on {self.host} ({self.device}, {self.backend}, {self.workers} workers on "
                f"{self.cores} cores, torch {self.torch}) at {self.date}\n"
                f"  p2p ({self.transport or self.backend}): {self.p2p_latency_s * 1e6:.0f} us + n / "
                f"{self.p2p_bandwidth / 1e9:.3g} GB/s; "
                f"all-reduce: {self.allreduce_latency_s * 1e6:.0f} us/step, "
                f"{self.allreduce_bandwidth / 1e9:.3g} GB/s"
                + "".join(f"; after {c * 1e3:.1f} ms of compute {a * 1e6:.0f} us/step"
                          for c, a in self.allreduce_after) + "\n"
                f"  per action: {ov}\n  optimizer step: {opt}\n"
                f"  memory: {self.memory_bandwidth / 1e9:.3g} GB/s; layers compute "
                f"{self.compute_slowdown:.2f}x slower inside a run than alone{fac}\n"
                f"  host effects (applied only where asked): {self.host_effects.describe()}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d = asdict(self)
        d["optimizer_s"] = {k: list(v) for k, v in self.optimizer_s.items()}
        d["host_effects"] = self.host_effects.to_dict()
        d["allreduce_after"] = [list(p) for p in self.allreduce_after]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a missing or bad field."""
        again = "re-create it with `pipelab calibrate`"
        try:
            return cls(**{**d, "host_effects": HostEffects.from_dict(d.get("host_effects") or {}),
                          "optimizer_s": {k: tuple(v) for k, v in d["optimizer_s"].items()},
                          "allreduce_after": tuple(tuple(p) for p in d.get("allreduce_after", ()))})
        except KeyError as exc:
            raise ValueError(f"calibration lacks field {exc}; {again}") from None
        except TypeError as exc:
            raise ValueError(f"malformed calibration ({exc}); {again}") from None
