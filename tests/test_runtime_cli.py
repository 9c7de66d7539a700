"""``pipelab train job.json``: the job file, the CLI with the reference executor, and torchrun (env://)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_runtime_helpers as H
import torch

import pipelab as pl
from pipelab.cli.train import main

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(180)


def _job(tmp_path: Path, **over) -> Path:
    plan = pl.Plan.from_boundaries(5, [2])
    plan.save(tmp_path / "plan.json")
    doc = {"model_fn": "test_runtime_helpers:mlp", "data": "test_runtime_helpers:mlp_data",
           "loss_fn": "test_runtime_helpers:loss_fn",
           "optimizer": {"fn": "torch.optim:SGD", "kwargs": {"lr": 0.1, "momentum": 0.9}},
           "plan": "plan.json", "method": "1f1b-flush", "steps": 3, "microbatches": 2, "out": "out", **over}
    p = tmp_path / "job.json"
    p.write_text(json.dumps(doc))
    return p


def test_cli_runs_a_job_file_with_the_reference_executor(tmp_path):
    job = _job(tmp_path)
    assert main([str(job), "--backend", "local", "--no-progress"]) == 0
    state = torch.load(tmp_path / "out" / "state_dict.pt")
    assert H.max_diff(state, H.reference_training(H.mlp, H.mlp_data, H.sgd, 3)) < 1e-5
    summary = json.loads((tmp_path / "out" / "losses.json").read_text())
    assert len(summary["losses"]) == 3
    tr = pl.Trace.load_jsonl(tmp_path / "out" / "trace.jsonl")
    assert tr.meta["method"] == "1f1b-flush" and len(tr.compute_events()) > 0


def test_job_file_errors_are_clear(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_fn": "test_runtime_helpers:mlp"}))
    assert main([str(bad)]) == 2     # the CLI's one-line error, no traceback
    assert capsys.readouterr().err.startswith(f"pipelab train: error: job file {bad} lacks")
    assert main([str(_job(tmp_path, model_fn="test_runtime_helpers:nope")), "--backend", "local"]) == 2
    assert "cannot import" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_env_rendezvous(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    job = _job(tmp_path, backend="gloo")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "pipelab.runtime.torchrun", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(tmp_path / "out" / "state_dict.pt")
    assert H.max_diff(state, H.reference_training(H.mlp, H.mlp_data, H.sgd, 3)) < 1e-5
    tr = pl.Trace.load_jsonl(tmp_path / "out" / "trace.jsonl")
    assert set(tr.workers) == {0, 1}
