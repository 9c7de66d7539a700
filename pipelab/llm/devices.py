"""Achievable rates of an accelerator and its node, as cited data (``pipelab/data/devices.csv``).

Every number is a specification sheet's figure or a per-operation measurement (GEMM efficiency, NCCL
bus bandwidth), with its source in the table's ``source`` column. The time of a piece of work is a
roofline (Williams et al., CACM 2009): a matrix multiply takes ``max(FLOPs / (peak x gemm_efficiency),
bytes / HBM)``; element-wise work (norms, dropout, residual adds, activation functions) streams its bytes
at ``HBM x hbm_efficiency``, and the unfused attention core's softmax, mask and dropout over the
``a s^2 b`` scores at ``HBM x attention_efficiency`` (a per-operation measurement of those kernels).
A machine at hand gets its rates from a measurement (``DeviceRates(...)`` by keyword, e.g. from a GEMM
probe), never from this table.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from importlib import resources
from typing import Any

#: the quantities each device row must give
QUANTITIES = ("peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp32", "hbm_bytes_per_s", "memory_bytes",
              "gemm_efficiency", "hbm_efficiency", "attention_efficiency", "nvlink_bytes_per_s",
              "nvlink_busbw", "nic_bytes_per_s", "nic_busbw", "nics_per_node", "link_latency_s",
              "nic_latency_s")


@dataclass(frozen=True)
class DeviceRates:
    """What one accelerator and its links achieve: FLOP/s by precision, memory bandwidth, bus bandwidths.

    ``*_busbw`` are NCCL's bus bandwidths (nccl-tests' ``busbw``): a ring all-reduce of ``n`` bytes over
    ``p`` devices takes ``2 (p - 1) / p * n / busbw``, a reduce-scatter or all-gather half that.
    ``nic_*`` are per network adapter; a node has ``nics_per_node`` of them.
    """

    name: str
    peak_flops_bf16: float
    peak_flops_fp16: float
    peak_flops_fp32: float
    hbm_bytes_per_s: float
    memory_bytes: int
    gemm_efficiency: float
    hbm_efficiency: float
    nvlink_bytes_per_s: float
    nvlink_busbw: float
    nic_bytes_per_s: float
    nic_busbw: float
    nics_per_node: int
    link_latency_s: float = 0.0
    nic_latency_s: float = 0.0
    #: share of HBM reached by the attention core's softmax, mask and dropout over the ``a s^2 b``
    #: scores; ``None`` takes ``hbm_efficiency`` (one element-wise rate, e.g. a machine's measurement)
    attention_efficiency: float | None = None

    def __post_init__(self) -> None:
        if self.attention_efficiency is None:
            object.__setattr__(self, "attention_efficiency", self.hbm_efficiency)
        for f in fields(self):
            if f.name == "name":
                continue
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
                raise ValueError(f"DeviceRates {self.name!r}: {f.name}={v!r} must be a number >= 0")
        for label in ("gemm_efficiency", "hbm_efficiency", "attention_efficiency"):
            if not 0 < getattr(self, label) <= 1:
                raise ValueError(f"DeviceRates {self.name!r}: {label}={getattr(self, label)!r} must be in "
                                 "(0, 1]: a share of the peak")

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s of matrix multiplies in ``precision`` (``"bf16"``, ``"fp16"``, ``"fp32"``)."""
        key = {"tf32": "fp32"}.get(precision, precision)
        if key not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"DeviceRates {self.name!r}: no peak for precision {precision!r}; use bf16, "
                             "fp16 or fp32")
        return float(getattr(self, f"peak_flops_{key}"))

    def matmul_s(self, flops: float, nbytes: float, precision: str = "bf16") -> float:
        """Seconds of a matrix multiply: the roofline of its FLOPs at ``gemm_efficiency`` of the peak and
        the bytes it reads and writes at the full HBM rate (a GEMM's tiles stream at the peak)."""
        return max(flops / (self.peak_flops(precision) * self.gemm_efficiency), nbytes / self.hbm_bytes_per_s)

    def stream_s(self, nbytes: float) -> float:
        """Seconds to read or write ``nbytes`` through device memory (element-wise work)."""
        return nbytes / (self.hbm_bytes_per_s * self.hbm_efficiency)

    def attention_stream_s(self, nbytes: float) -> float:
        """Seconds of the attention core's softmax, mask and dropout reading and writing ``nbytes``."""
        share = self.attention_efficiency
        assert share is not None    # __post_init__ resolves None to hbm_efficiency
        return nbytes / (self.hbm_bytes_per_s * share)

    def replace(self, **changes: Any) -> DeviceRates:
        """A copy with fields changed (e.g. a measured ``gemm_efficiency``)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceRates:
        """Inverse of :meth:`to_dict`."""
        return cls(**d)

    @classmethod
    def of(cls, device: DeviceRates | str) -> DeviceRates:
        """``device`` itself, or the cited rates of a device named in ``devices.csv``."""
        if isinstance(device, DeviceRates):
            return device
        table = device_table()
        key = _ALIASES.get(str(device).lower(), str(device))
        if key not in table:
            raise ValueError(f"no rates for device {device!r}; known: {', '.join(table)} (aliases "
                             f"{', '.join(_ALIASES)}), or build DeviceRates(...) from measurements")
        return table[key]


_ALIASES = {"a100": "A100-SXM4-80GB", "a100-80gb": "A100-SXM4-80GB", "h100": "H100-SXM5-80GB",
            "h100-80gb": "H100-SXM5-80GB"}


@cache
def _rows() -> tuple[tuple[str, str, float, str], ...]:
    text = resources.files("pipelab").joinpath("data/devices.csv").read_text(encoding="utf-8")
    return tuple((r["device"], r["quantity"], float(r["value"]), r["source"])
                 for r in csv.DictReader(text.splitlines()))


def device_table() -> dict[str, DeviceRates]:
    """Every device of ``devices.csv`` as :class:`DeviceRates`, by name."""
    by: dict[str, dict[str, float]] = {}
    for dev, qty, value, _src in _rows():
        by.setdefault(dev, {})[qty] = value
    out = {}
    for dev, q in by.items():
        missing = [k for k in QUANTITIES if k not in q]
        if missing:
            raise ValueError(f"devices.csv: {dev} lacks {missing}")
        values: dict[str, Any] = {k: q[k] for k in QUANTITIES}
        values["memory_bytes"], values["nics_per_node"] = int(q["memory_bytes"]), int(q["nics_per_node"])
        out[dev] = DeviceRates(name=dev, **values)
    return out


def sources(device: str) -> dict[str, str]:
    """The citation of each of ``device``'s quantities."""
    name = DeviceRates.of(device).name
    return {qty: src for dev, qty, _v, src in _rows() if dev == name}
