"""The optimizer step's probe (``pipelab.calibrate.probes.optimizer_steps``): per optimizer, size and
tensor count, timed cold after evicting the host's last-level cache; and that calibration files from
before the weight policies' extras or the crossing stall were retired (``stash_s``, ``cross_s``: they did
not earn their place on models they were not fitted on, ``reproductions/sim_accuracy/README.md``) are
refused, naming the field."""

from __future__ import annotations

import json

import pytest
from _calibrations import bare_calibration

from pipelab.calibrate import probes
from pipelab.measured import Calibration, HostEffects


def test_the_optimizer_probe_times_each_optimizer_per_size_and_tensor_count(monkeypatch) -> None:
    monkeypatch.setattr(probes, "EVICT_BYTES", 1 << 16)   # the cache eviction's size is not under test
    rows = probes.optimizer_steps([1 << 12, 1 << 16], 2, tensor_counts=(2, 8))
    assert set(rows) == set(probes.OPTIMIZERS)
    for got in rows.values():
        assert sorted((n, k) for n, k, _ in got) == [(4096, 2), (4096, 8), (65536, 2), (65536, 8)]
        assert all(t > 0 for _, _, t in got)


def test_the_eviction_between_steps_is_the_last_level_cache_read_from_sysfs(tmp_path) -> None:
    for name, level, size in (("index0", 1, "32K"), ("index2", 2, "1024K"), ("index3", 3, "32768K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert probes.last_level_cache_bytes(sysfs=tmp_path) == 32 << 20
    (tmp_path / "index3" / "size").write_text("garbage\n")
    assert probes.last_level_cache_bytes(7, sysfs=tmp_path) == 7
    assert probes.last_level_cache_bytes(5, sysfs=tmp_path / "missing") == 5


def test_a_file_with_the_retired_stash_and_duty_terms_is_refused_naming_the_term() -> None:
    cal = bare_calibration(host_effects=HostEffects(busy_sender_s=1e-3))
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    old = {k: v for k, v in cal.to_dict().items() if k != "host_effects"}
    old.update(stash_s={"call": 9e-6, "tensor": 3.5e-6}, duty_slowdown=[[0.2, 1.37]])
    with pytest.raises(ValueError, match="stash_s|duty_slowdown"):
        Calibration.from_dict(old)
    with pytest.raises(ValueError, match="message_s has .*cross"):
        Calibration.from_dict({**cal.to_dict(), "message_s": {"send": 1e-5, "cross": 1e-3}})
    newer = cal.to_dict()
    newer["host_effects"].update(post_ahead=4)
    with pytest.raises(ValueError, match="post_ahead"):
        Calibration.from_dict(newer)


def test_a_file_with_the_retired_crossing_stall_is_refused_naming_the_field() -> None:
    old = bare_calibration().to_dict()
    old["host_effects"].update(cross_s=1e-3, cross_interleaved_s=5e-4)
    with pytest.raises(ValueError, match=r"cross_interleaved_s, cross_s retired.*`pipelab calibrate`"):
        Calibration.from_dict(json.loads(json.dumps(old)))
    with pytest.raises(ValueError, match="cross_s retired"):
        HostEffects.from_dict({"cross_s": 1e-3, "busy_sender_s": 2e-4})
