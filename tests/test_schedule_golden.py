"""Golden schedules: every builder's order written out literally, so that any change shows as a diff.

Each case is one builder at a small size; a row is one worker's actions in order (``1F0`` stage 1's
forward of microbatch 0, ``@v`` the weight version an asynchronous method reads, ``U`` the update
closing a minibatch). The long schedules are golden CSVs in torch's compute-only format under
``tests/golden/`` (:func:`pipelab.schedules.torch_format.to_torch_csv`). A deliberate change of an order
updates the literal here, in the same commit, where a reviewer sees it.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import pipelab.methods as methods
from pipelab.partition.plan import Plan
from pipelab.schedules import build, validate
from pipelab.schedules.actions import Schedule
from pipelab.schedules.torch_format import to_torch_order

GOLDEN = Path(__file__).parent / "golden"

CASES = [
    ('gpipe', 3, {'microbatches': 4}, [
        '0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3 0U0',
        '1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3 1U0',
        '2F0 2F1 2F2 2F3 2B0 2B1 2B2 2B3 2U0',
    ]),
    ('1f1b-flush', 3, {'microbatches': 4}, [
        '0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 0U0',
        '1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3 1U0',
        '2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2U0',
    ]),
    ('zb-h1', 3, {'microbatches': 4}, [
        '0F0 0F1 0F2 0B0 0W0 0F3 0B1 0W1 0B2 0W2 0B3 0W3 0U0',
        '1F0 1F1 1B0 1F2 1B1 1W0 1F3 1B2 1W1 1B3 1W2 1W3 1U0',
        '2F0 2B0 2F1 2B1 2F2 2B2 2W0 2F3 2B3 2W1 2W2 2W3 2U0',
    ]),
    ('zb-h2', 3, {'microbatches': 6}, [
        '0F0 0F1 0F2 0F3 0F4 0B0 0W0 0B1 0F5 0B2 0W1 0B3 0W2 0B4 0W3 0W4 0B5 0W5 0U0',
        '1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1W0 1B3 1F5 1B4 1W1 1W2 1B5 1W3 1W4 1W5 1U0',
        '2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4 2W0 2F5 2B5 2W1 2W2 2W3 2W4 2W5 2U0',
    ]),
    ('interleaved-1f1b', 2, {'microbatches': 4, 'chunks': 2}, [
        '0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3 0U0 2U0',
        '1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3 1U0 3U0',
    ]),
    ('interleaved-1f1b', 3, {'microbatches': 4, 'chunks': 2}, [
        '0F0 0F1 0F2 0F3 3F0 3F1 3F2 3F3 3B0 3B1 3B2 3B3 0B0 0B1 0B2 0B3 0U0 3U0',
        '1F0 1F1 1F2 1F3 4F0 4F1 4F2 4B0 4F3 4B1 4B2 4B3 1B0 1B1 1B2 1B3 1U0 4U0',
        '2F0 2F1 2F2 2F3 5F0 5B0 5F1 5B1 5F2 5B2 5F3 5B3 2B0 2B1 2B2 2B3 2U0 5U0',
    ]),
    ('zb-v', 2, {'microbatches': 4}, [
        ('0F0 0F1 0F2 3F0 3B0 3F1 3B1 3W0 3W1 0B0 0B1 3F2 3B2 3W2 0W0 0B2 0F3 0W1 0W2 3F3 3B3 '
         '3W3 0B3 0W3 0U0 3U0'),
        ('1F0 2F0 1F1 2F1 1F2 2B0 2B1 1B0 1B1 2F2 2W0 2W1 2B2 1B2 2W2 1W0 1F3 2F3 1W1 1W2 2B3 '
         '1B3 2W3 1W3 1U0 2U0'),
    ]),
    ('dualpipe', 2, {'microbatches': 4}, [
        '0F0 1F1 0F2 1B1 1W1 1F3 0B0 1B3 0B2 1W3 0W0 0W2 0U0 1U0',
        '0F1 1F0 0F3 1B0 1W0 1F2 0B1 1B2 0B3 1W2 0W1 0W3 0U0 1U0',
    ]),
    ('dualpipev', 2, {'microbatches': 4}, [
        ('0F0 0F1 0F2 3F0 3B0 3F1 3W0 0F3 3B1 3W1 3F2 0B0 3B2 3W2 0W0 3F3 0B1 3B3 0B2 3W3 0B3 '
         '0W1 0W2 0W3 0U0 3U0'),
        ('1F0 2F0 1F1 2F1 1F2 2B0 2W0 2F2 1B0 1W0 1F3 2B1 2B2 2W1 2F3 1B1 1B2 2W2 2B3 1B3 2W3 '
         '1W1 1W2 1W3 1U0 2U0'),
    ]),
    ('dp', Plan.from_boundaries(2, [], [2]), {'microbatches': 2, 'minibatches': 2}, [
        '0F0 0B0 0U0 0F2 0B2 0U1',
        '0F1 0B1 0U0 0F3 0B3 0U1',
    ]),
    ('1f1b-flush', Plan.from_boundaries(2, [1], [2, 1]), {'microbatches': 4}, [
        '0F0 0F2 0B0 0B2 0U0',
        '0F1 0F3 0B1 0B3 0U0',
        '1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1U0',
    ]),
    ('pipedream', 3, {'minibatches': 6}, [
        ('0F0@0 0F1@0 0F2@0 0B0@0 0U0 0F3@1 0B1@0 0U1 0F4@2 0B2@0 0U2 0F5@3 0B3@1 0U3 0B4@2 '
         '0U4 0B5@3 0U5'),
        ('1F0@0 1F1@0 1B0@0 1U0 1F2@1 1B1@0 1U1 1F3@2 1B2@1 1U2 1F4@3 1B3@2 1U3 1F5@4 1B4@3 '
         '1U4 1B5@4 1U5'),
        ('2F0@0 2B0@0 2U0 2F1@1 2B1@1 2U1 2F2@2 2B2@2 2U2 2F3@3 2B3@3 2U3 2F4@4 2B4@4 2U4 '
         '2F5@5 2B5@5 2U5'),
    ]),
    ('naive-async', 2, {'minibatches': 4}, [
        '0F0@0 0F1@0 0B0@0 0U0 0F2@1 0B1@1 0U1 0F3@2 0B2@2 0U2 0B3@3 0U3',
        '1F0@0 1B0@0 1U0 1F1@1 1B1@1 1U1 1F2@2 1B2@2 1U2 1F3@3 1B3@3 1U3',
    ]),
    ('pipemare', 2, {'minibatches': 4}, [
        '0F0@0 0F1@0 0B0@0 0U0 0F2@1 0B1@1 0U1 0F3@2 0B2@2 0U2 0B3@3 0U3',
        '1F0@0 1B0@0 1U0 1F1@1 1B1@1 1U1 1F2@2 1B2@2 1U2 1F3@3 1B3@3 1U3',
    ]),
    ('2bw', 2, {'microbatches': 2, 'minibatches': 3}, [
        '0F0@0 0F1@0 0B0@0 0F2@0 0B1@0 0U0 0F3@0 0B2@0 0F4@1 0B3@0 0U1 0F5@1 0B4@1 0B5@1 0U2',
        '1F0@0 1B0@0 1F1@0 1B1@0 1U0 1F2@0 1B2@0 1F3@0 1B3@0 1U1 1F4@1 1B4@1 1F5@1 1B5@1 1U2',
    ]),
    ('buffered', 3, {'microbatches': 2, 'minibatches': 3, 'versions': 3}, [
        '0F0@0 0F1@0 0F2@0 0B0@0 0F3@0 0B1@0 0U0 0F4@0 0B2@0 0F5@0 0B3@0 0U1 0B4@0 0B5@0 0U2',
        '1F0@0 1F1@0 1B0@0 1F2@0 1B1@0 1U0 1F3@0 1B2@0 1F4@0 1B3@0 1U1 1F5@0 1B4@0 1B5@0 1U2',
        '2F0@0 2B0@0 2F1@0 2B1@0 2U0 2F2@0 2B2@0 2F3@0 2B3@0 2U1 2F4@0 2B4@0 2F5@0 2B5@0 2U2',
    ]),
    ('hetpipe', Plan.from_boundaries(2, [1], [2, 2]), {'minibatches': 4}, [
        '0F0@0 0F2@0 0B0@0 0U0 0B2@0 0U2',
        '0F1@0 0F3@0 0B1@0 0U1 0B3@0 0U3',
        '1F0@0 1B0@0 1U0 1F2@1 1B2@1 1U2',
        '1F1@0 1B1@0 1U1 1F3@1 1B3@1 1U3',
    ]),
]


def _rows(sch: Schedule) -> list[str]:
    return [" ".join(str(a) + ("" if sch.versions is None or a.kind == "U" else f"@{sch.versions[w][i]}")
                     for i, a in enumerate(acts)) for w, acts in enumerate(sch.actions)]


@pytest.mark.parametrize("name, plan, options, expected", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_builder_matches_its_golden_grid(name, plan, options, expected):
    sch = build(name, plan, **options)
    validate(sch)
    assert _rows(sch) == expected


def test_every_builder_has_a_golden_grid():
    orders = {methods.get(c[0]).order for c in CASES} | {methods.get(n).order for n, *_ in TORCH_CSV}
    assert orders == {m.order for m in methods.METHODS.values()}


#: (method, workers P, options, file): long synchronous schedules as torch's compute-only CSV
TORCH_CSV = [
    ("zb-h2", 4, {"microbatches": 8}, "zb-h2_P4_M8.csv"),
    ("zb-v", 4, {"microbatches": 8}, "zb-v_P4_M8.csv"),
    ("dualpipev", 4, {"microbatches": 8}, "dualpipev_P4_M8.csv"),
    ("interleaved-1f1b", 4, {"microbatches": 6, "chunks": 2}, "interleaved-1f1b_P4_v2_M6.csv"),
    ("interleaved-1f1b", 4, {"microbatches": 8, "chunks": 2}, "interleaved-1f1b_P4_v2_M8.csv"),
]


@pytest.mark.parametrize("name, P, options, file", TORCH_CSV, ids=[c[3] for c in TORCH_CSV])
def test_long_builder_matches_its_golden_torch_csv(name, P, options, file):
    sch = build(name, P, **options)
    validate(sch)
    with open(GOLDEN / file, newline="", encoding="utf-8") as fh:
        golden = {r: row for r, row in enumerate(csv.reader(fh))}
    assert to_torch_order(sch) == golden


def test_a_changed_order_shows_as_a_diff():
    """The check can fail: one swapped pair of actions no longer matches its golden rows."""
    name, plan, options, expected = CASES[1]
    sch = build(name, plan, **options)
    acts = [list(a) for a in sch.actions]
    acts[0][3], acts[0][4] = acts[0][4], acts[0][3]
    changed = Schedule(method=sch.method, num_stages=sch.num_stages, stage_ranks=sch.stage_ranks,
                       microbatches=sch.microbatches, minibatches=sch.minibatches,
                       actions=tuple(tuple(a) for a in acts), options=sch.options)
    assert _rows(changed) != expected


def test_interleaved_for_any_m_is_torchs_order_wherever_torch_builds_one():
    """Oracle: torch's ScheduleInterleaved1F1B (rounds of M // (M // P) microbatches) where it accepts M."""
    from pipelab.schedules import ScheduleError
    from pipelab.schedules.torch_format import from_torch

    compared = 0
    for P in (2, 3, 4):
        for v in (2, 3):
            for M in range(P, 3 * P + 2):
                try:
                    theirs = from_torch("Interleaved1F1B", workers=P, microbatches=M, stages_per_worker=v)
                except ScheduleError:
                    continue                   # torch needs M // P rounds to divide M
                ours = build("interleaved-1f1b", P, microbatches=M, chunks=v)
                assert [[a for a in acts if a.kind != "U"] for acts in ours.actions] == \
                    [[a for a in acts if a.kind != "U"] for acts in theirs.actions], (P, v, M)
                compared += 1 + (M % P > 0)
    assert compared >= 30


