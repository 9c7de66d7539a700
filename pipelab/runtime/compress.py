"""Compression of the tensors crossing stage cuts: ``none``, ``fp16``, ``bf16``, ``int8``.

:func:`encode` gives an :class:`Encoded` (wire payloads plus what the receiver needs);
:func:`decode` inverts it; :meth:`Encoded.wire_bytes` is what the trace counts. For float32:
``fp16``/``bf16`` cast (ratio 2); ``int8`` is symmetric per-tensor, ``scale = max|t| / 127``,
``q = round(t / scale)`` in [-127, 127], with the float32 scale on the wire (ratio
``4 * numel / (numel + 4)``). Integer and bool tensors pass through unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

CODECS: tuple[str, ...] = ("none", "fp16", "bf16", "int8")

_CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
_INT8_LEVELS = 127  # symmetric code: [-127, 127]


@dataclass(frozen=True)
class Encoded:
    """One tensor as it travels: ``payload`` tensors plus what the receiver needs to rebuild it."""

    codec: str
    payload: tuple[torch.Tensor, ...]
    dtype: torch.dtype
    shape: tuple[int, ...]

    def wire_bytes(self) -> int:
        """Exact bytes of the payload tensors (what goes over the link)."""
        return sum(p.numel() * p.element_size() for p in self.payload)

    def raw_bytes(self) -> int:
        """Bytes the uncompressed tensor would have taken."""
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def check_codec(codec: str | None) -> str:
    """Normalize ``codec`` (``None`` means ``"none"``) and raise a clear error for unknown names."""
    name = "none" if codec is None else str(codec).lower()
    if name not in CODECS:
        raise ValueError(f"unknown compression {codec!r}; use one of {', '.join(CODECS)} (or None)")
    return name


def encode(t: torch.Tensor, codec: str | None = "none") -> Encoded:
    """Encode ``t`` with ``codec`` (integer and bool tensors pass through)."""
    name = check_codec(codec)
    shape = tuple(t.shape)
    if name == "none" or not t.is_floating_point():
        return Encoded("none", (t,), t.dtype, shape)
    if name in _CAST:
        return Encoded(name, (t.detach().to(_CAST[name]),), t.dtype, shape)
    x = t.detach().float()
    amax = x.abs().max() if x.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    if not torch.isfinite(amax):
        raise ValueError("int8 compression cannot encode a tensor with inf/NaN values "
                         "(training has diverged?); lower the learning rate or use compression='bf16'")
    # An all-zero tensor gets scale 1 so that decode (q * scale) stays exact and division is safe.
    scale = torch.where(amax > 0, amax / _INT8_LEVELS, torch.ones_like(amax)).reshape(1).to(torch.float32)
    q = torch.clamp(torch.round(x / scale), -_INT8_LEVELS, _INT8_LEVELS).to(torch.int8)
    return Encoded("int8", (q, scale), t.dtype, shape)


def decode(enc: Encoded) -> torch.Tensor:
    """Rebuild the tensor (in its original dtype and shape) from an :class:`Encoded`."""
    if enc.codec == "none":
        return enc.payload[0]
    if enc.codec in _CAST:
        return enc.payload[0].to(enc.dtype).reshape(enc.shape)
    if enc.codec == "int8":
        q, scale = enc.payload
        return (q.to(torch.float32) * scale).to(enc.dtype).reshape(enc.shape)
    raise ValueError(f"cannot decode codec {enc.codec!r}; known: {', '.join(CODECS)}")


def payload_specs(shape: Sequence[int], dtype: torch.dtype,
                  codec: str | None) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Specs of the payloads :func:`encode` makes for a ``shape``/``dtype`` tensor (receive buffers)."""
    name = check_codec(codec)
    shp = tuple(int(d) for d in shape)
    if name == "none" or not dtype.is_floating_point:
        return [(shp, dtype)]
    return [(shp, _CAST[name])] if name in _CAST else [(shp, torch.int8), ((1,), torch.float32)]


def from_payload(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype,
                 codec: str | None) -> torch.Tensor:
    """Decode received ``payload`` tensors (allocated from :func:`payload_specs`) back to a tensor."""
    name = check_codec(codec)     # checked for every dtype; integer and bool payloads pass through
    shp = tuple(int(d) for d in shape)
    return decode(Encoded(name if dtype.is_floating_point else "none", tuple(payload), dtype, shp))


def wire_bytes(numel: int, codec: str | None, dtype: torch.dtype = torch.float32) -> int:
    """Exact bytes on the wire for a ``numel``-element tensor of ``dtype`` under ``codec``."""
    name = check_codec(codec)
    size = torch.empty((), dtype=dtype).element_size()
    if name == "none" or not dtype.is_floating_point:
        return numel * size
    return numel * 2 if name in _CAST else numel * 1 + 4


def compression_ratio(codec: str | None, dtype: torch.dtype = torch.float32,
                      numel: int | None = None) -> float:
    """Uncompressed bytes over wire bytes: asymptotic, or exact for ``numel`` (int8's scale included)."""
    name = check_codec(codec)
    size = torch.empty((), dtype=dtype).element_size()
    if name == "none":
        return 1.0
    if name in _CAST:
        return size / 2
    return float(size) if numel is None else numel * size / wire_bytes(numel, name, dtype)


def encode_message(tensors: Sequence[torch.Tensor], codec: str | None) -> list[torch.Tensor]:
    """The wire tensors of a message: each float member encoded, payloads flattened."""
    return [p for t in tensors for p in encode(t, codec).payload]


def decode_message(wire: Sequence[torch.Tensor], shapes_dtypes: Sequence[tuple[Sequence[int], torch.dtype]],
                   codec: str | None) -> list[torch.Tensor]:
    """Inverse of :func:`encode_message` given each original member's (shape, dtype)."""
    expect = message_specs(shapes_dtypes, codec)
    if len(expect) != len(wire) or any(w.dtype != d for w, (_, d) in zip(wire, expect)):
        raise ValueError(f"message has wire tensors {[str(w.dtype) for w in wire]}, the layout expects "
                         f"{[str(d) for _, d in expect]}; sender and receiver disagree on compression")
    out, i = [], 0
    for shape, dtype in shapes_dtypes:
        n = len(payload_specs(shape, dtype, codec))
        out.append(from_payload(wire[i:i + n], shape, dtype, codec))
        i += n
    return out


def message_specs(shapes_dtypes: Sequence[tuple[Sequence[int], torch.dtype]],
                  codec: str | None) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every wire tensor of a message whose members are ``shapes_dtypes``."""
    return [p for shape, dtype in shapes_dtypes for p in payload_specs(shape, dtype, codec)]
