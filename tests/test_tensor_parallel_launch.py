"""One job file with a tensor degree runs unchanged with ``pipelab train job.json`` on this machine and
under ``torchrun --nnodes 2`` (two agents on loopback, one c10d rendezvous, the tensor group split
across them), equal to plain SGD."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tensor_parallel import CUT, max_diff, plain_sgd, tensor_plan

import pipelab as pl
from pipelab.cli.train import main

TESTS = Path(__file__).resolve().parent


def _job(tmp_path: Path, boundaries: list[int]) -> Path:
    tensor_plan(boundaries, 2).save(tmp_path / "plan.json")
    doc = {"model_fn": "tp_models:gpt", "data": "tp_models:data", "loss_fn": "tp_models:loss_fn",
           "optimizer": {"fn": "torch.optim:SGD", "kwargs": {"lr": 0.1}}, "plan": "plan.json",
           "method": "1f1b-flush", "steps": 2, "microbatches": 2, "timeout": 120, "out": "out"}
    p = tmp_path / "job.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_tensor_job_file_runs_with_pipelab_train(tmp_path: Path) -> None:
    assert main([str(_job(tmp_path, [CUT])), "--no-progress", "--trust"]) == 0
    state = torch.load(tmp_path / "out" / "state_dict.pt")
    assert max_diff(state, plain_sgd()) < 1e-5
    assert pl.Trace.load_jsonl(tmp_path / "out" / "trace.jsonl").meta["tensor_groups"] == [[0, 2], [1, 3]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_job_runs_on_two_torchrun_nodes(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    job = _job(tmp_path, [])     # one stage of tensor degree 2: its group spans the two nodes
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    port = _free_port()
    cmd = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "pipelab-tp-test", "--max-restarts", "0",
           "-m", "pipelab.cli", "train", str(job), "--trust"]
    nodes = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [n.communicate(timeout=250) for n in nodes]
    for n, (_, err) in zip(nodes, outs):
        assert n.returncode == 0, err[-3000:]
    state = torch.load(tmp_path / "out" / "state_dict.pt")
    assert max_diff(state, plain_sgd()) < 1e-5
    tr = pl.Trace.load_jsonl(tmp_path / "out" / "trace.jsonl")
    assert tr.meta["tensor_groups"] == [[0, 1]] and set(tr.workers) == {0}