@pytest.mark.parametrize("P, M", [(2, 4), (3, 6), (4, 8), (4, 13), (6, 12)])
def test_zb_h2_has_no_bubble_inside_each_workers_span(P, M):
    """Closed form (Qi et al. §3.1, equal F, B, W): with M >= 2P every worker computes its 3M units
    without a gap, starting at its stage index; at most 2P - 1 microbatches in flight per stage."""
    from pipelab.schedules.dataflow import UnitCosts, run

    sch = build("zb-h2", P, microbatches=M)
    events = [e for e in run(sch, UnitCosts()) if e.kind != "U"]
    for w in range(P):
        mine = sorted((e.start_s, e.end_s) for e in events if e.worker == w)
        assert mine[0][0] == w and mine[-1][1] == w + 3 * M
        assert sum(b[0] - a[1] for a, b in zip(mine, mine[1:])) == 0
        assert sch.in_flight(w) <= 2 * P - 1


def _makespan_and_held(sch: Schedule) -> tuple[float, int]:
    """(unit-cost makespan, most stage-microbatches a worker's stages hold at their peaks)."""
    from pipelab.schedules.dataflow import UnitCosts, run

    end = max(e.end_s for e in run(sch, UnitCosts()))
    held = max(sum(sch.in_flight(s) for s in sch.stages_of(w)) for w in range(sch.num_workers))
    return end, held


