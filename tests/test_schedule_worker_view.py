"""Facts a worker precomputes from its schedule (pipelab.schedules.worker_view), without processes.

Oracles: counting by hand on small schedules, and the schedule's own weight versions.
"""

from __future__ import annotations

import pytest

from pipelab.partition.plan import Plan
from pipelab.schedules import build
from pipelab.schedules.actions import Schedule
from pipelab.schedules.worker_view import checkpoint_points, stage_delays, stage_reads, update_pairs


def _never(_: int) -> bool:
    return False


def test_flushed_update_covers_the_minibatch():
    # 1F1B with a flush: each U of a stage closes one minibatch of M microbatches, so the summed
    # gradient is divided by M / M = 1, and the k-th U of a stage is its k-th update
    sched = build("1f1b-flush", 2, microbatches=4, minibatches=3)
    for rank in range(2):
        pair, div = update_pairs(sched, rank, [rank], _never, 4)
        us = [i for i, a in enumerate(sched.actions[rank]) if a.kind == "U"]
        assert [pair[i] for i in us] == [0, 1, 2]
        assert all(div[i] == 1.0 for i in us)


def test_replicated_pipedream_update_sums_one_minibatch_per_replica():
    # PipeDream with a 2-way replicated input stage: each replica's U closes one minibatch and the
    # replicas all-reduce, so the sum covers 2 minibatches (PipeDream SOSP'19 §3.2)
    plan = Plan.from_boundaries(2, [1], [2, 1])
    sched = build("pipedream", plan, minibatches=6)
    syncs = lambda s: len(sched.stage_ranks[s]) > 1  # noqa: E731
    for rank in sched.stage_ranks[0]:
        _, div = update_pairs(sched, rank, [0], syncs, 1)
        assert set(div.values()) == {2.0}


def test_vertical_sync_reads_count_the_input_stages_updates():
    sched = build("pipedream", 3, minibatches=9, vertical_sync=True)
    # by hand: updates of stage 0 before its forward of each microbatch
    w0 = sched.stage_ranks[0][0]
    seen, before = 0, {}
    for a in sched.actions[w0]:
        if a.kind == "U":
            seen += 1
        elif a.kind == "F":
            before[a.microbatch] = seen
    assert not stage_reads(sched, w0, 0).single
    for stage in (1, 2):
        rank = sched.stage_ranks[stage][0]
        reads = stage_reads(sched, rank, stage)
        fwd = [a.microbatch for a in sched.actions[rank] if a.stage == stage and a.kind == "F"]
        assert [m for m, _ in reads.forward] == fwd
        # every stage's forward and backward read the version the input stage's forward read (§3.3)
        assert [v for _, v in reads.forward] == [before[m] for m in fwd]
        assert reads.backward == {m: before[m] for m in fwd}


def test_stash_reads_newest_forward_and_the_same_backward():
    sched = build("pipedream", 3, minibatches=9)
    for rank in range(3):
        for stage in sched.stages_of(rank):
            reads = stage_reads(sched, rank, stage)
            seen, want_f = 0, []
            for a in sched.actions[rank]:
                if a.stage == stage and a.kind == "U":
                    seen += 1
                elif a.stage == stage and a.kind == "F":
                    want_f.append((a.microbatch, seen))
            assert list(reads.forward) == want_f
            assert reads.backward == dict(want_f)


def test_single_version_reads_and_unversioned_multi_version_schedule_refused():
    sched = build("1f1b-flush", 2, microbatches=4, minibatches=3)
    assert stage_reads(sched, 0, 0).single
    bare = Schedule("pipedream", 2, ((0,), (1,)), 1, 1, build("pipedream", 2, minibatches=1).actions,
                    options={"weights": "stash"})
    with pytest.raises(ValueError, match="records no weight versions"):
        stage_reads(bare, 0, 0)


def test_stage_delays_are_read_from_the_schedule_itself():
    # PipeDream-like async 1F1B, 3 stages: the input stage's forward is 2 updates old when its
    # gradient lands (NOAM - 1), the last stage's 0; backward reads the newest (naive async)
    sched = build("naive-async", 3, minibatches=12)
    assert stage_delays(sched) == {0: (2, 0), 1: (1, 0), 2: (0, 0)}
    # a run too short to fill the pipeline has the delays it really has, not steady-state ones
    assert stage_delays(build("naive-async", 3, minibatches=1)) == {0: (0, 0), 1: (0, 0), 2: (0, 0)}


@pytest.mark.parametrize("every,start,expect_steps", [(2, 0, [2, 4]), (1, 0, [1, 2, 3, 4]), (3, 2, [3, 6]),
                                                      (0, 0, [])])
def test_checkpoint_points_of_a_flushed_method(every, start, expect_steps):
    sched = build("gpipe", 2, microbatches=2, minibatches=4)
    for rank in range(2):
        pts = checkpoint_points(sched, rank, every, start)
        assert sorted(pts.values()) == expect_steps
        for i, step in pts.items():   # each is the last U of its minibatch on this worker
            a = sched.actions[rank][i]
            assert a.kind == "U" and start + a.microbatch + 1 == step
