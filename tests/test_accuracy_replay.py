"""The sim_accuracy reproduction's replay (``accuracy.MeasuredActions``), by oracles:
a simulated trace replayed with its own durations reproduces itself, and a trace whose actions of one
kind are sometimes long replays with their mean (the worker's real busy time), not their median."""

from __future__ import annotations

import dataclasses

import pytest

from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.partition.virtual import virtual_plan
from pipelab.profile.records import Profile
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.sim.simulate import ProfileCosts, simulate_schedule
from reproductions.sim_accuracy.accuracy import MeasuredActions


def _setup() -> tuple[Profile, Cluster, Plan, list[tuple[int, int]]]:
    prof = Profile.synthetic([1e-3, 2e-3, 1.5e-3, 1e-3], out_bytes=[4096] * 4, batch_size=8)
    cl = Cluster.preset(Cluster.presets()[0]).with_workers(2)
    plan = partition(prof, cl, method="gpipe", stages=2, microbatches=4)
    vplan = virtual_plan(plan, prof, 2)
    return prof, cl, vplan, [(s.start, s.end) for s in vplan.stages]


def test_replaying_a_simulated_trace_reproduces_it() -> None:
    prof, cl, vplan, ranges = _setup()
    cm = CostModel(prof, cl)
    sch = build("interleaved-1f1b", vplan, microbatches=4, minibatches=6, chunks=2)
    sim = simulate_schedule(sch, ProfileCosts(cm, ranges, 4), batch_size=8)
    rep = simulate_schedule(sch, MeasuredActions(sim.trace, cm, ranges, 4), batch_size=8)
    got, want = rep.trace.compute_events(), sim.trace.compute_events()
    assert [(e.worker, e.stage, e.kind, e.microbatch) for e in got] == \
        [(e.worker, e.stage, e.kind, e.microbatch) for e in want]
    assert [e.start_s for e in got] == pytest.approx([e.start_s for e in want])
    assert rep.time_per_minibatch == pytest.approx(sim.time_per_minibatch)


def test_replay_takes_the_mean_so_rare_long_actions_count() -> None:
    prof, cl, vplan, ranges = _setup()
    cm = CostModel(prof, cl)
    sch = build("interleaved-1f1b", vplan, microbatches=4, minibatches=6, chunks=2)
    sim = simulate_schedule(sch, ProfileCosts(cm, ranges, 4), batch_size=8)
    # one forward in four of stage 1 takes 5 ms longer (a blocking send inside the action)
    events = [dataclasses.replace(e, end_s=e.end_s + 5e-3) if (e.kind == "F" and e.stage == 1
              and e.microbatch % 4 == 0) else e for e in sim.trace.events]
    tr = dataclasses.replace(sim.trace, events=events)
    f1 = [e.end_s - e.start_s for e in tr.compute_events() if e.kind == "F" and e.stage == 1]
    costs = MeasuredActions(tr, cm, ranges, 4)
    w = sch.worker_of(1, 0)
    assert costs.compute(w, Action(1, "F", 0), False) == pytest.approx(sum(f1) / len(f1))
    assert costs.compute(w, Action(1, "F", 0), False) > sorted(f1)[len(f1) // 2] + 1e-3
    # a window that holds none of the long ones gives the short duration back
    late = [e.start_s for e in tr.compute_events() if e.kind == "F" and e.stage == 1]
    short = MeasuredActions(tr, cm, ranges, 4, window=(late[1] - 1e-9, late[3] + 1e-9))
    assert short.compute(w, Action(1, "F", 0), False) == pytest.approx(sorted(f1)[0])


def test_the_planners_default_is_in_the_matrix_as_the_planner_builds_it() -> None:
    """sim_accuracy's uniform split is the planner's default plan (1F1B, uniform, M = P), cut for cut."""
    import pipelab as pl
    from reproductions.sim_accuracy.accuracy import default_configurations, plan_for

    prof = Profile.synthetic([1e-3, 1e-3, 4e-3, 1e-3, 1e-3, 2e-3, 1e-3], out_bytes=[1000] * 7,
                             param_bytes=[4000] * 7, batch_size=16)
    for p in (2, 3):
        cl = Cluster.flat(p, bandwidth=5e9, memory=2**30)
        table = pl.plan(prof, cl, methods=["1f1b-flush"], compression=(None,), recompute=(False,))
        want = table.candidate(int(table.default.name))
        got = plan_for(prof, cl, "1f1b-flush", p, p, "uniform")
        assert [(s.start, s.end) for s in got.stages] == [(s.start, s.end) for s in want.plan.stages]
        assert want.microbatches == p
    # the balanced split is GPipe's: here it moves the cut away from the heavy layer, unlike the uniform one
    two = Cluster.flat(2)
    balanced, uniform = (plan_for(prof, two, "1f1b-flush", 2, 2, s) for s in ("balanced", "uniform"))
    assert [(s.start, s.end) for s in balanced.stages] != [(s.start, s.end) for s in uniform.stages]
    assert default_configurations(["cnn"], (2, 3)) == [("cnn", "1f1b-flush", 2, 2, "uniform"),
                                                       ("cnn", "1f1b-flush", 3, 3, "uniform")]
    with pytest.raises(ValueError, match="split"):
        plan_for(prof, Cluster.flat(2), "1f1b-flush", 2, 2, "even")
