"""Minibatches in flight: one definition (pipelab.metrics) against closed forms and the schedules."""

from __future__ import annotations

import pytest

import pipelab.metrics as metrics
from pipelab.partition.plan import Plan
from pipelab.schedules import build


def test_in_flight_closed_forms() -> None:
    # a straight pipeline of P stages keeps P - s in flight at stage s (1F1B warm-up plus one)
    assert [metrics.in_flight([1] * 4, s) for s in range(4)] == [4, 3, 2, 1]
    # PipeDream's NOAM = ceil(workers / input replicas) (SOSP'19 §3.2): "15-1" on 16 workers -> 2
    assert metrics.in_flight([15, 1], 0) == 2 and metrics.in_flight([15, 1], 0, per_replica=False) == 16
    assert Plan.from_boundaries(4, [2], replicas=[3, 1]).noam == 2
    with pytest.raises(ValueError, match="outside"):
        metrics.in_flight([1, 1], 2)


@pytest.mark.parametrize("reps", [(1, 1, 1), (2, 1), (1, 2), (3, 1, 2)])
def test_schedules_keep_what_the_formula_says(reps: tuple[int, ...]) -> None:
    # the asynchronous 1F1B schedule's measured in-flight count is the formula's, per stage
    P = len(reps)
    plan = Plan.from_boundaries(P + 1, list(range(1, P)), replicas=list(reps))
    sched = build("pipedream", plan, minibatches=24)
    assert [sched.in_flight(s) for s in range(P)] == [metrics.in_flight(reps, s) for s in range(P)]


def test_most_live_counts_forwards_until_their_last_gradient_action() -> None:
    assert metrics.most_live("FFBFBB") == 2
    assert metrics.most_live("FFBBWW", split_backward=True) == 2
    assert metrics.most_live("FBWFBW", split_backward=True) == 1
