"""pipelab's own schedules against published closed forms and tables.

1. DeepSeek-V3 technical report (arXiv 2412.19437), Table 2, also deepseek-ai/DualPipe's README: per
   method the bubble, parameters per device and activations per device, with PP stages and F, B (full
   backward), W, F&B times. Here B is pipelab's input gradient, so the report's B is ``b + w``.
   The formula is checked for what it is: DeepSeek's own order's idle with F&B one chunk at equal
   times, a bound (not an identity) under pipelab's pricing of the pair as two actions.
2. Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024): Table 5's bubble rates computed from
   Table 6's profiled times (tests/data/zero_bubble_table5.csv, cited there), timed and counted as the
   authors' scheduler does (sail-sg/zero-bubble-pipeline-parallelism, ``auto_schedule.py``): T_comm on
   every message between neighbour stages, a B freeing half a microbatch's activations, ZB-1p/ZB-2p the
   greedy's (its ILP is not run at these sizes). Every printed digit from times within Table 6's
   printed precision; from the printed times themselves, the last digit is off (strict xfail).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from pipelab.schedules import ScheduleError, build, validate
from pipelab.schedules import search as S
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.dataflow import UnitCosts, dependencies, run

DATA = Path(__file__).parent / "data"

# incommensurate times so that a wrong coefficient shows: F, B (input gradient), W
TIMES = [(3.0, 5.0, 2.0), (7.0, 4.0, 3.0), (1.3, 1.7, 0.55)]


def _bubble_and_memory(method: str, P: int, m: int, f: float, b: float, w: float
                       ) -> tuple[float, int, int]:
    """(largest idle time of any device between its first and last action, stages per device, most
    microbatches' activations one device holds), from the dataflow engine's run of the schedule."""
    sch = build(method, P, microbatches=m)
    validate(sch)
    events = [e for e in run(sch, UnitCosts(f=f, b=b, w=w)) if e.kind in ("F", "B", "W")]
    idle = 0.0
    for wk in range(sch.num_workers):
        mine = [e for e in events if e.worker == wk]
        span = max(e.end_s for e in mine) - min(e.start_s for e in mine)
        idle = max(idle, span - sum(e.end_s - e.start_s for e in mine))
    per_device = max(len(sch.stages_of(wk)) for wk in range(sch.num_workers))
    live = max(_live(sch, wk) for wk in range(sch.num_workers))
    return idle, per_device, live


def _live(sch: object, worker: int) -> int:
    """Most microbatch-stage activations held at once on ``worker`` (F adds; the last gradient frees)."""
    acts = sch.actions[worker]   # type: ignore[attr-defined]
    split = {a.stage for a in acts if a.kind == "W"}
    live = best = 0
    for a in acts:
        if a.kind == "F":
            live += 1
        elif a.kind == "W" or (a.kind == "B" and a.stage not in split):
            live -= 1
        best = max(best, live)
    return best


@pytest.mark.parametrize("P", [2, 4, 6, 8])
@pytest.mark.parametrize(("f", "b", "w"), TIMES)
def test_dualpipe_table_1f1b_and_zb1p(P: int, f: float, b: float, w: float) -> None:
    m = 3 * P
    full_b = b + w                   # the report's B: the whole backward
    idle, params, acts = _bubble_and_memory("1f1b-flush", P, m, f, b, w)
    assert idle == pytest.approx((P - 1) * (f + full_b))           # (PP-1)(F+B)
    assert (params, acts) == (1, P)                                 # 1x, PP
    idle, params, acts = _bubble_and_memory("zb-h1", P, m, f, b, w)
    assert idle == pytest.approx((P - 1) * (f + full_b - 2 * w))   # (PP-1)(F+B-2W)
    assert (params, acts) == (1, P)


@pytest.mark.parametrize(("method", "stages_per_pp"), [("dualpipe", 1), ("dualpipev", 2)])
@pytest.mark.parametrize("P", [4, 6, 8])
def test_dualpipe_rows_parameters_and_devices(method: str, stages_per_pp: int, P: int) -> None:
    """Parameters per device 2x for both; DualPipe on PP devices, DualPipeV on PP/2 (pipelab's P workers
    hold 2P stages: PP = 2P); odd PP and M < 2P are refused with what is needed."""
    m = 2 * P
    sch = build(method, P, microbatches=m)
    validate(sch)
    PP = sch.num_stages
    assert PP == stages_per_pp * P and sch.num_workers == PP // stages_per_pp
    assert max(len(sch.stages_of(w)) for w in range(sch.num_workers)) == 2        # 2x parameters
    with pytest.raises(ScheduleError, match=f"microbatches >= 2P = {2 * P}"):
        build(method, P, microbatches=P)
    if method == "dualpipe":
        with pytest.raises(ScheduleError, match="even number of stages"):
            build(method, P + 1, microbatches=4 * P)


def _deepseek_steps(H: int, h: int, N: int) -> list[str]:
    """DeepSeek's DualPipe order for one rank, transcribed from deepseek-ai/DualPipe's step counts (H
    half-ranks, position h, N microbatches per chunk; ``W`` alone: the oldest deferred weight gradient)."""
    out = ["F0"] * (2 * (H - h - 1)) + ["F0", "F1"] * (h + 1) + ["B1", "W1", "F1"] * (H - h - 1)
    out += ["F0", "B1", "W1", "F1", "B0", "W0"] * (N - 2 * H + h + 1)
    out += ["B1", "W1", "F1", "B0", "W0"] * (H - h - 1)
    later = False
    for i in range(h + 1):          # step 6: the second half defers W
        later = later or (i == (h + 1) // 2 and h % 2 == 1)
        out += ["B1"] if later else ["B1", "W1"]
        later = later or (i == (h + 1) // 2 and h % 2 == 0)
        out += ["B0"] if later else ["B0", "W0"]
    return out + ["W", "B0"] * (H - h - 1) + ["W"] * (h + 1)


def _deepseek_dualpipev(P: int, m: int) -> Schedule:
    """DualPipeV on P ranks in DeepSeek's order, as a pipelab schedule (worker w: stages w, 2P-1-w)."""
    lists = []
    for w in range(P):
        nxt = {(k, c): 0 for k in "FBW" for c in (0, 1)}
        deferred: list[Action] = []
        acts: list[Action] = []
        toks = _deepseek_steps(P, w, m)
        for i, tok in enumerate(toks):
            if tok == "W":
                acts.append(deferred.pop(0))
                continue
            kind, chunk = tok[0], int(tok[1])
            a = Action(w if chunk == 0 else 2 * P - 1 - w, kind, nxt[(kind, chunk)])
            nxt[(kind, chunk)] += 1
            if kind == "B" and (i + 1 == len(toks) or toks[i + 1] != f"W{chunk}"):
                deferred.append(Action(a.stage, "W", a.microbatch))
            acts.append(a)
        lists.append(tuple(acts + [Action(w, "U", 0), Action(2 * P - 1 - w, "U", 0)]))
    return Schedule(method="dualpipev", num_stages=2 * P, stage_ranks=tuple((min(s, 2 * P - 1 - s),)
                    for s in range(2 * P)), microbatches=m, minibatches=1, actions=tuple(lists),
                    options={"allreduce": False, "weights": "single", "split_backward": True})


def _makespan(sch: Schedule, f: float, b: float, w: float) -> float:
    return max(e.end_s for e in run(sch, UnitCosts(f=f, b=b, w=w)) if e.kind in ("F", "B", "W"))


@pytest.mark.parametrize(("method", "Ps"), [("dualpipe", (2, 4, 6, 8)), ("dualpipev", (2, 3, 4, 6, 8))])
def test_dualpipe_rows_activations_and_bubble(method: str, Ps: tuple[int, ...]) -> None:
    """Activations per device exactly PP + 1 (PP stages); the bubble does not grow with M and stays
    within the report's (PP/2-1)(F&B+B-3W), F&B priced F + B (pipelab keeps the pair two actions),
    reaching it at PP = 4 for the first two sets of times (not the third: 4.0 against 4.15)."""
    for P in Ps:
        for f, b, w in TIMES:
            full_b = b + w
            seen = set()
            for m in (2 * P, 2 * P + 2, 4 * P):
                idle, _, acts = _bubble_and_memory(method, P, m, f, b, w)
                PP = build(method, P, microbatches=m).num_stages
                assert acts == PP + 1, (P, m, acts)
                seen.add(round(idle, 9))
                report = (PP / 2 - 1) * ((f + full_b) + full_b - 3 * w)
                assert idle <= report + 1e-9, (P, m, (f, b, w), idle, report)
                if PP == 4 and (f, b, w) in TIMES[:2]:
                    assert idle == pytest.approx(report)       # exactly the report's at PP = 4
            assert len(seen) == 1, (P, (f, b, w), seen)       # independent of M


@pytest.mark.parametrize("P", [2, 3, 4, 6])
def test_dualpipev_against_deepseeks_order(P: int) -> None:
    """DeepSeek's own DualPipeV order (its step counts) also holds PP + 1 = 2P + 1, and pipelab's ends no
    later than it under equal times; DeepSeek's receives warm-up activations ahead of use, so from
    P = 3 on its per-pair message order differs on the two sides (pipelab's runtime receives in action
    order, hence pipelab's rule)."""
    for m in (2 * P, 4 * P):
        theirs, ours = _deepseek_dualpipev(P, m), build("dualpipev", P, microbatches=m)
        assert max(_live(theirs, w) for w in range(P)) == 2 * P + 1
        validate(theirs, in_order=False)
        if P >= 3:
            with pytest.raises(ScheduleError, match="per-pair message order"):
                validate(theirs)
        else:
            validate(theirs)
        assert _makespan(ours, 1.0, 1.0, 1.0) <= _makespan(theirs, 1.0, 1.0, 1.0)


def _compound_idle(sch: Schedule, f: float, b: float, w: float, *, full_backward_pairs: bool) -> float:
    """The report's pricing of F&B: a forward followed by a backward of the worker's other stage is one
    chunk, started once both inputs are in and lasting the two together (with ``full_backward_pairs``
    the ``W`` right after that backward too: DeepSeek's main step runs a full backward); outputs leave
    at its end. Returns the largest idle time of any worker between its first start and last end."""
    last, cost = sch.num_stages - 1, {"F": f, "B": b, "W": w}
    items = []
    for acts in sch.actions:
        seq, mine, i = [a for a in acts if a.kind in "FBW"], [], 0
        while i < len(seq):
            grp = [seq[i]]
            nb = seq[i + 1] if i + 1 < len(seq) else None
            if seq[i].kind == "F" and nb is not None and nb.kind == "B" and nb.stage != seq[i].stage:
                grp.append(seq[i + 1])
                nxt = seq[i + 2] if i + 2 < len(seq) else None
                if full_backward_pairs and nxt is not None and (nxt.kind, nxt.stage, nxt.microbatch) == (
                        "W", grp[1].stage, grp[1].microbatch):
                    grp.append(nxt)
            mine.append(grp)
            i += len(grp)
        items.append(mine)
    end: dict[tuple[str, int, int], float] = {}
    ptr, free = [0] * len(items), [0.0] * len(items)
    first: list[float | None] = [None] * len(items)
    busy = [0.0] * len(items)
    moved = True
    while moved:
        moved = False
        for k, mine in enumerate(items):
            while ptr[k] < len(mine):
                grp = mine[ptr[k]]
                own = {(a.kind, a.stage, a.microbatch) for a in grp}
                deps = [d for a in grp for d in dependencies(a.kind, a.stage, a.microbatch, last)
                        if d not in own]
                if any(d not in end for d in deps):
                    break
                start = max([free[k]] + [end[d] for d in deps])
                first[k] = start if first[k] is None else first[k]
                free[k] = start + sum(cost[a.kind] for a in grp)
                busy[k] += free[k] - start
                for a in grp:
                    end[(a.kind, a.stage, a.microbatch)] = free[k]
                ptr[k] += 1
                moved = True
    assert all(ptr[k] == len(items[k]) for k in range(len(items))), "deadlock"
    return max(free[k] - (first[k] or 0.0) - busy[k] for k in range(len(items)))


def _report_bubble(PP: int, f: float, b: float, w: float) -> float:
    """DeepSeek-V3 Table 2: (PP/2 - 1)(F&B + B - 3W), B the whole backward, F&B priced F + B."""
    return (PP / 2 - 1) * ((f + b + w) + (b + w) - 3 * w)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_dualpipe_formula_is_deepseeks_order_at_equal_times(P: int) -> None:
    """What the report's bubble is: exactly the idle of DeepSeek's own order (its step counts) at PP = 4,
    6, 8 with F&B run as one chunk (both inputs in before it starts) and F = input gradient = weight
    gradient (the whole backward 2F). Under pipelab's pricing (the pair two actions) DeepSeek's own
    order idles less than the formula from PP = 6 on, for every set of times here, as pipelab's orders
    do: the formula is a bound there, not an identity. pipelab's orders stay within it in both."""
    PP, m = 2 * P, 4 * P
    theirs = _deepseek_dualpipev(P, m)
    ours = (build("dualpipev", P, microbatches=m), build("dualpipe", PP, microbatches=2 * PP))
    assert _compound_idle(theirs, 1.0, 1.0, 1.0, full_backward_pairs=True) == pytest.approx(
        _report_bubble(PP, 1.0, 1.0, 1.0))
    for sch in ours:
        assert _compound_idle(sch, 1, 1, 1, full_backward_pairs=False) <= _report_bubble(PP, 1, 1, 1) + 1e-9
    for f, b, w in TIMES:
        report = _report_bubble(PP, f, b, w)
        events = [e for e in run(theirs, UnitCosts(f=f, b=b, w=w)) if e.kind in ("F", "B", "W")]
        mine = [[e for e in events if e.worker == k] for k in range(P)]
        idle = max(max(e.end_s for e in x) - min(e.start_s for e in x) - sum(e.end_s - e.start_s for e in x)
                   for x in mine)
        assert idle <= report + 1e-9
        if PP >= 6:
            assert idle < report - 1e-9, (PP, (f, b, w), idle, report)


@pytest.mark.xfail(strict=True, reason="the report's bubble is DeepSeek's order's idle with F&B one chunk "
                   "and F = input gradient = weight gradient, not an identity of either order: priced "
                   "pipelab's way (the pair two actions) "
                   "DeepSeek's own order idles less from PP = 6 on; pipelab's, whose warm-up keeps each "
                   "neighbour pair's messages in order (H forwards of a chunk before the other chunk's "
                   "first backward; DeepSeek's worker 0 runs 2H - 1), idles less than the formula at PP = 6 "
                   "and 8 (e.g. 17 and 25 against 22 and 33 at F, B, W = 3, 5, 2)")
@pytest.mark.parametrize("method", ["dualpipe", "dualpipev"])
def test_dualpipe_bubble_equals_the_report_at_every_even_pp(method: str) -> None:
    for PP in (4, 6, 8):
        P = PP if method == "dualpipe" else PP // 2
        for f, b, w in TIMES[:2]:
            idle, _, _ = _bubble_and_memory(method, P, 2 * PP, f, b, w)
            assert idle == pytest.approx(_report_bubble(PP, f, b, w)), (PP, (f, b, w), idle)


def _table(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def _zb_rates(p: int, m: int, f: float, b: float, w: float, c: float) -> dict[str, float]:
    """Table 5's columns from pipelab: the builders' orders and the search's at ``p`` and ``2p``
    activations, counted and timed the paper's way (its scheduler, sail-sg/zero-bubble-pipeline-
    parallelism ``auto_schedule.py``: a ``B`` frees half a microbatch's activations, its ``W`` the rest;
    a message takes ``T_comm`` between neighbour stages; cost = the longest stage span; rate =
    (cost - m(F+B+W)) / cost)."""
    times = S.StageTimes.uniform(p, forward=f, backward_input=b, backward_weight=w, send_s=c)
    work = m * (f + b + w)
    out = {}
    for col, method in (("1F1B", "1f1b-flush"), ("ZB-H1", "zb-h1"), ("ZB-H2", "zb-h2")):
        sch = build(method, p, microbatches=m)
        cost, _ = S.evaluate(S.orders_of(sch), times, fused=S.fused_stages(sch))
        out[col] = (cost - work) / cost
    out["ZB-1p"] = S.search_order(times, m, p, input_grad_frees=0.5).bubble_rate
    out["ZB-2p"] = S.search_order(times, m, 2 * p, input_grad_frees=0.5).bubble_rate
    return out


COLUMNS = ("1F1B", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p")


def _row_rates(row: dict[str, str], **times: float) -> dict[str, float]:
    given = {k: float(row[k]) for k in ("T_F_ms", "T_B_ms", "T_W_ms", "T_comm_ms")} | times
    return _zb_rates(int(row["stages"]), int(row["m"]), given["T_F_ms"], given["T_B_ms"], given["T_W_ms"],
                     given["T_comm_ms"])


@pytest.mark.parametrize("row", _table("zero_bubble_table5.csv"), ids=lambda r: f"{r['model']}-m{r['m']}")
def test_zero_bubble_table5_from_table6(row: dict[str, str]) -> None:
    """From Table 6's printed times (the low end of its ranges) every column comes within 7e-4 of the
    printed rate (1F1B, ZB-H1, ZB-H2, ZB-1p within 5e-4); ZB-1p equals ZB-H1, as in the table; ZB-2p
    (the search at 2p with the paper's memory count) beats ZB-H2, as in the table."""
    got = _row_rates(row)
    for col in COLUMNS:
        tol = 7e-4 if col == "ZB-2p" else 5e-4
        assert got[col] == pytest.approx(float(row[col]), abs=tol), (col, got[col], row[col])
    assert got["ZB-1p"] == pytest.approx(got["ZB-H1"], abs=1e-12)
    assert got["ZB-2p"] < got["ZB-H2"]


#: Times inside Table 6's printed precision (each rounds to the printed figure, T_B and T_comm inside
#: the printed range of the 28.3B model), found by a grid search around the printed times: with them
#: pipelab gives every digit Table 5 prints, so the last-digit differences above are Table 6's rounding
#: of the profiled times the paper computed Table 5 from, not a difference of model.
UNROUNDED = {"1.5B": {"T_F_ms": 18.475, "T_B_ms": 18.1, "T_W_ms": 9.33, "T_comm_ms": 0.602},
             "28.3B": {"T_F_ms": 10.4, "T_B_ms": 10.23, "T_W_ms": 7.7175, "T_comm_ms": 0.4075}}
#: Table 6's printed times (lowest, highest where it prints a range) and their last printed digit's unit
PRINTED = {"1.5B": {"T_F_ms": (18.5, 18.5, 0.1), "T_B_ms": (18.1, 18.1, 0.1), "T_W_ms": (9.3, 9.3, 0.1),
                    "T_comm_ms": (0.6, 0.76, 0.01)},
           "28.3B": {"T_F_ms": (10.4, 10.4, 0.1), "T_B_ms": (10.2, 10.25, 0.01), "T_W_ms": (7.7, 7.7, 0.1),
                     "T_comm_ms": (0.41, 0.46, 0.01)}}


@pytest.mark.parametrize("row", _table("zero_bubble_table5.csv"), ids=lambda r: f"{r['model']}-m{r['m']}")
def test_zero_bubble_table5_printed_digits_within_table6_rounding(row: dict[str, str]) -> None:
    """Every digit Table 5 prints, all five columns, from times that Table 6 prints as it does."""
    times = UNROUNDED[row["model"]]
    for name, value in times.items():
        low, high, unit = PRINTED[row["model"]][name]
        assert low - unit / 2 <= value < high + unit / 2, (name, value)
    got = _row_rates(row, **times)
    assert {col: round(got[col], 4) for col in COLUMNS} == {col: float(row[col]) for col in COLUMNS}


@pytest.mark.xfail(strict=True, reason="Table 5 was computed from the profiled times before Table 6 rounded "
                   "them to 3 significant digits: from the printed times the last digit differs by 1 to 7 "
                   "(1.5B: 1F1B 0.2430, ZB-H1 and ZB-1p 0.1588, ZB-H2 0.1087, ZB-2p 0.0440; 28.3B: 0.2647, "
                   "0.1423, 0.0643, 0.0036); times within that rounding give every printed digit (above)")
@pytest.mark.parametrize("row", _table("zero_bubble_table5.csv"), ids=lambda r: f"{r['model']}-m{r['m']}")
def test_zero_bubble_table5_printed_digits_from_printed_table6(row: dict[str, str]) -> None:
    got = _row_rates(row)
    assert {col: round(got[col], 4) for col in COLUMNS} == {col: float(row[col]) for col in COLUMNS}


@pytest.mark.xfail(strict=True, reason="Table 5's 1F1B-I column is not reproduced: interleaved 1F1B with one "
                   "layer per chunk (v = 3 for 1.5B's 24 - 2 layers on 8 stages, v = 2 for 28.3B's 64 - 2 on "
                   "32), each chunk F/v, (B+W)/v and T_comm per message, gives 0.1090 and 0.1528 against the "
                   "printed 0.1055 and 0.1493 (times within Table 6's rounding); the paper states neither v "
                   "nor how the end stages' missing layer and the messages enter its 1F1B-I timing")
@pytest.mark.parametrize("row", _table("zero_bubble_table5.csv"), ids=lambda r: f"{r['model']}-m{r['m']}")
def test_zero_bubble_table5_interleaved_column(row: dict[str, str]) -> None:
    p, m = int(row["stages"]), int(row["m"])
    v = {"1.5B": 3, "28.3B": 2}[row["model"]]
    t = UNROUNDED[row["model"]]
    f, b, w, c = t["T_F_ms"], t["T_B_ms"], t["T_W_ms"], t["T_comm_ms"]
    sch = build("interleaved-1f1b", p, microbatches=m, chunks=v)
    events = [e for e in run(sch, UnitCosts(f=f / v, b=(b + w) / v, w=0.0, send_s=c)) if e.kind in ("F", "B")]
    span = max(max(e.end_s for e in events if e.worker == k) - min(e.start_s for e in events if e.worker == k)
               for k in range(p))
    rate = (span - m * (f + b + w)) / span
    assert round(rate, 4) == float(row["1F1B-I"]), rate
