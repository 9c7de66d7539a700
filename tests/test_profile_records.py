"""The Profile record: validation, range totals, JSON round-trip, atomic saves, clear errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipelab._io as io_mod
from pipelab.profile.records import Layer, Profile


def _prof() -> Profile:
    return Profile.synthetic([1.0, 2.0, 3.0, 4.0], out_bytes=[10, 20, 30, 40], param_bytes=[1, 2, 3, 4],
                             batch_size=8, input_bytes=5, cut_bytes=[10, 25, 30])


def test_synthetic_defaults_and_range_totals() -> None:
    p = Profile.synthetic([1.0, 2.0], out_bytes=[7, 9])
    assert [la.bwd_s for la in p.layers] == [2.0, 4.0] and p.cut_bytes == (7,) and p.edges == ((0, 1),)
    q = _prof()
    t = q[1:3]
    assert (t.fwd_s, t.bwd_s, t.param_bytes, t.in_bytes, t.out_bytes) == (5.0, 10.0, 5, 10, 30)
    assert q[0:4].in_bytes == 5 and q[0:4].out_bytes == 40 and q[0:4].compute_s == 30.0
    assert q[2].name == "layer2" and q.fwd_s == 10.0 and q.param_bytes == 10
    with pytest.raises(ValueError, match="contiguous"):
        q[0:4:2]
    with pytest.raises(ValueError, match="empty or outside"):
        q.totals(2, 2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=2, max_size=12), st.data())
def test_totals_are_additive_over_any_split(fwd: list[float], data: st.DataObject) -> None:
    p = Profile.synthetic(fwd, param_bytes=list(range(len(fwd))))
    k = data.draw(st.integers(1, len(fwd) - 1))
    a, b, whole = p[:k], p[k:], p[:]
    assert math.isclose(a.fwd_s + b.fwd_s, whole.fwd_s, rel_tol=1e-9, abs_tol=1e-12)
    assert a.param_bytes + b.param_bytes == whole.param_bytes
    assert a.out_bytes == b.in_bytes == p.cut_bytes[k - 1]


def test_validation_errors_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match=r"fwd_s=-1\.0 must be a finite number >= 0"):
        Layer("x", "Linear", -1.0, 0.0, 0, 0)
    with pytest.raises(ValueError, match="must be a finite number"):
        Layer("x", "Linear", float("nan"), 0.0, 0, 0)
    with pytest.raises(ValueError, match="one per boundary"):
        Profile.synthetic([1.0, 2.0], cut_bytes=[1, 2])
    with pytest.raises(ValueError, match="at least one layer"):
        Profile.synthetic([])
    with pytest.raises(ValueError, match="batch_size"):
        Profile.synthetic([1.0], batch_size=0)
    with pytest.raises(ValueError, match="not forward"):
        Profile(layers=_prof().layers, cut_bytes=(1, 1, 1), batch_size=1, edges=((2, 1),))


def test_json_round_trip_and_fingerprint(tmp_path: Path) -> None:
    p = _prof()
    path = p.save(tmp_path / "sub" / "p.json")
    assert Profile.load(path) == p
    doc = json.loads(path.read_text())
    assert doc["pipelab"] == "profile" and doc["schema"] == 1
    assert p.scaled(time=2.0).fingerprint() == p.fingerprint()
    assert p.scaled(time=2.0).fwd_s == 2 * p.fwd_s
    other = Profile.synthetic([1.0, 2.0, 3.0, 4.0], param_bytes=[1, 2, 3, 5])
    assert other.fingerprint() != p.fingerprint()
    df = p.summary()
    assert df.iloc[-1]["layer"] == "TOTAL" and df.iloc[-1]["fwd_ms"] == pytest.approx(p.fwd_s * 1e3)


def test_bad_files_give_one_clear_error(tmp_path: Path) -> None:
    cases = {
        "corrupt.json": ('{"pipelab": "profile", "schema": 1, "layers": [', "not valid JSON"),
        "foreign.json": ('{"name": "something else"}', "is not a pipelab profile file"),
        "plan.json": ('{"pipelab": "plan", "schema": 1}', "found 'plan'"),
        "future.json": ('{"pipelab": "profile", "schema": 99}', "schema version 99"),
        "missing.json": ('{"pipelab": "profile", "schema": 1, "cut_bytes": []}', "lacks field 'layers'"),
    }
    for name, (text, msg) in cases.items():
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(ValueError, match=msg):
            Profile.load(f)
    neg = _prof().to_dict()
    neg["layers"][1]["bwd_s"] = -0.5
    f = tmp_path / "neg.json"
    io_mod.write_record(f, "profile", 1, neg)
    with pytest.raises(ValueError, match="bwd_s=-0.5"):
        Profile.load(f)
    with pytest.raises(FileNotFoundError):
        Profile.load(tmp_path / "nope.json")


def test_failed_save_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.json"
    old = _prof()
    old.save(path)
    before = path.read_bytes()

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(io_mod.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        old.scaled(time=3.0).save(path)
    monkeypatch.setattr(io_mod.os, "fsync", os.fsync)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]
    assert Profile.load(path) == old


def test_fixed_parts_round_trip_scale_and_are_checked(tmp_path: Path) -> None:
    """The batch-independent parts of a layer's times: JSON round trip, an older file without them
    loads as linear (zero), ``scaled`` scales them, and a fixed part above the time is refused."""
    from dataclasses import asdict, replace

    base = Profile.synthetic([4e-3, 1e-3], [8e-3, 2e-3], out_bytes=[10, 20], batch_size=8)
    prof = Profile(layers=(replace(base.layers[0], fwd_fixed_s=1e-3, bwd_fixed_s=2e-3), base.layers[1]),
                   cut_bytes=base.cut_bytes, batch_size=8)
    back = Profile.load(prof.save(tmp_path / "p.json"))
    assert back.layers == prof.layers
    old = prof.to_dict()
    for layer in old["layers"]:
        del layer["fwd_fixed_s"], layer["bwd_fixed_s"]
    assert Profile.from_dict(old).layers[0].fwd_fixed_s == 0.0
    half = prof.scaled(time=0.5)
    assert (half.layers[0].fwd_fixed_s, half.layers[0].bwd_fixed_s) == pytest.approx((0.5e-3, 1e-3))
    with pytest.raises(ValueError, match="fwd_fixed_s=0.005 exceeds fwd_s=0.004"):
        Layer(**{**asdict(prof.layers[0]), "fwd_fixed_s": 5e-3})