def _live(sch: Schedule, worker: int) -> int:
    """Most stage-microbatches ``worker`` holds at once (F adds; W, or B of a stage without W, frees)."""
    split = {a.stage for a in sch.actions[worker] if a.kind == "W"}
    live = best = 0
    for a in sch.actions[worker]:
        live += a.kind == "F"
        live -= a.kind == "W" or (a.kind == "B" and a.stage not in split)
        best = max(best, live)
    return best


@pytest.mark.parametrize("ours, theirs, factor, extra_held", [("zb-v", "ZBVZeroBubble", 1, 2),
                                                              ("dualpipev", "DualPipeV", 1, 3)])
def test_v_schedules_take_as_long_as_torchs_where_torch_builds_them(ours, theirs, factor, extra_held):
    """Oracle: torch 2.14's own ScheduleZBVZeroBubble / ScheduleDualPipeV under equal unit costs:
    pipelab's rule-built order ends at the same time (ZB-V: P dividing M, as its steady state needs;
    DualPipeV: every even M from 2P to 4P), its stages' peaks summed at most ``factor * torch's +
    extra_held``; DualPipeV holds at once exactly what torch's does, 2P + 1 (DeepSeek's PP + 1)."""
    from pipelab.schedules.torch_format import from_torch

    for P in (2, 3, 4, 6):
        for M in ((2 * P, 4 * P) if ours == "zb-v" else range(2 * P, 4 * P + 1, 2)):
            mine = build(ours, P, microbatches=M)
            end, held = _makespan_and_held(mine)
            torch_order = from_torch(theirs, workers=P, microbatches=M)
            t_end, t_held = _makespan_and_held(torch_order)
            assert end == t_end, (P, M)
            assert held <= factor * t_held + extra_held, (P, M, held, t_held)
            if ours == "dualpipev":
                at_once = max(_live(mine, w) for w in range(P))
                assert at_once == max(_live(torch_order, w) for w in range(P)) == 2 * P + 1, (P, M)


