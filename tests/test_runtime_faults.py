"""Faults that must end in one clear line, within seconds, with no process left: a killed worker is
named with its exit code (not the peer that noticed it); ``pipelab train`` with a missing job file
prints the CLI's one-line error; a killed launcher or notebook kernel takes its workers along; a
start-up error names its cause, not a peer's closed connection; the rendezvous is closed (loopback,
bound by the launcher, bad ports refused); a hung worker is stopped at the deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fault_helpers as F
import pytest
import test_runtime_helpers as H
from timing import holds_or_skip

import pipelab as pl
from pipelab.hostload import HostLoadSampler
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
    with HostLoadSampler() as load, pytest.raises(WorkerError) as info:
        run.wait()
    waited = time.time() - t
    msg = str(info.value)
    assert info.value.rank == victim, msg
    assert msg.startswith(f"worker {victim} ") and "-9 (SIGKILL)" in msg, msg
    holds_or_skip(waited < 30, load.result, f"the killed worker was reported after {waited:.1f} s, over 30 s")


def test_train_with_a_missing_job_file_prints_one_line(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipelab.cli", "train", str(tmp_path / "nonexistent.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"pipelab train: error: no job file {tmp_path / 'nonexistent.json'} (pass the path of a job.json; "
        "examples/job.json is one)"]
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "pipelab.cli", "train", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"pipelab train: error: cannot read job file {bad}")
    assert len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------- workers die with their launcher
TESTS = Path(__file__).resolve().parent
LAUNCHER = """
import json, sys, time
sys.path[:0] = [{tests!r}, {repo!r}]
import test_runtime_helpers as H
import pipelab as pl
run = pl.launch(H.slow_mlp, pl.Plan.from_boundaries(5, [2]), method="1f1b-flush", data=H.long_data,
                loss_fn=H.loss_fn, optimizer=H.sgd, steps=300, microbatches=2, timeout=200, progress=False,
                checkpoint_every=1, checkpoint_dir={ckpt!r})
evs = iter(run.events)
while sum(e.kind == "U" for e in run.events_so_far()) < 4:
    next(evs)
from multiprocessing import forkserver, resource_tracker
helpers = [getattr(forkserver._forkserver, "_forkserver_pid", None),
           getattr(resource_tracker._resource_tracker, "_pid", None)]
print(json.dumps({{"workers": run.pids, "helpers": [p for p in helpers if p]}}), flush=True)
time.sleep(600)
"""


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("step-*")) if root.is_dir() else []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_launcher_takes_its_workers_along(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    script = LAUNCHER.format(tests=str(TESTS), repo=str(TESTS.parent), ckpt=str(ckpt))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the launcher script did not start its run"
        doc = json.loads(line)
        pids = doc["workers"] + doc["helpers"]
        assert all(F.alive(p) for p in doc["workers"])
        proc.kill()                    # SIGKILL: no handler, no atexit, nothing of the launcher runs
        proc.wait(10)
        with HostLoadSampler() as load:      # gone at all (60 s: a hang); gone within 5 s, unless busy
            gone_s, left = F.wait_gone(pids, 60.0)
        assert not left, f"still alive 60 s after the launcher was killed: {left}"
        before = _steps(ckpt)
        time.sleep(1.0)
        assert _steps(ckpt) == before, "a checkpoint step appeared after every worker was gone"
        holds_or_skip(gone_s <= 5.0, load.result, f"the workers took {gone_s:.1f} s to go, over 5 s")
    finally:
        proc.kill()
        F.kill_all(pids)


NOTEBOOK_CELL = """
import json, os, signal, sys
sys.path[:0] = [{tests!r}, {repo!r}]
import test_runtime_helpers as H
import pipelab as pl
run = pl.launch(H.slow_mlp, pl.Plan.from_boundaries(5, [2]), method="1f1b-flush", data=H.long_data,
                loss_fn=H.loss_fn, optimizer=H.sgd, steps=300, microbatches=2, timeout=200, progress=False)
next(iter(run.events))
with open({pidfile!r}, "w") as fh:
    json.dump(run.pids, fh)
os.kill(os.getpid(), signal.SIGKILL)    # the kernel dies, as when papermill's timeout stops it
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_notebook_kernel_takes_its_workers_along(tmp_path: Path) -> None:
    papermill = pytest.importorskip("papermill")
    nbformat = pytest.importorskip("nbformat")
    pidfile = tmp_path / "pids.json"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(NOTEBOOK_CELL.format(tests=str(TESTS), repo=str(TESTS.parent),
                                                                 pidfile=str(pidfile)))]
    nbformat.write(nb, tmp_path / "kill.ipynb")
    with pytest.raises(Exception):   # noqa: B017 - papermill's dead-kernel error (its type varies by version)
        papermill.execute_notebook(str(tmp_path / "kill.ipynb"), str(tmp_path / "out.ipynb"),
                                   kernel_name="python3", progress_bar=False, execution_timeout=90)
    pids = json.loads(pidfile.read_text())
    try:
        with HostLoadSampler() as load:      # gone at all (60 s: a hang); gone within 5 s, unless busy
            gone_s, left = F.wait_gone(pids, 60.0)
        assert not left, f"workers {left} outlived their notebook kernel by 60 s"
        holds_or_skip(gone_s <= 5.0, load.result, f"the workers took {gone_s:.1f} s to go, over 5 s")
    finally:
        F.kill_all(pids)


