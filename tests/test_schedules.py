"""Schedule builders: every method over a grid of (P, M) passes the validator; closed-form
structure (versions held, NOAM in flight); text/CSV round trips; clear errors on bad input."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelab import methods
from pipelab.partition.plan import Plan
from pipelab.schedules import ScheduleError, build, validate
from pipelab.schedules.actions import Action, Schedule

PER_MB = ("pipedream", "naive-async", "pipemare", "hetpipe")


def _kw(method: str, P: int, M: int) -> dict[str, int] | None:
    """Keyword arguments for build() over the grid, or None where the method does not apply."""
    if method in PER_MB:
        return {"minibatches": M} if M <= 8 else None
    if method == "dp" and M % P:
        return None
    if method == "interleaved-1f1b" and (M < P or (P == 2 and M % P)):   # P=2, odd M: refused (below)
        return None
    if method in ("zb-h2", "zb-v") and M < P:
        return None
    if method == "dualpipe" and (P % 2 or M < 2 * P or M % 2):
        return None
    if method == "dualpipev" and (M < 2 * P or M % 2):
        return None
    if method in ("2bw", "buffered") and M < P - 1:
        return None
    return {"microbatches": M, "minibatches": 2}


@pytest.mark.parametrize("method", methods.names())
def test_every_builder_valid_over_grid(method: str) -> None:
    """P in 1..8, M in 1..16 (where the method applies): the validator accepts every schedule."""
    count = 0
    for P, M in itertools.product(range(1, 9), range(1, 17)):
        kw = _kw(method, P, M)
        if kw is None:
            continue
        if method == "interleaved-1f1b":
            for v in (1, 2, 3):
                validate(build(method, P, chunks=v, **kw))
                count += 1
            continue
        sch = build(method, P, **kw)
        validate(sch)
        assert sch.num_workers == P
        count += 1
    assert count >= (15 if method.startswith("dualpipe") else 40)   # DualPipe: M >= 2P, even


def test_buffered_versions_grid() -> None:
    """buffered with K in 2..4 is valid and never holds more than K versions per stage."""
    for P, M, K in itertools.product(range(1, 7), (2, 4, 8), (2, 3, 4)):
        if -(-(P - 1) // (K - 1)) > M:
            with pytest.raises(ScheduleError, match="needs microbatches"):
                build("buffered", P, microbatches=M, minibatches=4, versions=K)
            continue
        sch = build("buffered", P, microbatches=M, minibatches=4, versions=K)
        validate(sch)
        assert all(sch.versions_held(s) <= K for s in range(P))


@given(reps=st.lists(st.integers(1, 3), min_size=1, max_size=4), M=st.integers(1, 6),
       method=st.sampled_from(["gpipe", "1f1b-flush", "zb-h1", "pipedream", "naive-async", "2bw"]))
@settings(max_examples=40, deadline=None)
def test_replicated_plans_valid(reps: list[int], M: int, method: str) -> None:
    """Plans with replicated stages (round-robin microbatches) build valid schedules."""
    plan = Plan.from_boundaries(len(reps), list(range(1, len(reps))), reps)
    try:
        sch = build(method, plan, **({} if method in PER_MB else {"microbatches": M}))
    except ScheduleError as exc:   # only the documented precondition of 2bw may refuse
        assert method == "2bw" and "needs microbatches" in str(exc)
        return
    validate(sch)
    for s, st_ in enumerate(plan.stages):
        assert sch.stage_ranks[s] == st_.ranks
    # every microbatch's F of stage s runs on replica m % r
    for w, acts in enumerate(sch.actions):
        for a in acts:
            if a.kind != "U":
                assert w == plan.stages[a.stage].ranks[a.microbatch % reps[a.stage]]


def test_closed_form_versions() -> None:
    """PipeDream holds P - s versions at stage s, P everywhere with vertical sync; naive async and
    PipeMare 1; 2BW 2; buffered K; sync methods 1 (SOSP'19 §3.3; ICML'21 §3)."""
    for P in range(1, 9):
        pd = build("pipedream", P, minibatches=3 * P)
        assert [pd.versions_held(s) for s in range(P)] == [P - s for s in range(P)]
        vs = build("pipedream", P, minibatches=3 * P, vertical_sync=True)
        assert [vs.versions_held(s) for s in range(P)] == [P] * P
        for m in ("naive-async", "pipemare"):
            na = build(m, P, minibatches=3 * P)
            assert [na.versions_held(s) for s in range(P)] == [1] * P
        for K in (2, 3, 4):
            bu = build("buffered", P, microbatches=max(P, 2), minibatches=3 * K, versions=K)
            assert [bu.versions_held(s) for s in range(P)] == [K] * P
        tb = build("2bw", P, microbatches=max(P, 1), minibatches=5)
        assert [tb.versions_held(s) for s in range(P)] == [2] * P
        fl = build("1f1b-flush", P, microbatches=4, minibatches=2)
        assert all(fl.versions_held(s) == 1 for s in range(P))


def test_pipedream_noam_in_flight() -> None:
    """NOAM = ceil(workers / input replicas) minibatches in flight at the input stage."""
    for reps in ([1, 1, 1, 1], [2, 1, 1], [3, 1], [2, 2], [1, 3], [5, 11]):
        plan = Plan.from_boundaries(len(reps), list(range(1, len(reps))), reps)
        sch = build("pipedream", plan)
        assert sch.in_flight(0) == plan.noam == -(-sum(reps) // reps[0])
        validate(sch)


def test_pipedream_stashing_rule() -> None:
    """B reads the version its F read; vertical sync uses the input stage's version everywhere."""
    sch = build("pipedream", 4, minibatches=12)
    for w, acts in enumerate(sch.actions):
        f_ver = {a.microbatch: sch.versions[w][i] for i, a in enumerate(acts) if a.kind == "F"}
        for i, a in enumerate(acts):
            if a.kind == "B":
                assert sch.versions[w][i] == f_ver[a.microbatch]
    vs = build("pipedream", 4, minibatches=12, vertical_sync=True)
    validate(vs)
    v0 = {a.microbatch: vs.versions[0][i] for i, a in enumerate(vs.actions[0]) if a.kind == "F"}
    for w, acts in enumerate(vs.actions):
        for i, a in enumerate(acts):
            if a.kind in "FB":
                assert vs.versions[w][i] == v0[a.microbatch]
    assert vs.versions != sch.versions


