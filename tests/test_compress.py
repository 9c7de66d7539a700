"""Compression codecs: round-trip error bounds, exact bytes on the wire, ratios for the cost model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelab.runtime import compress as C


def max_abs_error_bound(t: torch.Tensor, codec: str) -> float:
    """Bound on ``max|decode(encode(t)) - t|``: int8 ``max|t|/254`` (codes -127..127), fp16 ``*2**-11``
    (plus half the smallest subnormal step, ``2**-25``), bf16 ``*2**-8``."""
    amax = float(t.detach().abs().max()) if t.numel() else 0.0
    slack = amax * 2.0 ** -22
    return {"none": 0.0, "int8": amax / 254 + slack, "fp16": amax * 2.0 ** -11 + 2.0 ** -25 + slack,
            "bf16": amax * 2.0 ** -8 + slack}[codec]


def _tensor(seed: int, n: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * scale


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 300), scale=st.floats(1e-3, 1e3))
def test_round_trip_within_bound(seed: int, n: int, scale: float) -> None:
    t = _tensor(seed, n, scale)
    for codec in C.CODECS:
        enc = C.encode(t, codec)
        back = C.decode(enc)
        assert back.dtype == t.dtype and back.shape == t.shape
        err = float((back - t).abs().max())
        assert err <= max_abs_error_bound(t, codec), (codec, err)


def test_int8_is_symmetric_round_half_even_by_hand() -> None:
    # max|t| = 127 -> scale 1: codes are round-half-even of the values themselves
    t = torch.tensor([127.0, -127.0, 0.5, 1.5, -2.5, 3.4])
    enc = C.encode(t, "int8")
    q, scale = enc.payload
    assert float(scale) == 1.0
    assert q.tolist() == [127, -127, 0, 2, -2, 3]
    assert C.decode(enc).tolist() == [127.0, -127.0, 0.0, 2.0, -2.0, 3.0]


def test_zero_and_empty_tensors() -> None:
    z = torch.zeros(5)
    assert torch.equal(C.decode(C.encode(z, "int8")), z)
    e = torch.zeros(0, 3)
    assert C.decode(C.encode(e, "int8")).shape == (0, 3)


def test_bytes_on_wire_exact() -> None:
    t = torch.randn(64, 32)  # 2048 float32 = 8192 bytes
    assert C.encode(t, "none").wire_bytes() == 8192
    assert C.encode(t, "fp16").wire_bytes() == 8192 // 2
    assert C.encode(t, "bf16").wire_bytes() == 8192 // 2
    assert C.encode(t, "int8").wire_bytes() == 2048 + 4  # one byte per element plus the float32 scale
    for codec in C.CODECS:
        assert C.wire_bytes(t.numel(), codec) == C.encode(t, codec).wire_bytes()
        assert C.encode(t, codec).raw_bytes() == 8192


def test_ratio_consistent_with_bytes() -> None:
    n = 2048
    assert C.compression_ratio("fp16") == 2.0
    assert C.compression_ratio("bf16") == 2.0
    assert C.compression_ratio("int8") == 4.0
    assert C.compression_ratio(None) == 1.0
    assert C.compression_ratio("int8", numel=n) == pytest.approx(4 * n / (n + 4))
    assert 4 * n / C.compression_ratio("int8", numel=n) == C.wire_bytes(n, "int8")


def test_integer_tensors_pass_through() -> None:
    idx = torch.arange(10)
    enc = C.encode(idx, "int8")
    assert enc.codec == "none" and torch.equal(C.decode(enc), idx)


def test_payload_specs_match_encode() -> None:
    t = torch.randn(3, 4)
    for codec in C.CODECS:
        enc = C.encode(t, codec)
        specs = C.payload_specs(t.shape, t.dtype, codec)
        assert [(tuple(p.shape), p.dtype) for p in enc.payload] == specs
        bufs = [torch.empty(s, dtype=d) for s, d in specs]
        for b, p in zip(bufs, enc.payload):
            b.copy_(p)
        assert torch.equal(C.from_payload(bufs, t.shape, t.dtype, codec), C.decode(enc))


def test_bad_input_errors() -> None:
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        C.encode(torch.ones(2), "zip")
    with pytest.raises(ValueError, match="inf/NaN"):
        C.encode(torch.tensor([1.0, float("inf")]), "int8")


def test_message_round_trip_mixed_members() -> None:
    msg = [torch.randn(4, 3), torch.arange(5), torch.randn(2)]
    layout = [(t.shape, t.dtype) for t in msg]
    for codec in C.CODECS:
        wire = C.encode_message(msg, codec)
        assert [(tuple(w.shape), w.dtype) for w in wire] == C.message_specs(layout, codec)
        back = C.decode_message(wire, layout, codec)
        assert torch.equal(back[1], msg[1])
        for a, b in zip(back, msg):
            assert a.dtype == b.dtype and (a - b).abs().max() <= max_abs_error_bound(b, codec)
    with pytest.raises(ValueError, match="disagree on compression"):
        C.decode_message(C.encode_message(msg, "int8"), layout, "fp16")
