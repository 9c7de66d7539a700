"""One checkpoint per resume, sealed by one coordinator: the step is chosen (and its hashes checked)
once, in prepare; a damaged newest checkpoint falls back to the previous sealed one with a warning;
a run holds its checkpoint folder exclusively and cleans what a killed run left half-written; each
manifest names the run that wrote it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import test_runtime_helpers as H
import torch
from timing import holds_or_skip

import pipelab as pl
from pipelab.hostload import HostLoadSampler
from pipelab.runtime import checkpoint_files as ck
from pipelab.runtime.job import TrainArgs, prepare

PLAN3 = pl.Plan.from_boundaries(5, [1, 3])      # 3 workers
KW = dict(method="1f1b-flush", data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, microbatches=2)


def _train(steps: int, backend: str = "local", **kw):
    return pl.train(H.mlp, PLAN3, steps=steps, backend=backend, progress=False, timeout=60, **KW, **kw)


def _same(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, object]:
    """Checkpoints at steps 2, 4 and 6 of a run, and the uninterrupted 8-step run (the oracle)."""
    root = tmp_path_factory.mktemp("ck")
    _train(6, checkpoint_every=2, checkpoint_dir=root, checkpoint_keep=3)
    return root, _train(8)


def _copy(checkpoints, tmp_path: Path) -> Path:
    shutil.copytree(checkpoints[0], tmp_path / "ck")
    return tmp_path / "ck"


def test_a_resume_loads_the_step_prepare_chose_and_verified(checkpoints, tmp_path: Path) -> None:
    root = _copy(checkpoints, tmp_path)
    job = prepare(TrainArgs.of(model_fn=H.mlp, plan=PLAN3, steps=8, resume=root, backend="local", **KW))
    assert Path(job.runtime.resume) == ck.step_dir(root, 6) and job.runtime.resume_step == 6
    man = ck.read_manifest(root)
    assert man["run"] and {k for k in man["files"]} == {"rank-0.pt", "rank-1.pt", "rank-2.pt"}
    assert torch.load(ck.step_dir(root, 6) / "rank-1.pt", weights_only=True)["run"] == man["run"]
    _same(_train(8, resume=root), checkpoints[1])


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_latest_falls_back_to_the_previous_sealed_one(checkpoints, tmp_path: Path, damage) -> None:
    root = _copy(checkpoints, tmp_path)
    f = ck.step_dir(root, 6) / ("rank-0.pt" if damage == "flip" else "rank-2.pt")
    if damage == "flip":
        raw = bytearray(f.read_bytes())
        raw[100:116] = bytes(b ^ 0xFF for b in raw[100:116])
        f.write_bytes(bytes(raw))
    else:
        f.unlink()
    t0 = time.perf_counter()
    with HostLoadSampler() as load, \
            pytest.raises(ValueError, match=f"cannot resume from {ck.step_dir(root, 6)}: {f}"):
        prepare(TrainArgs.of(model_fn=H.mlp, plan=PLAN3, steps=8, resume=root, backend="local",
                             resume_fallback=False, **KW))
    took = time.perf_counter() - t0
    holds_or_skip(took < 5, load.result, f"the damaged checkpoint was refused after {took:.1f} s, over 5 s")
    with pytest.warns(RuntimeWarning, match=f"{ck.step_dir(root, 6)} is damaged.*{f.name}.*step-00000004"):
        resumed = _train(8, resume=root)
    _same(resumed, checkpoints[1])           # from step 4: the same weights as the uninterrupted run


def test_a_second_writer_or_resumer_is_refused_while_a_run_holds_the_folder(tmp_path: Path) -> None:
    _train(2, checkpoint_every=1, checkpoint_dir=tmp_path / "ck")
    lock = ck.FolderLock(tmp_path / "ck")        # as a run in another process would hold it
    try:
        with pytest.raises(ck.CheckpointBusy, match=f"checkpoint_dir in use by pid {os.getpid()}"):
            _train(2, checkpoint_every=1, checkpoint_dir=tmp_path / "ck")
        with pytest.raises(ck.CheckpointBusy, match="in use by pid"):
            _train(3, resume=tmp_path / "ck")
    finally:
        lock.release()
    _train(3, resume=tmp_path / "ck")            # free again: it runs
    assert [p.name for p in ck.list_checkpoints(tmp_path / "ck")] == ["step-00000001", "step-00000002"]


def test_a_run_cleans_what_a_killed_run_left(checkpoints, tmp_path: Path) -> None:
    root = _copy(checkpoints, tmp_path)
    half = ck.step_dir(root, 8)
    half.mkdir()
    (half / "rank-0.pt").write_bytes(b"half")
    tmp = ck.step_dir(root, 6) / ".rank-1.pt.abc.tmp"
    tmp.write_bytes(b"x")
    _train(8, resume=ck.step_dir(root, 6), checkpoint_every=2, checkpoint_dir=root, checkpoint_keep=5)
    assert not tmp.exists()
    assert [p.name for p in ck.list_checkpoints(root)][-1] == "step-00000008"
    assert json.loads((half / "manifest.json").read_text())["step"] == 8


def test_one_coordinator_seals_with_the_hashes_it_was_sent(tmp_path: Path) -> None:
    for r in range(2):
        ck.write_worker(tmp_path, 3, r, {"w": torch.ones(2)}, plan=pl.Plan.from_boundaries(5, [2]),
                        method="gpipe", run_id="run-a")
    sealer = ck.Sealer(tmp_path, plan=pl.Plan.from_boundaries(5, [2]), method="gpipe", num_workers=2,
                       run_id="run-a")
    sealer.report(3, 0, ck.sha256_of(ck.step_dir(tmp_path, 3) / "rank-0.pt"))
    assert ck.latest(tmp_path) is None                   # one rank in: not sealed
    sealer.report(3, 1, "0" * 64)                       # a hash that is not the file's
    assert ck.read_manifest(tmp_path)["run"] == "run-a"
    with pytest.raises(ValueError, match="rank-1.pt does not match its manifest hash"):
        ck.verify(ck.step_dir(tmp_path, 3))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_processes_seal_through_the_launcher_and_resume_exactly(checkpoints, tmp_path: Path) -> None:
    _train(6, backend="gloo", checkpoint_every=2, checkpoint_dir=tmp_path / "ck")
    assert [p.name for p in ck.list_checkpoints(tmp_path / "ck")] == ["step-00000004", "step-00000006"]
    assert ck.read_manifest(tmp_path / "ck")["run"]
    _same(_train(8, backend="gloo", resume=tmp_path / "ck"), checkpoints[1])
