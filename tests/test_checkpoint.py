"""Checkpoints: round trip, a foreign plan refused, interrupted writes leave the previous one intact."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from pipelab.partition.plan import Plan
from pipelab.runtime import checkpoint as ck

PLAN = Plan.from_boundaries(4, [2])


def _state(v: float) -> dict:
    return {"stages": {0: {"w": torch.full((3,), v)}}, "step": int(v), "versions": [0, 1],
            "rng": torch.get_rng_state()}


def _save(root: Path, step: int, v: float, plan: Plan = PLAN) -> None:
    for r in range(plan.num_workers):
        ck.save_worker(root, step, r, _state(v + r), plan=plan, method="gpipe")
    ck.write_manifest(root, step, plan=plan, method="gpipe")


def test_round_trip_and_latest(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    _save(tmp_path, 2, 2.0)
    assert ck.latest(tmp_path) == ck.step_dir(tmp_path, 2)
    st = ck.load_worker(tmp_path, 1, plan=PLAN, method="gpipe")
    assert torch.equal(st["stages"][0]["w"], torch.full((3,), 3.0)) and st["versions"] == [0, 1]
    st1 = ck.load_worker(ck.step_dir(tmp_path, 1), 0, plan=PLAN, method="gpipe")
    assert st1["step"] == 1
    _save(tmp_path, 3, 3.0)   # keep=2 prunes step 1
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]


def test_foreign_plan_and_method_refused(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    other = Plan.from_boundaries(4, [1])
    with pytest.raises(ValueError, match="written for another plan"):
        ck.load_worker(tmp_path, 0, plan=other, method="gpipe")
    with pytest.raises(ValueError, match="method 'gpipe'"):
        ck.load_worker(tmp_path, 0, plan=PLAN, method="pipedream")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ck.load_worker(tmp_path / "nothing", 0, plan=PLAN, method="gpipe")


def test_tampered_file_and_missing_rank(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    f = ck.step_dir(tmp_path, 1) / "rank-0.pt"
    f.write_bytes(f.read_bytes() + b"x")
    with pytest.raises(ValueError, match="manifest hash"):
        ck.load_worker(tmp_path, 0, plan=PLAN, method="gpipe")
    ck.save_worker(tmp_path, 5, 0, _state(5), plan=PLAN, method="gpipe")
    with pytest.raises(FileNotFoundError, match=r"ranks \[1\]"):
        ck.write_manifest(tmp_path, 5, plan=PLAN, method="gpipe")


def test_exception_mid_write_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(tmp_path, 1, 1.0)

    def boom(fd: int) -> None:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="simulated"):
        ck.save_worker(tmp_path, 2, 0, _state(2.0), plan=PLAN, method="gpipe")
    monkeypatch.undo()
    assert ck.latest(tmp_path) == ck.step_dir(tmp_path, 1)
    assert not list(ck.step_dir(tmp_path, 2).glob("*"))  # the temp file was removed
    assert ck.load_worker(tmp_path, 0, plan=PLAN, method="gpipe")["step"] == 1


def test_killed_process_mid_write_keeps_previous(tmp_path: Path) -> None:
    # A subprocess writes step 1, then starts step 2 and is SIGKILLed inside the write (its fsync
    # hangs, so the kill lands after bytes went to the temp file and before the rename).
    script = textwrap.dedent(f"""
        import os, sys, time, torch
        from pipelab.partition.plan import Plan
        from pipelab.runtime import checkpoint as ck
        plan = Plan.from_boundaries(4, [2]); root = {str(tmp_path)!r}
        for r in range(2):
            ck.save_worker(root, 1, r, {{"w": torch.ones(4)}}, plan=plan, method="gpipe")
        ck.write_manifest(root, 1, plan=plan, method="gpipe")
        def slow(fd):
            print("writing", flush=True); time.sleep(60)
        os.fsync = slow
        ck.save_worker(root, 2, 0, {{"w": torch.zeros(1 << 20)}}, plan=plan, method="gpipe")
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        time.sleep(0.1)
        assert list(ck.step_dir(tmp_path, 2).glob(".rank-0.pt.*.tmp"))  # mid-write indeed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert ck.latest(tmp_path) == ck.step_dir(tmp_path, 1)
    st = ck.load_worker(tmp_path, 1, plan=PLAN, method="gpipe")
    assert torch.equal(st["w"], torch.ones(4))
    assert not (ck.step_dir(tmp_path, 2) / "rank-0.pt").exists()
