"""Per-pair message order (pipelab.schedules.messages): every method's schedule, with each of its
options, sends and receives the messages between two workers in one sequence, so a transport that
matches by order (NCCL, MPI, the tag-blind gloo transport) delivers each receive its own message;
a schedule that would need out-of-order matching is refused by the validator, naming the pair."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import pipelab.methods as methods
from pipelab.partition.plan import Plan
from pipelab.schedules import ScheduleError, build, validate
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.messages import Message, first_mismatch, pair_sequences, sent_by

STRAIGHT = Plan.from_boundaries(4, [1, 2], [1, 1, 1])
REPLICATED = Plan.from_boundaries(4, [1, 2], [2, 1, 2])     # 5 workers, replicated first and last stage
HETPIPE = Plan.from_boundaries(4, [2], [2, 2])              # 2 virtual workers of 2 stages
EVEN = Plan.from_boundaries(4, [2], [2, 2])                 # replicated stages, one replica count
FOUR = Plan.from_boundaries(4, [1, 2, 3])                   # 4 stages: a V on 2 workers, or DualPipe's 4
#: orders that take only unreplicated plans: (plan, microbatches) each needs (M >= P; DualPipe M >= 2P)
STRAIGHT_ONLY = {"zb-h2": (STRAIGHT, 4), "zb-v": (FOUR, 4), "dualpipe": (FOUR, 8), "dualpipev": (FOUR, 4)}


def _cases() -> list[tuple[str, Any, dict[str, Any]]]:
    """(method, plan, options) for every method and each of its schedule options."""
    out: list[tuple[str, Any, dict[str, Any]]] = []
    for name in methods.names():
        m = methods.get(name)
        if m.order == "dp":
            out += [(name, Plan.from_boundaries(4, [], [3]), {"microbatches": 3, "minibatches": 2}),
                    (name, Plan.from_boundaries(4, [], [2]), {"microbatches": 4, "minibatches": 3})]
        elif m.order == "interleaved":
            out += [(name, P, {"chunks": c, "microbatches": M, "minibatches": 2})
                    for P in (2, 3, 4) for c in (1, 2, 3) for M in (P, 2 * P)]
        elif m.order in STRAIGHT_ONLY:
            plan, M = STRAIGHT_ONLY[m.order]
            out += [(name, plan, {"microbatches": M, "minibatches": 2}),
                    (name, plan, {"microbatches": M + 2, "minibatches": 1})]
        elif m.order == "hetpipe":
            out += [(name, HETPIPE, {"D": d, "minibatches": 12}) for d in (0, 1, 2)]
            out += [(name, HETPIPE, {"D": 0, "minibatches": 12, "drain_every": 4})]
        else:
            plans = [STRAIGHT] if m.order == "coalesced" else [STRAIGHT, REPLICATED]
            for plan in plans:
                base: dict[str, Any] = {"minibatches": 6}
                if m.update == "minibatch":
                    base["microbatches"] = 4 if m.order != "coalesced" else 3
                out.append((name, plan, base))
                if not m.synchronous:
                    out.append((name, plan, {**base, "drain_every": 2}))
                for o in m.options:
                    if o.kind == "bool":   # vertical_sync needs one replica count
                        p = EVEN if plan is REPLICATED else plan
                        out.append((name, p, {**base, o.name: not o.default}))
                    elif o.kind == "int":
                        out.append((name, plan, {**base, o.name: int(o.default or 0) + 1}))
    return out


CASES = _cases()


def test_every_method_and_option_is_covered() -> None:
    covered = {(n, k) for n, _, opts in CASES for k in opts}
    for name in methods.names():
        m = methods.get(name)
        assert any(n == name for n, _, _ in CASES)
        for o in m.options:
            assert (name, o.name) in covered, (name, o.name)
        if not m.synchronous and m.order != "coalesced":
            assert (name, "drain_every") in covered


@pytest.mark.parametrize("name,plan,opts", CASES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CASES)])
def test_every_schedule_keeps_one_message_order_per_pair(name: str, plan: Any, opts: dict[str, Any]) -> None:
    sch = build(name, plan, **opts)
    validate(sch)    # includes the per-pair order check
    pairs = pair_sequences(sch)
    for seq in pairs.values():
        assert first_mismatch(seq) is None
        assert seq.sent == seq.received
    # oracle: every F/B whose peer stage runs on another worker is exactly one message of one pair
    expected = sum(
        1 for w, acts in enumerate(sch.actions) for a in acts
        if (a.kind == "F" and a.stage < sch.num_stages - 1 and sch.worker_of(a.stage + 1, a.microbatch) != w)
        or (a.kind == "B" and a.stage > 0 and sch.worker_of(a.stage - 1, a.microbatch) != w)
    )
    assert sum(len(s.sent) for s in pairs.values()) == expected
    if sch.num_stages > 1:
        assert expected > 0


def _swap(sch: Schedule, worker: int, i: int, j: int) -> Schedule:
    acts = [list(a) for a in sch.actions]
    acts[worker][i], acts[worker][j] = acts[worker][j], acts[worker][i]
    return replace(sch, actions=tuple(tuple(a) for a in acts))


def reordered_gpipe() -> Schedule:
    """GPipe over 2 workers, M = 2, with worker 1's two forwards swapped: valid with tags (no deadlock,
    one flush per minibatch) but worker 0 sends act 0F0 then 0F1 while worker 1 receives 0F1 first."""
    sch = build("gpipe", 2, microbatches=2, minibatches=1)
    assert [str(a) for a in sch.actions[1][:2]] == ["1F0", "1F1"]
    return _swap(sch, 1, 0, 1)


def test_a_reordered_schedule_is_refused_naming_the_pair_and_the_messages() -> None:
    bad = reordered_gpipe()
    with pytest.raises(ScheduleError) as err:
        validate(bad)
    msg = str(err.value)
    assert "per-pair message order: worker 0 sends to worker 1 in the order [act of 0F0, act of 0F1]" in msg
    assert "worker 1 receives from worker 0 in the order [act of 0F1, act of 0F0]" in msg
    assert "message #0 (act of 0F0) to the receive for act of 0F1" in msg
    row = next(line for line in msg.splitlines() if line.startswith("w1 "))
    assert "[1F1]" in row       # the receive that would get the wrong message is marked


def test_only_the_order_check_refuses_it() -> None:
    """The reordered schedule passes every other rule: with tags it would run; by order it cannot."""
    import importlib
    vmod = importlib.import_module("pipelab.schedules.validate")
    bad = reordered_gpipe()
    for rule in ("_structure", "_order", "_versions", "_segments", "_deadlock"):
        getattr(vmod, rule)(bad)
    with pytest.raises(ScheduleError):
        vmod.check_message_order(bad)


def test_mixed_directions_on_one_pair_are_ordered_too() -> None:
    """Interleaved over 2 workers: worker 0 sends worker 1 activations of stages 0 and 2 and the
    gradient of stage 2 on one pair; swapping a gradient ahead of an activation is caught."""
    sch = build("interleaved-1f1b", 2, chunks=2, microbatches=2, minibatches=1)
    seq = pair_sequences(sch)[(0, 1)]
    assert {m.kind for m in seq.sent} == {"act", "grad"} and {m.stage for m in seq.sent} == {0, 2}
    # move worker 1's first backward of stage 1 (needs grad of 2B) ahead of its forward of stage 3
    acts = list(sch.actions[1])
    b = next(i for i, a in enumerate(acts) if a == Action(1, "B", 0))
    f = max(i for i, a in enumerate(acts) if a.kind == "F" and a.stage == 3 and i < b)
    bad = _swap(sch, 1, f, b)
    with pytest.raises(ScheduleError, match="per-pair message order|deadlock|runs before"):
        validate(bad)


def test_message_names() -> None:
    assert str(Message("act", 0, 3)) == "act of 0F3"
    assert str(Message("grad", 2, 1)) == "grad of 2B1"


def test_who_an_action_sends_to_is_the_neighbour_stage_on_another_worker() -> None:
    sch = build("1f1b-flush", 2, microbatches=2)
    assert sent_by(sch, 0, Action(0, "F", 0)) is not None and sent_by(sch, 0, Action(0, "F", 0))[0] == 1
    assert sent_by(sch, 1, Action(1, "B", 0)) is not None and sent_by(sch, 1, Action(1, "B", 0))[0] == 0
    assert sent_by(sch, 1, Action(1, "F", 0)) is None       # the last stage sends no activation
    assert sent_by(sch, 0, Action(0, "B", 0)) is None       # the first stage sends no gradient
    inter = build("interleaved-1f1b", 2, microbatches=2, chunks=2)
    # stage 1 (worker 1) hands stage 2 (worker 0) its activation: another worker, a message
    assert sent_by(inter, 1, Action(1, "F", 0)) is not None and sent_by(inter, 1, Action(1, "F", 0))[0] == 0
