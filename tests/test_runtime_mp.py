"""The runtime across real processes (gloo on CPU, one thread each): transparency, equality with the
reference executor, the executed order, live events, and faults that end the whole job.

The model of the transparency jobs holds an MLP branch and a small CNN branch with a skip
connection side by side (``Pair``), so one job per case checks both kinds of model (and cuts that
carry several live tensors) while paying the process start-up cost once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import test_runtime_helpers as H
from timing import holds_or_skip

import pipelab as pl
from pipelab.hostload import HostLoadSampler
from pipelab.runtime import WorkerError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
PAIR_L = 14
TESTS = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run(plan, method, backend, *, steps=5, microbatches=4, **kw):
    return pl.train(H.pair, plan, method=method, data=H.pair_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                    steps=steps, microbatches=microbatches, backend=backend, progress=False, timeout=120,
                    **kw)


def _same_order(res):
    sched = res.schedule
    assert res.trace.actions_by_worker() == {
        w: [str(a) for a in acts] for w, acts in enumerate(sched.actions)
    }


SYNC = [
    ("gpipe", [5, 9], [2, 1, 1], {}),                 # 4 workers, replicated input stage
    ("1f1b-flush", [7], [1, 1], {}),                  # 2 workers, straight
    ("interleaved-1f1b", [3, 7, 10], [1, 1, 1, 1], {"chunks": 2}),   # 2 workers x 2 chunks
    ("zb-h1", [3, 6, 10], [1, 1, 1, 1], {}),          # 4 workers, straight
    ("dp", [], [2], {}),                              # 2 replicas
    ("1f1b-flush", [6], [1, 2], {}),                  # 3 workers, replicated last stage
]


@pytest.mark.parametrize(
    "method,cuts,reps,opts", SYNC, ids=[f"{c[0]}-{'-'.join(map(str, c[2]))}" for c in SYNC]
)
def test_sync_methods_across_processes_equal_plain_training(method, cuts, reps, opts):
    plan = pl.Plan.from_boundaries(PAIR_L, cuts, reps)
    res = _run(plan, method, "gloo", **opts)
    ref = H.reference_pair(H.sgd, 5)
    assert H.max_diff(res.state_dict(), ref) < 1e-5
    local = _run(plan, method, "local", **opts)
    assert H.max_diff(res.state_dict(), local.state_dict()) < 1e-6
    assert res.losses == pytest.approx(local.losses, abs=1e-6)
    _same_order(res)
    assert set(res.trace.workers) == set(range(res.schedule.num_workers))
    assert res.throughput > 0
    for r in (res, local):
        _allreduce_before_each_replicated_update(r, plan)


def _allreduce_before_each_replicated_update(res, plan):
    """A replicated stage's U is two events, as in a simulated trace: the all-reduce (with the
    gradient bytes), then the step, starting where the all-reduce ended; other stages have none."""
    ar = {(e.worker, e.microbatch): e for e in res.trace.events if e.kind == "allreduce"}
    us = [e for e in res.trace.compute_events() if e.kind == "U"]
    replicated = {s.index for s in plan.stages if s.replicas > 1}
    for u in us:
        a = ar.pop((u.worker, u.microbatch), None)
        if u.stage not in replicated:
            assert a is None, u
            continue
        assert a is not None and a.stage == u.stage, u
        assert a.bytes > 0 and u.bytes == 0
        assert a.start_s <= a.end_s == pytest.approx(u.start_s, abs=1e-9)
    assert not ar, f"all-reduces without their U: {sorted(ar)[:3]}"


ASYNC = [
    ("pipedream", [4, 9], [1, 1, 1], {}),
    ("pipedream", [6], [2, 1], {}),
    ("pipedream", [4, 9], [1, 1, 1], {"vertical_sync": True}),
    ("naive-async", [7], [1, 1], {}),
]


@pytest.mark.parametrize("method,cuts,reps,opts", ASYNC,
                         ids=[f"{c[0]}-{'-'.join(map(str, c[2]))}{'-vsync' if c[3] else ''}" for c in ASYNC])
def test_async_methods_across_processes_equal_the_reference_executor(method, cuts, reps, opts):
    plan = pl.Plan.from_boundaries(PAIR_L, cuts, reps)
    res = _run(plan, method, "gloo", steps=8, microbatches=1, **opts)
    local = _run(plan, method, "local", steps=8, microbatches=1, **opts)
    assert H.max_diff(res.state_dict(), local.state_dict()) < 1e-6
    _same_order(res)
    sched = res.schedule
    f_of = {(e.stage, e.microbatch): e.weight_version for e in res.trace.compute_events() if e.kind == "F"}
    for e in res.trace.compute_events():
        assert e.weight_version == sched.version_of(e.worker, e.step), e
        if method == "pipedream" and e.kind == "B":
            assert e.weight_version == f_of[(e.stage, e.microbatch)]
        if opts.get("vertical_sync") and e.kind in "FB":
            assert e.weight_version == f_of[(0, e.microbatch)]
    assert res.versions_held == local.versions_held
    assert res.versions_held == {s: sched.versions_held(s) for s in range(sched.num_stages)}


def test_events_stream_live_and_the_trace_is_saved(tmp_path):
    plan = pl.Plan.from_boundaries(PAIR_L, [7])
    run = pl.launch(H.pair, plan, method="1f1b-flush", data=H.pair_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                    steps=6, microbatches=4, trace_path=tmp_path / "trace.jsonl", timeout=120)
    seen, done_at_first = [], None
    for ev in run.events:
        if done_at_first is None:
            done_at_first = run.done
        seen.append(ev)
    res = run.wait()
    assert done_at_first is False                 # the first event arrived while the job ran
    assert run.done
    assert sorted(seen, key=lambda e: (e.worker, e.start_s)) == sorted(res.trace.events,
                                                                         key=lambda e: (e.worker, e.start_s))
    back = pl.Trace.load_jsonl(tmp_path / "trace.jsonl")
    assert back.events == res.trace.events
    comp = res.trace.compute_events()
    assert min(e.start_s for e in comp) >= 0 and all(e.end_s >= e.start_s for e in comp)
    assert sum(e.bytes for e in comp if e.kind == "F" and e.stage == 0) > 0


def test_a_failing_worker_ends_the_job_with_its_traceback():
    plan = pl.Plan.from_boundaries(5, [2])
    run = pl.launch(H.mlp, plan, method="1f1b-flush", data=H.mlp_data, loss_fn=H.exploding_loss,
                    optimizer=H.sgd, steps=4, microbatches=4, timeout=120)
    pids = run.pids
    t = time.time()
    with HostLoadSampler() as load, pytest.raises(WorkerError) as info:
        run.wait()
    waited = time.time() - t
    msg = str(info.value)
    assert (
        "worker 1 (stage 1, action 1F4)" in msg and "boom: deliberate failure" in msg and "Traceback" in msg
    )
    assert (info.value.rank, info.value.stage, info.value.action) == (1, 1, "1F4")
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)
    holds_or_skip(waited < 30, load.result, f"the failure ended the job after {waited:.1f} s, over 30 s")


def test_cancel_kills_every_worker():
    plan = pl.Plan.from_boundaries(5, [2])
    run = pl.launch(H.slow_mlp, plan, method="1f1b-flush", data=H.long_data, loss_fn=H.loss_fn,
                    optimizer=H.sgd, steps=200, microbatches=2, timeout=120)
    pids = run.pids
    assert len(pids) == 2
    next(iter(run.events))            # it is running
    run.cancel()
    assert run.done
    with pytest.raises(WorkerError, match="cancelled"):
        run.wait()
    assert not any(_alive(p) for p in pids)


def test_ctrl_c_in_train_kills_every_worker(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import json, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        import pipelab as pl
        import test_runtime_helpers as H
        if __name__ == "__main__":
            # Ctrl-C as in a terminal, even if the test runner handed its children SIGINT ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)
            plan = pl.Plan.from_boundaries(5, [2])
            run = pl.launch(H.slow_mlp, plan, method="1f1b-flush", data=H.long_data, loss_fn=H.loss_fn,
                            optimizer=H.sgd, steps=200, microbatches=2, timeout=120)
            next(iter(run.events))
            print(json.dumps(run.pids), flush=True)
            run.wait()
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stdout.readline()
        pids = json.loads(line)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)


def test_dropout_streams_are_the_same_in_processes_and_in_the_reference_executor():
    plan = pl.Plan.from_boundaries(6, [2, 4])  # the dropout is a stage of its own
    kw = dict(method="1f1b-flush", data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=3,
              microbatches=2, progress=False, timeout=120)
    a = pl.train(H.dropout_mlp, plan, backend="gloo", **kw)
    b = pl.train(H.dropout_mlp, plan, backend="local", **kw)
    c = pl.train(H.dropout_mlp, plan, backend="local", recompute=True, **kw)   # recompute replays the masks
    assert H.max_diff(a.state_dict(), b.state_dict()) < 1e-6
    assert H.max_diff(b.state_dict(), c.state_dict()) < 1e-6
    assert a.losses == pytest.approx(b.losses, abs=1e-6)


def test_stream_off_sends_each_workers_events_once_at_its_end(monkeypatch):
    from pipelab.runtime.launch import Run

    batches: list[int] = []
    add = Run._add
    monkeypatch.setattr(Run, "_add", lambda self, evs: (batches.append(len(evs)), add(self, evs))[1])
    plan = pl.Plan.from_boundaries(PAIR_L, [7])
    streamed = _run(plan, "1f1b-flush", "gloo", steps=6)
    n_streamed = len(batches)
    batches.clear()
    quiet = _run(plan, "1f1b-flush", "gloo", steps=6, stream=False)
    # 6 x 9 actions per worker: streamed in batches of at most 32 (at least two per worker), or once
    assert n_streamed >= 4 and len(batches) == 2
    assert sum(batches) == len(quiet.trace.events)
    assert quiet.trace.actions_by_worker() == streamed.trace.actions_by_worker()
    assert H.max_diff(quiet.state_dict(), streamed.state_dict()) == 0
