"""Facts a worker precomputes from its schedule (pipelab.schedules.facts), without processes.

Oracles: counting by hand on small schedules, and the schedule's own weight versions.
"""

from __future__ import annotations

import pytest

from pipelab.partition.plan import Plan
from pipelab.schedules import build
from pipelab.schedules.facts import checkpoint_points, input_versions, update_pairs


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


def test_input_versions_count_the_input_stages_updates():
    sched = build("pipedream", 3, minibatches=9)
    assert input_versions(sched, 0, 0) == []
    for stage in (1, 2):
        rank = sched.stage_ranks[stage][0]
        got = input_versions(sched, rank, stage)
        # by hand: updates of stage 0 before its forward of each microbatch
        w0 = sched.stage_ranks[0][0]
        seen, before = 0, {}
        for a in sched.actions[w0]:
            if a.kind == "U":
                seen += 1
            elif a.kind == "F":
                before[a.microbatch] = seen
        fwd = [a.microbatch for a in sched.actions[rank] if a.stage == stage and a.kind == "F"]
        assert got == [before[m] for m in fwd]
        # and they are the versions the schedule itself records for stage 0's forwards (stashing)
        recorded = {a.microbatch: sched.version_of(w0, i) for i, a in enumerate(sched.actions[w0])
                    if a.kind == "F"}
        assert got == [recorded[m] for m in fwd]


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