def test_2bw_update_rule() -> None:
    """2BW: minibatch k reads version max(0, k-1) on every stage (W(t+1) = W(t) - nu grad f(W(t-1)))."""
    sch = build("2bw", 4, microbatches=4, minibatches=6)
    for w, acts in enumerate(sch.actions):
        for i, a in enumerate(acts):
            if a.kind == "U":
                assert sch.versions[w][i] == a.microbatch + 1
            else:
                assert sch.versions[w][i] == max(0, a.microbatch // 4 - 1)


def test_sync_structure() -> None:
    """Sync methods: one U per stage per minibatch, at the end of each minibatch; dp round-robin."""
    sch = build("1f1b-flush", 3, microbatches=5, minibatches=3)
    for acts in sch.actions:
        us = [i for i, a in enumerate(acts) if a.kind == "U"]
        assert [acts[i].microbatch for i in us] == [0, 1, 2] and us[-1] == len(acts) - 1
    dp = build("dp", 4, microbatches=8)
    assert dp.num_stages == 1 and dp.stage_ranks == ((0, 1, 2, 3),)
    assert [str(a) for a in dp.actions[1]] == ["0F1", "0B1", "0F5", "0B5", "0U0"]
    inter = build("interleaved-1f1b", 2, microbatches=4, chunks=2)
    assert inter.stage_ranks == ((0,), (1,), (0,), (1,))
    assert {a.stage for a in inter.actions[1]} == {1, 3}


def test_grid_and_csv_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """str() prints one row per worker; CSV save/load is lossless (versions included)."""
    for sch in (build("pipedream", 3, minibatches=6), build("zb-h1", 3, microbatches=4)):
        text = str(sch)
        assert text.count("\nw") == sch.num_workers and "0F0" in text
        back = Schedule.from_csv(sch.to_csv(tmp_path / f"{sch.method}.csv"))
        assert back == sch
    assert Action.parse(" 12W7 ") == Action(12, "W", 7) and str(Action(1, "F", 0)) == "1F0"


def test_csv_custom_order_is_validated(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A hand-edited CSV that swaps two forwards on the last stage is refused: the receiver would take
    the two messages from worker 0 out of their sending order (deadlock-free, but not matchable in
    order, as NCCL matches); with worker 0's order changed as well it is a deadlock."""
    sch = build("gpipe", 2, microbatches=2)
    path = sch.to_csv(tmp_path / "g.csv")
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace("1F0,1F1", "1F1,1F0")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ScheduleError, match="per-pair message order: worker 0 sends to worker 1"):
        validate(Schedule.from_csv(path))
    lines[1] = lines[1].replace("0F0,0F1,0B0,0B1", "0F0,0B0,0F1,0B1")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(Schedule.from_csv(path))


@pytest.mark.parametrize("call, match", [
    (lambda: build("nope", 4), "unknown method"),
    (lambda: build("interleaved-1f1b", 4, microbatches=8), "needs chunks"),
    (lambda: build("interleaved-1f1b", 4, microbatches=3, chunks=2), "microbatches >= the 4 workers"),
    (lambda: build("interleaved-1f1b", 2, microbatches=5, chunks=2), "use microbatches a multiple of 2"),
    (lambda: build("zb-h2", 4, microbatches=3), "microbatches >= the 4 workers"),
    (lambda: build("zb-v", 4, microbatches=3), "microbatches >= the 4 workers"),
    (lambda: build("zb-v", Plan.even(6, 3), microbatches=4), "even number of stages"),
    (lambda: build("dualpipe", 3, microbatches=6), "even number of stages; the plan has 3: use 4 or 2"),
    (lambda: build("dualpipe", 4, microbatches=7), "even number of microbatches >= 2P = 8"),
    (lambda: build("dualpipev", 4, microbatches=6), "use microbatches=8"),
    (lambda: build("dualpipe", Plan.from_boundaries(4, [1, 2, 3], [1, 2, 1, 1]), microbatches=8), "straight"),
    (lambda: build("interleaved-1f1b", Plan.even(6, 6), microbatches=6, chunks=4), "does not divide"),
    (lambda: build("interleaved-1f1b", 4, microbatches=2, chunks=2), "microbatches >= the 4 workers"),
    (lambda: build("2bw", 8, microbatches=2), "needs microbatches >= 7"),
    (lambda: build("dp", 4, microbatches=6), "multiple of 4"),
    (lambda: build("hetpipe", 4, microbatches=4), "M = 1"),   # pipedream-like methods take N > 1
    (lambda: build("pipedream", Plan.from_boundaries(2, [1], [2, 1]), minibatches=3), "multiple of 2"),
    (lambda: build("gpipe", 4, chunks=2), "takes no option"),
    (lambda: build("buffered", 4, microbatches=4, versions=1), "versions=K >= 2"),
    (lambda: build("gpipe", 0), "positive int"),
    (lambda: build("gpipe", 3, microbatches=0), "must be an int >= 1"),
    (lambda: build("pipedream", Plan.from_boundaries(2, [1], [2, 1]), minibatches=4, vertical_sync=True),
     "same replica count"),
    (lambda: build("hetpipe", Plan.from_boundaries(2, [1], [2, 1])), "same replica count"),
])
def test_bad_input_errors(call, match: str) -> None:  # type: ignore[no-untyped-def]
    """Bad input raises ScheduleError saying what was wrong."""
    with pytest.raises(ScheduleError, match=match):
        call()


def test_hetpipe_options() -> None:
    """HetPipe: V virtual workers, no all-reduce, wave = NOAM of a VW, D recorded."""
    plan = Plan.from_boundaries(3, [1, 2], [2, 2, 2])
    sch = build("hetpipe", plan, minibatches=12, D=2)
    validate(sch)
    assert sch.options["allreduce"] is False and sch.options["wave"] == 3 and sch.options["D"] == 2
    assert sch.options["virtual_workers"] == 2
    # worker 0 (VW 0, stage 0) holds the VW's 3 minibatches in flight
    assert sch.in_flight(0) == 3
    assert methods.get("hetpipe").synchronous is False


def test_extra_in_flight() -> None:
    """extra_in_flight admits more minibatches than NOAM (and so stashes more versions); still valid."""
    for e in (1, 3):
        sch = build("pipedream", 4, minibatches=24, extra_in_flight=e)
        validate(sch)
        assert sch.in_flight(0) == 4 + e and sch.versions_held(3) == 1 + e
    with pytest.raises(ScheduleError, match="extra_in_flight"):
        build("pipedream", 4, extra_in_flight=-1)


def _held_brute_force(sch, stage: int) -> int:
    """Oracle for ``versions_held``: after every action, the latest version plus every version
    already produced that any later action of the stage on that worker reads (quadratic, obvious)."""
    best = 1
    for w in sch.stage_ranks[stage]:
        acts = sch.actions[w]
        latest = 0
        for i, a in enumerate(acts):
            if a.stage != stage:
                continue
            if a.kind == "U":
                latest = sch.version_of(w, i)
            later = {sch.version_of(w, j) for j in range(i + 1, len(acts))
                     if acts[j].stage == stage and acts[j].kind != "U" and sch.version_of(w, j) <= latest}
            best = max(best, len(later | {latest}))
    return best


@pytest.mark.parametrize(
    "method,reps,kw",
    [
        ("pipedream", [1, 1, 1], {}),
        ("pipedream", [2, 1], {}),
        ("pipedream", [1, 2, 1], {"vertical_sync": False}),
        ("pipedream", [2, 2], {"vertical_sync": True}),
        ("pipedream", [1, 1, 1, 1], {"vertical_sync": True}),
        ("pipedream", [1, 1, 1], {"extra_in_flight": 2}),
        ("naive-async", [2, 1, 1], {}),
        ("pipemare", [1, 1], {}),
        ("2bw", [1, 1, 1], {"microbatches": 3}),
        ("buffered", [2, 1], {"microbatches": 2, "versions": 3}),
        ("hetpipe", [2, 2], {}),
        ("1f1b-flush", [1, 1, 1], {"microbatches": 4}),
        ("zb-h1", [1, 1, 1], {"microbatches": 4}),
    ],
)
def test_versions_held_equals_brute_force(method: str, reps: list[int], kw: dict) -> None:
    """The linear sweep of ``versions_alive`` equals the quadratic definition, for every method."""
    plan = Plan.from_boundaries(len(reps), list(range(1, len(reps))), reps)
    sch = build(method, plan, minibatches=12, **kw)
    for s in range(sch.num_stages):
        assert sch.versions_held(s) == _held_brute_force(sch, s), (method, reps, kw, s)
    for w in range(sch.num_workers):
        assert len(sch.versions_alive(w)) == len(sch.actions[w])
