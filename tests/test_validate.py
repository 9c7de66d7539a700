"""The validator catches broken schedules and shows the failing step in the printed grid."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelab.schedules import ScheduleError, build, validate
from pipelab.schedules.actions import Action, Schedule


def _edit(sch: Schedule, worker: int, acts: list[str], versions: list[int] | None = None) -> Schedule:
    lists = [list(a) for a in sch.actions]
    lists[worker] = [Action.parse(t) for t in acts]
    vers = None
    if sch.versions is not None:
        vers = [list(v) for v in sch.versions]
        vers[worker] = versions if versions is not None else [0] * len(acts)
    return replace(sch, actions=tuple(tuple(a) for a in lists),
                   versions=None if vers is None else tuple(tuple(v) for v in vers))


def _marked(msg: str, worker: int, text: str) -> bool:
    row = next(line for line in msg.splitlines() if line.startswith(f"w{worker} "))
    return f"[{text}]" in row


def test_deadlock_reported_with_stuck_step() -> None:
    """Stage 0 waiting for B0 before sending F1, while stage 1 (GPipe) waits for F1: deadlock."""
    sch = build("gpipe", 2, microbatches=2)
    bad = _edit(sch, 0, ["0F0", "0B0", "0F1", "0B1", "0U0"])
    bad = _edit(bad, 1, ["1F0", "1F1", "1B0", "1B1", "1U0"])
    with pytest.raises(ScheduleError) as err:
        validate(bad)
    msg = str(err.value)
    assert "deadlock" in msg and "waits for the activation of 0F1" in msg
    assert _marked(msg, 1, "1F1") or _marked(msg, 0, "0B0")


def test_backward_before_forward_on_same_worker() -> None:
    sch = build("1f1b-flush", 2, microbatches=2)
    bad = _edit(sch, 1, ["1B0", "1F0", "1F1", "1B1", "1U0"])
    with pytest.raises(ScheduleError, match="before its forward 1F0") as err:
        validate(bad)
    assert _marked(str(err.value), 1, "1B0")


def test_missing_and_duplicate_and_misplaced_actions() -> None:
    sch = build("gpipe", 2, microbatches=2)
    with pytest.raises(ScheduleError, match="1B1 is missing"):
        validate(_edit(sch, 1, ["1F0", "1F1", "1B0", "1U0"]))
    with pytest.raises(ScheduleError, match="appears twice"):
        validate(_edit(sch, 1, ["1F0", "1F1", "1B0", "1B1", "1B1", "1U0"]))
    with pytest.raises(ScheduleError, match="belongs on worker 1"):
        validate(_edit(sch, 0, ["0F0", "0F1", "1F0", "0B0", "0B1", "0U0"]))
    with pytest.raises(ScheduleError, match="stage 5 does not exist"):
        validate(_edit(sch, 0, ["0F0", "0F1", "5F0", "0B0", "0B1", "0U0"]))


def test_update_rules() -> None:
    """U before its minibatch's gradients; a sync method that does not flush."""
    sch = build("1f1b-flush", 2, microbatches=2)
    with pytest.raises(ScheduleError, match="updates before all of minibatch 0"):
        validate(_edit(sch, 1, ["1F0", "1B0", "1U0", "1F1", "1B1"]))
    two = build("gpipe", 2, microbatches=2, minibatches=2)
    acts = [str(a) for a in two.actions[0]]          # 0F0 0F1 0B0 0B1 0U0 0F2 0F3 0B2 0B3 0U1
    acts.remove("0F2")
    acts.insert(1, "0F2")                            # minibatch 1 forward before the flush
    with pytest.raises(ScheduleError, match="before stage 0's update of minibatch 0") as err:
        validate(_edit(two, 0, acts))
    assert _marked(str(err.value), 0, "0F2")


def test_version_rules() -> None:
    """Reading a version not yet produced, or breaking PipeDream's stashing, is caught."""
    sch = build("pipedream", 2, minibatches=4)
    acts = [str(a) for a in sch.actions[0]]
    vers = list(sch.versions[0])
    b1 = acts.index("0B1")
    vers[b1] += 1        # B1 must read the version F1 read
    with pytest.raises(ScheduleError, match="stash") as err:
        validate(_edit(sch, 0, acts, vers))
    assert _marked(str(err.value), 0, f"0B1@{vers[b1]}")
    vers = list(sch.versions[0])
    vers[0] = 3
    with pytest.raises(ScheduleError, match="only versions 0..0"):
        validate(_edit(sch, 0, acts, vers))


def test_replicas_need_matching_updates() -> None:
    from pipelab.partition.plan import Plan

    sch = build("1f1b-flush", Plan.from_boundaries(2, [1], [2, 1]), microbatches=4)
    acts = [str(a) for a in sch.actions[1]]
    acts.remove("0U0")
    with pytest.raises(ScheduleError, match="one U per minibatch"):
        validate(_edit(sch, 1, acts))


def test_long_schedules_print_a_window_around_the_failure() -> None:
    sch = build("1f1b-flush", 4, microbatches=64)
    acts = [str(a) for a in sch.actions[3]]
    i = acts.index("3B40")
    acts[i], acts[i - 1] = acts[i - 1], acts[i]      # 3B40 before 3F40
    with pytest.raises(ScheduleError) as err:
        validate(_edit(sch, 3, acts))
    msg = str(err.value)
    assert _marked(msg, 3, "3B40") and len(msg.splitlines()[2]) < 400