def test_dualpipe_beats_1f1b_and_holds_under_its_bound():
    """Both directions fill each other's bubbles: with equal unit costs DualPipe on P workers ends
    before 1F1B-flush on the same P stages; a stage holds at most P microbatches (its two copies
    together, as 1F1B's first stage)."""
    for P in (2, 4, 6, 8):
        for M in (2 * P, 4 * P):
            dual, flush = build("dualpipe", P, microbatches=M), build("1f1b-flush", P, microbatches=M)
            assert _makespan_and_held(dual)[0] < _makespan_and_held(flush)[0]
            assert max(dual.in_flight(s) for s in range(P)) <= P


def test_a_hand_edited_new_schedule_that_deadlocks_gets_the_grid_with_the_step_marked():
    """ZB-H2 edited by hand: worker 0 runs 0B0 before 0F1 while worker 1 runs 1F1 before 1B0, so each
    waits for the other; the validator names the deadlock and brackets the step in the grid."""
    from pipelab.schedules import ScheduleError
    from pipelab.schedules.actions import Action

    sch = build("zb-h2", 2, microbatches=4)
    w0, w1 = list(sch.actions[0]), list(sch.actions[1])
    for a in (Action(0, "W", 0), Action(0, "B", 0)):
        w0.remove(a)
        w0.insert(1, a)
    i, j = w1.index(Action(1, "B", 0)), w1.index(Action(1, "F", 1))
    w1[i], w1[j] = w1[j], w1[i]
    edited = Schedule(method=sch.method, num_stages=2, stage_ranks=sch.stage_ranks, microbatches=4,
                      minibatches=1, actions=(tuple(w0), tuple(w1)), options=sch.options)
    with pytest.raises(ScheduleError, match="deadlock") as info:
        validate(edited)
    assert "[0B0]" in str(info.value) or "[1F1]" in str(info.value)


def test_the_simulator_prices_an_f_and_b_pair_as_its_two_computations_in_turn():
    """docs/schedules.md's decision: DualPipe's F&B pair is two actions on one device, F + B long (no
    overlap discount: pipelab models no all-to-all for it to hide): a worker's events never overlap,
    F&B pairs included."""
    import pipelab as pl
    from pipelab.profile.records import Profile

    prof = Profile.synthetic([1e-3] * 8, [2e-3] * 8, out_bytes=[1000] * 8, param_bytes=[1000] * 8)
    res = pl.simulate(4, prof, pl.Cluster.flat(4), method="dualpipev", microbatches=8)
    assert res.schedule.options["overlap"] == "F&B"
    pairs = 0
    for w in range(4):
        events = sorted((e for e in res.trace.events if e.worker == w and e.kind in "FBW"),
                        key=lambda e: e.start_s)
        assert all(b.start_s >= a.end_s - 1e-12 for a, b in zip(events, events[1:]))
        pairs += sum(a.kind == "F" and b.kind == "B" and a.stage != b.stage
                     for a, b in zip(events, events[1:]))
    assert pairs > 0