# ---------------------------------------------------------------------- the cause is reported, not a peer
PLAN3 = pl.Plan.from_boundaries(5, [1, 3])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_start_up_error_names_its_cause_not_a_peers_closed_connection(tmp_path: Path) -> None:
    from pipelab.runtime import checkpoint_files as ck
    from pipelab.runtime.job import TrainArgs, prepare
    from pipelab.runtime.launch import Run

    kw = dict(method="1f1b-flush", data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, microbatches=2,
              timeout=60)
    pl.train(H.mlp, PLAN3, steps=2, backend="local", progress=False, checkpoint_every=2,
             checkpoint_dir=tmp_path, **kw)
    job = prepare(TrainArgs.of(model_fn=H.mlp, plan=PLAN3, steps=4, resume=tmp_path, **kw))  # verified here
    f = ck.step_dir(tmp_path, 2) / "rank-2.pt"
    raw = bytearray(f.read_bytes())
    raw[-40:-24] = bytes(16)                                         # then damaged behind its back
    f.write_bytes(bytes(raw))
    with pytest.raises(WorkerError) as info:
        Run(job).wait()
    msg = str(info.value)
    assert info.value.rank == 2 and msg.startswith("worker 2 (start-up) failed: ValueError: "), msg
    assert f"{f} does not match its manifest hash" in msg, msg


# ---------------------------------------------------------------------- a closed rendezvous
@pytest.mark.parametrize("port", [0, 70000, -1, True, "29500"])
def test_bad_ports_are_refused_clearly(port) -> None:
    with pytest.raises(ValueError, match=r"is not a TCP port \(1..65535\)"):
        pl.launch(H.mlp, pl.Plan.from_boundaries(5, [2]), method="gpipe", data=H.mlp_data, loss_fn=H.loss_fn,
                  optimizer=H.sgd, steps=1, port=port)


def test_a_taken_port_is_refused_at_once() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        t0 = time.perf_counter()
        with HostLoadSampler() as load, \
                pytest.raises(ValueError, match=f"port {s.getsockname()[1]} on 127.0.0.1 is in use"):
            pl.launch(H.mlp, pl.Plan.from_boundaries(5, [2]), method="gpipe", data=H.mlp_data,
                      loss_fn=H.loss_fn, optimizer=H.sgd, steps=1, port=s.getsockname()[1])
        took = time.perf_counter() - t0
        holds_or_skip(took < 10, load.result, f"the taken port was refused after {took:.1f} s, over 10 s")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_rendezvous_listens_on_loopback_only() -> None:
    run = pl.launch(H.slow_mlp, pl.Plan.from_boundaries(5, [2]), method="1f1b-flush", data=H.long_data,
                    loss_fn=H.loss_fn, optimizer=H.sgd, steps=200, microbatches=2, timeout=100)
    try:
        evs = iter(run.events)
        for _ in range(4):
            next(evs)
        socks = F.listening([os.getpid(), *run.pids])
        assert socks, "no listening socket found (the store and gloo listen while a job runs)"
        assert {a for a, _ in socks} <= {"127.0.0.1", "::1"}, socks
    finally:
        run.cancel()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_runs_started_at_the_same_instant_all_finish_right() -> None:
    plan = pl.Plan.from_boundaries(5, [2])
    ref = H.reference_training(H.mlp, H.mlp_data, H.sgd, 2)
    for _ in range(5):
        runs = [pl.launch(H.mlp, plan, method="gpipe", data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                          steps=2, microbatches=2, timeout=60) for _ in range(2)]
        for r in runs:
            assert H.max_diff(r.wait().state_dict(), ref) < 1e-5


# ---------------------------------------------------------------------- a monitor that cannot hang
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("stopped", [True, False], ids=["sigstopped", "stuck-mid-message"])
def test_a_silent_worker_is_stopped_at_the_deadline(stopped: bool) -> None:
    """A worker alive but silent (stopped, or stuck in the middle of a message) cannot hang the monitor."""
    model_fn, data, loss_fn, steps, limit = ((H.slow_mlp, H.long_data, H.loss_fn, 200, 4) if stopped
                                             else (H.mlp, H.mlp_data, F.stuck_mid_message, 2, 5))
    run = pl.launch(model_fn, pl.Plan.from_boundaries(5, [2]), method="1f1b-flush", data=data,
                    loss_fn=loss_fn, optimizer=H.sgd, steps=steps, microbatches=2, timeout=limit)
    pids = run.pids
    try:
        with HostLoadSampler() as load:
            if stopped:
                os.kill(pids[1], signal.SIGSTOP)
            with pytest.raises(WorkerError, match=f"did not finish within timeout={limit}"):
                run.wait()
            stopped_after = time.time() - run._t0
            gone_s, left = F.wait_gone(pids, 60.0)
        assert not left, f"workers {left} alive 60 s after the deadline stopped the run"
        holds_or_skip(stopped_after < limit + 6 and gone_s <= 5.0, load.result,
                      f"stopped {stopped_after:.1f} s after the start (timeout={limit} s; at most "
                      f"{limit + 6} s expected), workers gone {gone_s:.1f} s later (5 s expected)")
    finally:
        F.kill_all(pids)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_wsp_server_ignores_ctrl_c() -> None:
    import multiprocessing as mp

    import torch

    from pipelab.runtime import param_server as wsp

    ctx = mp.get_context("forkserver")
    a, b = ctx.Pipe()
    res_r, res_w = ctx.Pipe(duplex=False)
    shards = {0: {"w": torch.zeros(2).numpy()}}
    proc = ctx.Process(target=wsp.serve_process_main, args=([b], shards, 1, 0, res_w))
    proc.start()
    try:
        cl = wsp.WSPClient(a, 0, 0, timeout=60)
        cl.pull()                           # the server is up and serving
        os.kill(proc.pid, signal.SIGINT)
        cl.push({"w": torch.ones(2)})
        w, _ = cl.pull()                    # still serving after Ctrl-C
        assert torch.equal(w["w"], torch.ones(2)) and proc.is_alive()
        cl.stop()
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
