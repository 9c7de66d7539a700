"""Faults that must end in one clear line: a killed worker is named with its exit code (not the peer
that noticed it), and ``pipelab train`` with a missing job file prints the CLI's one-line error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import test_runtime_helpers as H

import pipelab as pl
from pipelab.runtime import WorkerError


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_worker_is_named_with_its_exit_code(victim: int) -> None:
    plan = pl.Plan.from_boundaries(5, [2])
    run = pl.launch(H.slow_mlp, plan, method="1f1b-flush", data=H.long_data, loss_fn=H.loss_fn,
                    optimizer=H.sgd, steps=200, microbatches=2, timeout=100)
    evs = iter(run.events)
    for _ in range(6):          # both workers are running actions
        next(evs)
    os.kill(run.pids[victim], signal.SIGKILL)
    t = time.time()
    with pytest.raises(WorkerError) as info:
        run.wait()
    assert time.time() - t < 30
    msg = str(info.value)
    assert info.value.rank == victim, msg
    assert msg.startswith(f"worker {victim} ") and "-9 (SIGKILL)" in msg, msg


def test_train_with_a_missing_job_file_prints_one_line(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipelab.cli", "train", str(tmp_path / "nonexistent.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"pipelab train: error: no job file {tmp_path / 'nonexistent.json'} (pass the path of a job.json)"]
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "pipelab.cli", "train", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"pipelab train: error: cannot read job file {bad}")
    assert len(proc.stderr.strip().splitlines()) == 1
