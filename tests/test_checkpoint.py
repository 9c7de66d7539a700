"""Checkpoints: round trip, a foreign plan refused, interrupted writes leave the previous one intact; drained
segments (schedule, validator, simulated cost against the closed form) and bit-exact resume of the
asynchronous methods and HetPipe (reference executor and gloo processes)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import test_runtime_async_helpers as H
import torch

from pipelab import schedules as S
from pipelab.partition.plan import Plan
from pipelab.runtime import checkpoint_files as ck
from pipelab.runtime import train
from pipelab.schedules import segments as seg
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import UnitCosts
from pipelab.schedules.steps import ScheduleError

PLAN = Plan.from_boundaries(4, [2])


def _state(v: float) -> dict:
    return {"stages": {0: {"w": torch.full((3,), v)}}, "step": int(v), "versions": [0, 1],
            "rng": torch.get_rng_state()}


def _save(root: Path, step: int, v: float, plan: Plan = PLAN) -> None:
    for r in range(plan.num_workers):
        ck.save_worker(root, step, r, _state(v + r), plan=plan, method="gpipe")
    ck.Sealer(root, plan=plan, method="gpipe").seal(step)


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
        ck.Sealer(tmp_path, plan=PLAN, method="gpipe").seal(5)


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
        from pipelab.runtime import checkpoint_files as ck
        plan = Plan.from_boundaries(4, [2]); root = {str(tmp_path)!r}
        for r in range(2):
            ck.save_worker(root, 1, r, {{"w": torch.ones(4)}}, plan=plan, method="gpipe")
        ck.Sealer(root, plan=plan, method="gpipe").seal(1)
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


# ---------------------------------------------------------------------- drained segments (schedules)

ASYNC = [("pipedream", {}), ("pipedream", {"vertical_sync": True}), ("naive-async", {}), ("pipemare", {}),
         ("2bw", {}), ("buffered", {"versions": 3})]


@pytest.mark.parametrize("method,kw", ASYNC)
def test_drained_schedule_validates_and_costs_one_fill_drain_per_segment(method: str, kw: dict) -> None:
    # imported here, not at collection: importing the submodule pipelab.sim.simulate early would shadow
    # the lazily exported function pipelab.sim.simulate that other test modules import by name
    from pipelab.sim.simulate import simulate_schedule

    P, K, N = 3, 12, 4
    plain = S.build(method, P, minibatches=K, **kw)
    drained = S.build(method, P, minibatches=K, drain_every=N, **kw)
    S.validate(drained)
    assert drained.options["segments"] == [N] * (K // N)
    # segment j is segment 0 shifted: microbatches by j*N*M, updates by j*N, versions by the updates before
    M = drained.microbatches
    one = S.build(method, P, minibatches=N, **kw)
    for w in range(drained.num_workers):
        n = len(one.actions[w])
        assert len(drained.actions[w]) == n * (K // N)
        for j in range(K // N):
            part = drained.actions[w][j * n:(j + 1) * n]
            assert [Action(a.stage, a.kind, a.microbatch + (j * N if a.kind == "U" else j * N * M)) for a in
                    one.actions[w]] == list(part)
            assert one.versions is not None and drained.versions is not None
            ups = sum(1 for a in one.actions[w] if a.kind == "U") * j
            assert [v + ups for v in one.versions[w]] == list(drained.versions[w][j * n:(j + 1) * n])
    # unit costs F=1, B=2 (b + w), no transfers: a straight 1F1B segment of n >= P minibatches (M each)
    # takes (n M + P - 1) * 3, so K/N segments pay (K/N - 1)(P - 1) * 3 more than one run of K
    f, bw = 1.0, 2.0
    t0 = simulate_schedule(plain, UnitCosts()).makespan
    t1 = simulate_schedule(drained, UnitCosts()).makespan
    assert t0 == (K * M + P - 1) * (f + bw)
    assert t1 - t0 == (K // N - 1) * (P - 1) * (f + bw)


def test_pl_simulate_shows_the_drain_cost() -> None:
    from pipelab.cluster import Cluster
    from pipelab.profile.records import Profile
    from pipelab.sim.simulate import simulate

    prof = Profile.synthetic(
        [1e-3] * 8, [2e-3] * 8, out_bytes=[1000] * 8, param_bytes=[1000] * 8, batch_size=32
    )
    cl = Cluster.flat(4, bandwidth=1e15)
    plan = Plan.even(8, 4, batch_size=32)
    a = simulate(plan, prof, cl, method="pipedream", minibatches=16)
    b = simulate(plan, prof, cl, method="pipedream", minibatches=16, drain_every=4)
    stage = 2 * (1e-3 + 2e-3)                      # two layers per stage, forward + backward
    assert b.makespan - a.makespan == pytest.approx(3 * 3 * stage, rel=1e-3)   # (16/4 - 1)(P - 1) stage


def test_segments_options_and_errors() -> None:
    plan = Plan.from_boundaries(4, [2], replicas=[2, 1])
    sch = S.build("pipedream", plan, minibatches=10, drain_every=4)
    assert sch.options["segments"] == [4, 4, 2] and seg.boundaries(sch) == [4, 8, 10]
    S.validate(sch)
    with pytest.raises(ScheduleError, match="multiple of 2"):
        S.build("pipedream", plan, minibatches=12, drain_every=3)
    with pytest.raises(ScheduleError, match="multiple of 4"):
        S.build("hetpipe", Plan.from_boundaries(4, [2], replicas=[2, 2]), minibatches=16, drain_every=6)
    with pytest.raises(ScheduleError, match="summing to minibatches=8"):
        S.build("2bw", 2, minibatches=8, segments=[3, 3])
    assert S.build("2bw", 2, minibatches=8, segments=[3, 5]).options["segments"] == [3, 5]
    assert "segments" not in S.build("gpipe", 2, minibatches=4, drain_every=2).options   # already drained
    assert seg.aligned_sizes(6, 10, 4) == [2, 4, 4] and seg.aligned_sizes(8, 3, 4) == [3]
    with pytest.raises(ScheduleError, match="drain_every"):
        seg.split_sizes(4, 0)
    with pytest.raises(ScheduleError, match="does not match part 0"):
        seg.concat([S.build("pipedream", 2, minibatches=2), S.build("pipedream", 3, minibatches=2)])


def test_overlapping_segments_rejected() -> None:
    sch = S.build("pipedream", 2, minibatches=4, drain_every=2)
    acts = [list(a) for a in sch.actions]
    # worker 0 starts segment 1's first forward before segment 0's last backward: not a cut
    i = acts[0].index(Action(0, "F", 2))
    acts[0][i - 2], acts[0][i] = acts[0][i], acts[0][i - 2]
    bad = Schedule(sch.method, sch.num_stages, sch.stage_ranks, sch.microbatches, sch.minibatches,
                   tuple(tuple(a) for a in acts), None, dict(sch.options))
    with pytest.raises(ScheduleError, match="segment"):
        seg.check_drained(bad)


# ---------------------------------------------------------------------- exact resume (runtime)

PLAN2 = Plan.from_boundaries(5, [2])
PLAN3 = Plan.from_boundaries(5, [1, 3])
HET2 = Plan.from_boundaries(5, [2], replicas=[2, 2])


def run(
    method: str, plan: Plan, *, steps: int, microbatches: int = 1, backend: str = "local", **kw: Any
) -> Any:
    return train(H.mlp, plan, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=H.momentum,
                 steps=steps, microbatches=microbatches, backend=backend, progress=False, timeout=120, **kw)


def assert_identical(a: Any, b: Any) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def versions_agree(r: Any) -> None:
    """Every action's recorded weight version is the (drained) schedule's."""
    s = r.schedule
    expect = {(w, i): v for w, vs in enumerate(s.versions) for i, v in enumerate(vs)}
    assert {(e.worker, e.step): e.weight_version for e in r.trace.compute_events()} == expect


REP = Plan.from_boundaries(5, [2], replicas=[2, 1])     # a replicated input stage (all-reduce pairs)
CASES = [("pipedream", PLAN3, 1, 12, 4, {}),
         ("pipedream", PLAN3, 1, 8, 4, {"vertical_sync": True}),
         ("pipedream", REP, 1, 8, 4, {}),
         ("naive-async", PLAN2, 1, 8, 4, {}),
         ("2bw", PLAN3, 2, 9, 3, {}),
         ("buffered", PLAN3, 2, 9, 3, {"versions": 3}),
         ("pipemare", PLAN3, 1, 12, 4, {"warmup_steps": 4}),
         ("hetpipe", HET2, 1, 16, 8, {"D": 0})]


@pytest.mark.parametrize("method,plan,M,steps,N,kw", CASES)
def test_async_resume_is_bit_exact(tmp_path: Path, method: str, plan: Plan, M: int, steps: int, N: int,
                                   kw: dict) -> None:
    full = run(method, plan, steps=steps, microbatches=M, checkpoint_every=N, checkpoint_dir=tmp_path, **kw)
    assert full.schedule.options["segments"] == [N] * (steps // N)
    versions_agree(full)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == [f"step-{steps - N:08d}", f"step-{steps:08d}"]
    assert ck.read_manifest(tmp_path)["extra"]["drain_every"] == N
    # resume from the middle checkpoint in a new job; without checkpoint_every the manifest's N is kept
    resumed = run(method, plan, steps=steps, microbatches=M, resume=ck.step_dir(tmp_path, steps - N), **kw)
    assert_identical(resumed, full)
    assert resumed.losses == full.losses[steps - N:]
    versions_agree(resumed)
    # the old way (no drain, resume refills a running pipeline) differs: the test can fail
    plain = run(method, plan, steps=steps, microbatches=M, **kw)
    assert H.max_diff(plain.state_dict(), full.state_dict()) > 0


def test_2bw_drained_follows_the_segmented_delayed_rule() -> None:
    # oracle: whole model, W(t+1) = W(t) - step(grad f_t(W(v(t)))), v(t) = max(k0, t - 1) with k0 the
    # first minibatch of t's drained segment (a drain restarts 2BW from the version it left)
    import copy

    steps, N = 7, 3
    r = run("2bw", PLAN3, steps=steps, microbatches=2, drain_every=N)
    torch.manual_seed(0)
    model = H.mlp()
    shadow = copy.deepcopy(model)
    opt = H.momentum(model.parameters())
    hist = [copy.deepcopy(model.state_dict())]
    it = iter(H.data())
    for t in range(steps):
        x, y = next(it)
        shadow.load_state_dict(hist[max(t - t % N, t - 1)])
        shadow.zero_grad()
        H.loss_fn(shadow(x), y).backward()
        for p, q in zip(model.parameters(), shadow.parameters()):
            p.grad = q.grad.clone()
        opt.step()
        hist.append(copy.deepcopy(model.state_dict()))
    assert H.max_diff(r.state_dict(), model.state_dict()) < 1e-6


def test_resume_with_another_interval_and_refusals(tmp_path: Path) -> None:
    full = run("pipedream", PLAN2, steps=8, checkpoint_every=4, checkpoint_dir=tmp_path / "a")
    # resume at 4 checkpointing every 3: segments [2, 2] put the checkpoint at step 6, a multiple of 3
    again = run("pipedream", PLAN2, steps=8, resume=tmp_path / "a" / "step-00000004", checkpoint_every=3,
                checkpoint_dir=tmp_path / "b")
    assert again.schedule.options["segments"] == [2, 2]
    assert [p.name for p in ck.list_checkpoints(tmp_path / "b")] == ["step-00000006"]
    assert H.max_diff(again.state_dict(), full.state_dict()) < 0.05      # same training, other drains
    with pytest.raises(ValueError, match="written for another plan"):
        run("pipedream", PLAN3, steps=8, resume=tmp_path / "a")
    with pytest.raises(ValueError, match="need the staleness bound D=0"):
        run("hetpipe", HET2, steps=16, D=1, checkpoint_every=8, checkpoint_dir=tmp_path / "c")
    sch = S.build("pipedream", PLAN2, minibatches=8)          # a caller's schedule without drains
    with pytest.raises(ValueError, match="not drained after"):
        train(H.mlp, PLAN2, schedule=sch, data=H.data, loss_fn=H.loss_fn, optimizer=H.momentum, steps=8,
              backend="local", progress=False, checkpoint_every=4, checkpoint_dir=tmp_path / "d")


def test_checkpoint_refused_while_in_flight() -> None:
    from pipelab.runtime.job import TrainArgs, prepare
    from pipelab.runtime.worker import Worker

    job = prepare(TrainArgs.of(model_fn=H.mlp, plan=PLAN2, method="pipedream", data=H.data,
                               loss_fn=H.loss_fn, optimizer=H.momentum, steps=4, backend="local"))
    w = Worker(job, 0)
    assert w.actions[0] == Action(0, "F", 0)
    w.checkpoint_state()                      # nothing in flight yet: fine
    w.run(0, [])
    with pytest.raises(RuntimeError, match=r"microbatches \[0\] are in flight"):
        w.checkpoint_state()


@pytest.mark.slow
@pytest.mark.parametrize("method,plan,steps,N,kw", [("pipedream", PLAN2, 8, 4, {}),
                                                      ("hetpipe", HET2, 16, 8, {"D": 0})])
def test_async_resume_exact_in_gloo_processes(tmp_path: Path, method: str, plan: Plan, steps: int, N: int,
                                              kw: dict) -> None:
    full = run(method, plan, steps=steps, backend="gloo", checkpoint_every=N, checkpoint_dir=tmp_path, **kw)
    resumed = run(method, plan, steps=steps, backend="gloo", resume=ck.step_dir(tmp_path, steps - N), **kw)
    assert_identical(resumed, full)
    ref = run(method, plan, steps=steps, backend="local", checkpoint_every=N, checkpoint_dir=tmp_path / "ref",
              **kw)
    assert_identical(ref, full)        # and the processes follow the reference executor exactly


# ---------------------------------------------------------------------- exact resume: the flushed methods
PLAN4 = Plan.from_boundaries(5, [1, 2, 3])                 # 4 stages: 2 workers x 2 chunks when interleaved
DP2 = Plan.from_boundaries(5, [], [2])
SYNC_CASES = [("gpipe", PLAN3, 2, {}),
              ("gpipe", Plan.from_boundaries(5, [2], [2, 1]), 2, {}),    # replicated stage: all-reduce
              ("dp", DP2, 2, {}),
              ("interleaved-1f1b", PLAN4, 2, {"chunks": 2}),
              ("zb-h1", PLAN3, 4, {}),
              ("1f1b-flush", PLAN3, 2, {"coalesce_wgrad": True})]


@pytest.mark.parametrize("method,plan,M,kw", SYNC_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(SYNC_CASES)])
def test_flushed_resume_is_bit_exact(tmp_path: Path, method: str, plan: Plan, M: int, kw: dict) -> None:
    steps, N = 6, 2
    plain = run(method, plan, steps=steps, microbatches=M, **kw)       # never checkpointed
    full = run(method, plan, steps=steps, microbatches=M, checkpoint_every=N, checkpoint_dir=tmp_path, **kw)
    assert_identical(full, plain)
    resumed = run(method, plan, steps=steps, microbatches=M, resume=ck.step_dir(tmp_path, 4), **kw)
    assert_identical(resumed, plain)
    assert resumed.losses == plain.losses[4:]
    # the optimizer state matters (momentum): two fresh steps from the restored weights alone differ
    fresh = run(method, plan, steps=2, microbatches=M, **kw)
    assert H.max_diff(fresh.state_dict(), plain.state_dict()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("method,plan,M,kw", [SYNC_CASES[3], SYNC_CASES[4], SYNC_CASES[2]],
                         ids=["interleaved-1f1b", "zb-h1", "dp"])
def test_flushed_resume_exact_in_gloo_processes(tmp_path: Path, method: str, plan: Plan, M: int,
                                                kw: dict) -> None:
    plain = run(method, plan, steps=6, microbatches=M, **kw)           # the reference executor, uninterrupted
    run(method, plan, steps=6, microbatches=M, backend="gloo", checkpoint_every=2, checkpoint_dir=tmp_path,
        **kw)
    resumed = run(method, plan, steps=6, microbatches=M, backend="gloo", resume=ck.step_dir(tmp_path, 4),
                  **kw)
    assert_identical(resumed, plain)
