"""The planner's decision: a candidate replaces the default only beyond the simulator's error, ties go to
the simpler plan, and a pipelining method on one stage is named (or collapsed) as data parallelism.

The rule (``pipelab.planner.decide``): with error ``e``, a prediction ``p`` means a measurement in
``[p / (1 + e), p / (1 - e)]``; a candidate replaces the default only when the intervals do not overlap."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

import pipelab as pl
from pipelab.cluster import Calibration
from pipelab.planner import (
    COLUMNS,
    decide,
    margin_from_accuracy,
    plan,
)
from pipelab.planner.decide import (
    NO_MARGIN,
    ONE_STAGE_ASYNC,
    ONE_STAGE_SYNC,
    bounds_of,
    less_shift,
    load_errors,
    load_margin,
    load_ranges,
    ranges_from_accuracy,
    resolve_margin,
)
from reproductions.sim_accuracy.errors_file import held_out, write_errors

REPO = Path(__file__).resolve().parents[1]


def _row(method: str = "1f1b-flush", throughput: float = 100.0, *, synchronous: bool = True, stages: int = 2,
         fits: bool = True, status: str = "simulated", microbatches: int = 2, peak: float = 1e6) -> dict:
    return dict(method=method, synchronous=synchronous, stages=stages, chunks=0, recompute=False,
                compression="none", microbatches=microbatches, throughput=throughput, peak_memory=peak,
                fits=fits, status=status)


def _table(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def _pick(t: pd.DataFrame) -> int:
    picked = t.index[t["pick"]].tolist()
    assert len(picked) == 1, picked
    return int(picked[0])


def test_a_candidate_within_the_error_does_not_replace_the_default() -> None:
    # error 0.3: measured within [p / 1.3, p / 0.7]; 180 / 1.3 = 138.5 <= 100 / 0.7 = 142.9: may be no faster
    t = _table(_row(throughput=100.0), _row("gpipe", 180.0, stages=4))
    got = decide(t, 0, 0.30)
    assert _pick(got) == 0
    assert got["vs_default"].tolist() == pytest.approx([1.0, 1.8])
    assert got["within_error"].tolist() == [True, True]
    assert _pick(decide(t, 0, 0.0)) == 1          # no error: the fastest
    assert _pick(decide(t, 0, 0.20)) == 1         # 180 / 1.2 = 150 > 100 / 0.8 = 125: surely faster


def test_a_candidate_beyond_the_error_replaces_the_default() -> None:
    t = _table(_row(throughput=100.0), _row("gpipe", 190.0, stages=4), _row("zb-h1", 50.0))
    got = decide(t, 0, 0.30)                      # 190 / 1.3 = 146.2 > 142.9
    assert _pick(got) == 1
    assert got["within_error"].tolist() == [True, False, False]   # 50 / 0.7 = 71.4 < 100 / 1.3: surely slower


def test_needs_vs_default_is_the_gain_that_clears_both_errors() -> None:
    """needs_vs_default = (1 + hi_row) / (1 + lo_default); a lone candidate is picked exactly when its
    predicted gain exceeds it."""
    margin = {"1f1b-flush": (-0.2, 0.1), "pipedream": (-0.1, 0.35)}
    need = 1.35 / 0.8
    for gain, picked in ((need * 0.99, 0), (need * 1.01, 1)):
        t = _table(_row(throughput=100.0), _row("pipedream", 100.0 * gain, microbatches=1))
        got = decide(t, 0, margin)
        assert got["needs_vs_default"].tolist() == pytest.approx([1.1 / 0.8, need])
        assert _pick(got) == picked
    # no default that fits: nothing to compare with
    got = decide(_table(_row(throughput=100.0, fits=False), _row("pipedream", 150.0)), 0, margin)
    assert got["needs_vs_default"].isna().all()


def test_held_out_counts_a_runs_errors_less_its_shift_inside_a_margin() -> None:
    # errors +10%, +30%, +20%: the shift is +20%; less it -8.3%, +8.3%, 0
    df = pd.DataFrame({"method": ["a", "a", "b"], "error": [0.1, 0.3, 0.2]})
    got = held_out(df, {"a": (-0.05, 0.1), "b": (0.01, 0.2)})
    assert got["error"].tolist() == pytest.approx([1.1 / 1.2 - 1, 1.3 / 1.2 - 1, 0.0])
    assert got["inside"].tolist() == [False, True, False]
    assert held_out(df, 0.1)["inside"].all()          # one number: +-10%
    with pytest.raises(ValueError, match="'method' and 'error'"):
        held_out(pd.DataFrame({"x": [1]}), 0.1)


def test_the_error_is_per_method_and_one_stage_rows_take_dps() -> None:
    errors = {"1f1b-flush": 0.25, "dp": 0.70, "ALL": 0.70}
    t = _table(_row(throughput=100.0), _row("dp", 200.0, stages=1))
    assert _pick(decide(t, 0, errors)) == 0       # 200 / 1.7 = 117.6 <= 100 / 0.75 = 133.3
    t.loc[1, "throughput"] = 240.0                # 141.2 > 133.3
    assert _pick(decide(t, 0, errors)) == 1
    # 1F1B on one replicated stage is data parallelism: dp's error, not 1F1B's (200 / 1.25 = 160 would pass)
    t = _table(_row(throughput=100.0), _row("1f1b-flush", 200.0, stages=1))
    t["equivalent"] = ["", ONE_STAGE_SYNC]
    assert _pick(decide(t, 0, errors)) == 0
    t["equivalent"] = ["", ""]
    assert _pick(decide(t, 0, errors)) == 1


def test_candidates_tied_with_the_fastest_go_to_the_simpler_plan() -> None:
    # asynchronous 400, synchronous 250: both surely beat the default; 250 / 0.7 = 357 >= 400 / 1.3 = 308,
    # so the simulator cannot tell them apart -> the synchronous one
    t = _table(_row(throughput=100.0), _row("pipedream", 400.0, synchronous=False),
               _row("1f1b-flush", 250.0, stages=4))
    assert _pick(decide(t, 0, 0.30)) == 2
    # 200 / 0.7 = 286 < 308: the asynchronous one is surely faster
    t.loc[2, "throughput"] = 200.0
    assert _pick(decide(t, 0, 0.30)) == 1
    # an exact tie between synchronous plans: fewer stages, then dp itself, then fewer microbatches
    t = _table(_row(throughput=100.0), _row("gpipe", 300.0, stages=4), _row("1f1b-flush", 300.0, stages=1),
               _row("dp", 300.0, stages=1), _row("dp", 300.0, stages=1, microbatches=4))
    assert _pick(decide(t, 0, 0.0)) == 3


def test_the_decision_is_deterministic_whatever_the_row_order() -> None:
    t = _table(_row(throughput=100.0), _row("gpipe", 300.0, stages=4), _row("zb-h1", 300.0, stages=4),
               _row("pipedream", 301.0, synchronous=False), _row("2bw", 299.0, synchronous=False, stages=1))
    want = _pick(decide(t, 0, 0.30))
    assert want == 1                                   # gpipe and zb-h1 tie, synchronous: the earlier row
    for seed in range(5):
        shuffled = t.sample(frac=1.0, random_state=seed)
        assert _pick(decide(shuffled, 0, 0.30)) == want


def test_without_a_fitting_default_the_fastest_fitting_candidate_is_picked() -> None:
    t = _table(_row(throughput=100.0, fits=False), _row("gpipe", 110.0, stages=4),
               _row("dp", 500.0, stages=1, fits=False))
    got = decide(t, 0, 0.30)
    assert _pick(got) == 1
    assert not got["within_error"].any()
    nothing = decide(_table(_row(fits=False)), 0, 0.3)
    assert not nothing["pick"].any()


def _profile() -> pl.Profile:
    """An unbalanced 8-layer model (the one of test_planner.py)."""
    fwd = [1e-3, 1e-3, 4e-3, 1e-3, 1e-3, 2e-3, 1e-3, 1e-3]
    return pl.Profile.synthetic(fwd, out_bytes=[2_000_000] * 8, param_bytes=[4_000_000] * 8, batch_size=16)


KW = dict(methods=["gpipe", "1f1b-flush", "zb-h1", "pipedream", "2bw", "pipemare", "dp"], compression=(None,),
          recompute=(False,))


def test_plan_applies_the_margin_and_shows_it() -> None:
    cl = pl.Cluster.flat(4, bandwidth=5e9, memory=2**30)
    with pytest.warns(UserWarning, match="ranked by prediction alone"):
        free = plan(_profile(), cl, **KW)
    assert free.margin == 0.0                          # no margin given: no measured error
    assert NO_MARGIN in free.describe(5)
    assert free.best.name == free.fastest.name
    gain = free.fastest["throughput"] / free.default["throughput"]
    assert gain > 1.05
    edge = (gain - 1) / (gain + 1)                     # the error at which (1 + e) / (1 - e) = gain
    tight = plan(_profile(), cl, margin=edge + 0.01, **KW)
    assert tight.best.name == tight.default.name       # the fastest may be no faster: the default stays
    assert bool(tight.table.loc[tight.fastest.name, "within_error"])
    assert "simulator error" in tight.describe(5) and list(tight.table.columns) == list(COLUMNS)
    loose = plan(_profile(), cl, margin=edge / 2, **KW)
    m = loose.margin
    assert loose.best["throughput"] / (1 + m) > loose.default["throughput"] / (1 - m)
    assert plan(_profile(), cl, margin=edge + 0.01, **KW).table.equals(tight.table)


def _calibrated() -> pl.Cluster:
    cal = Calibration(host="test", backend="gloo", device="cpu:test", date="2026-11-25T00:00:00+00:00",
                      torch="2", cores=2, workers=4, p2p_latency_s=50e-6, p2p_bandwidth=5e9,
                      allreduce_latency_s=80e-6, allreduce_bandwidth=1e9,
                      overhead_s={"F": 1e-4, "B": 2e-4, "W": 3e-5, "U": 4e-4},
                      optimizer_s={"sgd-momentum": (5e-5, 1e-10)}, memory_bandwidth=1e10)
    return dataclasses.replace(pl.Cluster.flat(4, bandwidth=5e9, memory=2**30), calibration=cal)


def test_no_host_margin_ships_a_calibrated_cluster_ranks_by_prediction_and_says_so() -> None:
    """No margin is a default of any machine's: without one the planner warns, ranks by prediction
    alone (the pick is the fastest that fits) and the table says so."""
    cl = _calibrated()
    with pytest.warns(UserWarning, match="no simulator error given"):
        got = plan(_profile(), cl, **KW)
    assert got.margin == 0.0 and got.margin_source == NO_MARGIN
    assert got.best.name == got.fastest.name
    assert NO_MARGIN in got.describe(3)
    import pipelab.planner.decide as decide_mod
    assert not any(hasattr(decide_mod, n) for n in ("SIM_ERRORS", "SIM_RANGES", "SIM_RELATIVE_RANGES",
                                                     "ERRORS_FILE"))
    assert not (REPO / "pipelab" / "data" / "sim_errors.json").exists()


def test_a_margin_file_of_the_users_run_is_read_as_its_relative_ranges(tmp_path: Path) -> None:
    """margin= the errors file a sim_accuracy run wrote (or its results.csv): the ranges less each
    run's shift, shown with where they came from; a missing file is refused with what to pass."""
    df = pd.DataFrame({"method": ["1f1b-flush", "1f1b-flush", "gpipe", "pipedream"],
                       "error": [0.1, 0.3, 0.2, 0.25], "measured_spread": [0.0] * 4})
    f = tmp_path / "sim_errors.json"
    write_errors(df, f, source="test")
    cl = _calibrated()
    got = plan(_profile(), cl, margin=str(f), **KW)
    assert got.margin == load_margin(f) == load_ranges(f, relative=True)
    assert str(f) in got.describe(3)
    csv = tmp_path / "results.csv"
    df.to_csv(csv, index=False)
    m, source = resolve_margin(csv)
    assert m == ranges_from_accuracy(df, relative=True) and str(csv) in source
    assert resolve_margin(0.2) == (0.2, "given")
    with pytest.raises(ValueError, match="no such file"):
        plan(_profile(), cl, margin=str(tmp_path / "missing.json"), **KW)


def test_margin_from_accuracy_is_the_worst_error_per_method() -> None:
    df = pd.DataFrame({"method": ["a", "a", "b", "b"], "error": [0.1, -0.5, 0.2, math.nan]})
    assert margin_from_accuracy(df) == pytest.approx({"a": 0.5, "b": 0.2, "ALL": 0.5})
    with pytest.raises(ValueError, match="error"):
        margin_from_accuracy(pd.DataFrame({"x": [1]}))


def test_errors_file_round_trip_and_bad_files(tmp_path: Path) -> None:
    """write_errors rounds each worst |error| up to 0.01 (at most 0.99) and load_errors reads it back; a
    file that is not one is refused with what to run."""
    df = pd.DataFrame({"method": ["a", "a", "b"], "error": [0.101, -0.301, 1.7]})
    f = tmp_path / "e.json"
    assert write_errors(df, f, source="test") == {"a": 0.31, "b": 0.99, "ALL": 0.99}
    assert load_errors(f) == {"a": 0.31, "b": 0.99, "ALL": 0.99}
    f.write_text('{"errors": {"a": 1.5}}')
    with pytest.raises(ValueError, match="margin"):
        load_errors(f)
    f.write_text("{not json")
    with pytest.raises(ValueError, match="reproduce --only sim_accuracy"):
        load_errors(f)


def test_a_bad_margin_is_refused() -> None:
    cl = pl.Cluster.flat(4, bandwidth=5e9, memory=2**30)
    for bad in (-0.1, 1.0, math.nan, True, "0.3", {"dp": 2.0}, {}):
        with pytest.raises(ValueError, match="margin"):
            plan(_profile(), cl, margin=bad, **KW)  # type: ignore[arg-type]


def _dp_profile() -> pl.Profile:
    """Tiny weights, big activations: PipeDream's partitioner replicates one stage on every worker."""
    return pl.Profile.synthetic([1e-3] * 6, out_bytes=[8_000_000] * 6, param_bytes=[1_000] * 6, batch_size=16)


def test_a_pipelining_method_on_one_stage_is_named_data_parallelism() -> None:
    cl = pl.Cluster.flat(4, bandwidth=1e9, memory=2**30)
    pt = plan(_dp_profile(), cl, prune=False, **KW)
    t = pt.table
    one = t[(t.stages == 1) & (t.method != "dp")]
    assert not one.empty, "PipeDream's partitioner should give a one-stage plan here"
    asyn = one[~one.synchronous.astype(bool)]
    sync = one[one.synchronous.astype(bool)]
    assert not asyn.empty and not sync.empty
    assert (asyn["status"] == ONE_STAGE_ASYNC).all() and (asyn["equivalent"] == "dp").all()
    assert asyn["throughput"].isna().all() and not asyn["pick"].any()
    assert (sync["status"] == "simulated").all() and (sync["equivalent"] == ONE_STAGE_SYNC).all()
    assert (t[t.stages > 1]["equivalent"] == "").all()
    # oracle: dp and 1F1B on the one replicated stage with one microbatch per replica are the same run
    dp = t[t.method == "dp"].iloc[0]
    same = sync[(sync.method == "1f1b-flush") & (sync.microbatches == dp["microbatches"])].iloc[0]
    assert dp["throughput"] == pytest.approx(same["throughput"], rel=1e-9)
    assert dp["peak_memory"] == same["peak_memory"]


def test_cli_auto_takes_the_margin(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from pipelab.cli.plan import main

    prof = tmp_path / "p.json"
    _profile().save(prof)
    args = [str(prof), "--cluster", "flat:4", "--auto", "--no-progress", "--methods", "1f1b-flush,gpipe"]
    assert main(args + ["--margin", "0.9"]) == 0
    text = capsys.readouterr().out
    assert "simulator error (margin): 90%" in text
    # an error of 90% lets nothing be surely faster: the pick is the default, 1F1B on a uniform split
    assert "pick: 1f1b-flush on uniform straight" in text and "(pick 1.00x" in text
    assert main(args + ["--margin", "2"]) == 2
    errors = tmp_path / "sim_errors.json"
    write_errors(pd.DataFrame({"method": ["1f1b-flush", "gpipe"], "error": [0.1, 0.2]}), errors, source="t")
    assert main(args + ["--margin", str(errors)]) == 0
    assert f"measured: {errors}" in capsys.readouterr().out
    assert main(args + ["--margin", str(tmp_path / "none.json")]) == 2


# ------------------------------------------------------------------ signed error ranges
def test_a_signed_range_reads_a_biased_simulator_by_its_bias() -> None:
    # both methods measured 40-60% optimistic: 180 means a measurement in [112.5, 128.6], 100 in [62.5, 71.4]
    t = _table(_row(throughput=100.0), _row("pipedream", 180.0, synchronous=False))
    ranges = {"1f1b-flush": (0.4, 0.6), "pipedream": (0.4, 0.6)}
    assert _pick(decide(t, 0, ranges)) == 1
    # the same worst |error| (0.6) either way cannot tell them apart: 180 / 1.6 = 112.5 <= 100 / 0.4 = 250
    assert _pick(decide(t, 0, {"1f1b-flush": 0.6, "pipedream": 0.6})) == 0
    # a candidate whose simulator errs far more optimistically than the default's stays out
    assert _pick(decide(t, 0, {"1f1b-flush": (0.0, 0.1), "pipedream": (0.8, 1.0)})) == 0   # 180 / 2 < 100 / 1


def test_bounds_of_a_margin() -> None:
    assert bounds_of(0.3, "gpipe") == (-0.3, 0.3)
    m = {"gpipe": (0.1, 0.2), "dp": 0.5, "ALL": (-0.1, 0.9)}
    assert bounds_of(m, "gpipe") == (0.1, 0.2)
    assert bounds_of(m, "gpipe", equivalent="dp with gradient accumulation") == (-0.5, 0.5)
    assert bounds_of(m, "zb-h1") == (-0.1, 0.9)
    assert bounds_of({"gpipe": (0.1, 0.2), "dp": 0.5}, "zb-h1") == (-0.5, 0.5)   # no ALL: the widest


def test_ranges_from_accuracy_widen_each_error_by_its_rounds_spread() -> None:
    # sim 130 against a median of 100 whose rounds spread 20%: measured in [90, 110] -> error in [0.18, 0.44]
    df = pd.DataFrame({"method": ["a", "a", "b"], "error": [0.3, 0.1, -0.2],
                       "measured_spread": [0.2, 0.0, math.nan]})
    got = ranges_from_accuracy(df)
    assert got["a"] == pytest.approx((0.1, 1.3 / 0.9 - 1))
    assert got["b"] == pytest.approx((-0.2, -0.2))
    assert got["ALL"] == pytest.approx((-0.2, 1.3 / 0.9 - 1))
    assert ranges_from_accuracy(df.drop(columns="measured_spread"))["a"] == pytest.approx((0.1, 0.3))
    with pytest.raises(ValueError, match="error"):
        ranges_from_accuracy(pd.DataFrame({"x": [1]}))


def test_a_second_calibrations_errors_widen_the_ranges_and_margins() -> None:
    # the same runs against a second calibration: a's range covers -0.4 as well, b's +0.5; a row the
    # second calibration did not simulate (NaN) keeps its first error only
    df = pd.DataFrame({"method": ["a", "a", "b"], "error": [0.3, 0.1, -0.2],
                       "error_recalibrated": [0.2, -0.4, 0.5]})
    got = ranges_from_accuracy(df)
    for k, want in {"a": (-0.4, 0.3), "b": (-0.2, 0.5), "ALL": (-0.4, 0.5)}.items():
        assert got[k] == pytest.approx(want)
    assert margin_from_accuracy(df) == pytest.approx({"a": 0.4, "b": 0.5, "ALL": 0.5})
    df.loc[2, "error_recalibrated"] = math.nan
    assert ranges_from_accuracy(df)["b"] == pytest.approx((-0.2, -0.2))


def test_the_written_ranges_hold_every_measured_configuration(tmp_path: Path) -> None:
    """The ranges write_errors writes from a sim_accuracy results table, rounded outwards: every
    configuration's error lies inside its method's range (and 'ALL')."""
    df = pd.read_csv(REPO / "reproductions" / "sim_accuracy" / "results.csv")
    f = tmp_path / "e.json"
    write_errors(df, f, source="test")
    ranges = load_ranges(f)
    cols = ["error"] + (["error_recalibrated"] if "error_recalibrated" in df else [])
    for col in cols:
        for m, e in zip(df["method"], df[col]):
            lo, hi = ranges[m]
            assert lo <= e <= hi, (col, m, e, ranges[m])
            assert ranges["ALL"][0] <= e <= ranges["ALL"][1]


def test_relative_ranges_take_each_calibrations_shift_off() -> None:
    # three configurations, errors +10%, +30%, +20%: the run's shift is +20% (the median), and the
    # errors less it are 1.1/1.2 - 1, 1.3/1.2 - 1 and 0; the second calibration predicts every
    # configuration at half (errors -45%, -35%, -40%): its own shift, -40%, takes that off again
    df = pd.DataFrame({"method": ["a", "a", "b"], "error": [0.1, 0.3, 0.2],
                       "error_recalibrated": [-0.45, -0.35, -0.4]})
    assert less_shift(df["error"]).tolist() == pytest.approx([1.1 / 1.2 - 1, 1.3 / 1.2 - 1, 0.0])
    got = ranges_from_accuracy(df, relative=True)
    assert got["a"] == pytest.approx((1.1 / 1.2 - 1, 1.3 / 1.2 - 1))
    assert got["b"] == pytest.approx((0.0, 0.0))
    # absolute ranges keep the shifts: they cover both calibrations' errors as they are
    assert ranges_from_accuracy(df)["a"] == pytest.approx((-0.45, 0.3))
    # a shift common to every configuration moves no relative range
    moved = df.assign(error=(1 + df["error"]) * 1.5 - 1,
                      error_recalibrated=(1 + df["error_recalibrated"]) * 0.7 - 1)
    again = ranges_from_accuracy(moved, relative=True)
    assert set(again) == set(got) and all(again[k] == pytest.approx(got[k]) for k in got)


def test_the_written_relative_ranges_hold_every_measured_configuration(tmp_path: Path) -> None:
    """load_margin of a written file is the results' errors less their calibration's shift, rounded
    outwards; and the decision rule with them is exact for two candidates of one calibration: the
    measured ratio lies inside what their predicted ratio and ranges allow."""
    df = pd.read_csv(REPO / "reproductions" / "sim_accuracy" / "results.csv")
    f = tmp_path / "e.json"
    write_errors(df, f, source="test")
    rel_ranges = load_margin(f)
    rel = less_shift(df["error"])
    for m, e in zip(df["method"], rel):
        lo, hi = rel_ranges[m]
        assert lo <= e <= hi, (m, e, rel_ranges[m])
    for i in df.index:
        for j in df.index:
            if df.loc[i, "model"] != df.loc[j, "model"]:
                continue
            lo_i, hi_i = rel_ranges[df.loc[i, "method"]]
            lo_j, hi_j = rel_ranges[df.loc[j, "method"]]
            pred = df.loc[i, "simulated"] / df.loc[j, "simulated"]
            meas = df.loc[i, "measured"] / df.loc[j, "measured"]
            assert pred * (1 + lo_j) / (1 + hi_i) - 1e-9 <= meas <= pred * (1 + hi_j) / (1 + lo_i) + 1e-9


def test_ranges_file_round_trip_and_old_files(tmp_path: Path) -> None:
    df = pd.DataFrame({"method": ["a", "a"], "error": [0.101, 0.301], "measured_spread": [0.0, 0.0]})
    f = tmp_path / "e.json"
    write_errors(df, f, source="test")
    assert load_ranges(f) == {"a": (0.1, 0.31), "ALL": (0.1, 0.31)}
    # less the run's shift (+20%, the median of the two): 1.101/1.201 - 1 and 1.301/1.201 - 1
    assert load_ranges(f, relative=True) == {"a": (-0.09, 0.09), "ALL": (-0.09, 0.09)}
    f.write_text('{"errors": {"a": 0.2}}')          # a file from before the ranges: symmetric
    assert load_ranges(f) == {"a": (-0.2, 0.2)} == load_ranges(f, relative=True)
    f.write_text('{"errors": {"a": 0.2}, "ranges": {"a": [0.5, 0.1]}}')
    with pytest.raises(ValueError, match="lo <= hi"):
        load_ranges(f)


def test_errors_of_one_host_are_pooled_over_its_last_runs(tmp_path: Path) -> None:
    """With host=, the file keeps that host's last runs and their union; another host starts anew."""
    f = tmp_path / "e.json"
    one = pd.DataFrame({"method": ["a", "a", "b"], "error": [0.1, 0.2, 0.15]})
    two = pd.DataFrame({"method": ["a", "a", "b"], "error": [-0.3, 0.0, 0.15]})
    write_errors(one, f, source="run 1", host="vm")
    assert load_ranges(f)["a"] == (0.1, 0.2)
    assert write_errors(two, f, source="run 2", host="vm") == {"a": 0.3, "b": 0.15, "ALL": 0.3}
    assert load_ranges(f)["a"] == (-0.3, 0.2) and load_ranges(f)["ALL"] == (-0.3, 0.2)
    # relative: run 1's shift +15% gives a (1.1/1.15 - 1, 1.2/1.15 - 1); run 2's 0% gives a (-0.3, 0)
    assert load_ranges(f, relative=True)["a"] == (-0.3, 0.05)
    doc = json.loads(f.read_text())
    assert [r["source"] for r in doc["runs"]] == ["run 1", "run 2"] and doc["host"] == "vm"
    # run 2 held out against run 1's relative ranges (a: -4.3%..+4.3%, b: 0..0): of its errors less
    # its shift (0%), a's -30% and 0% and b's +15%, only a's 0% is inside
    assert "held_out" not in doc["runs"][0]
    assert doc["runs"][1]["held_out"] == {"inside": 1, "of": 3, "runs_before": 1}
    # at most `history` runs: the oldest goes
    write_errors(two, f, source="run 3", host="vm", history=2)
    assert [r["source"] for r in json.loads(f.read_text())["runs"]] == ["run 2", "run 3"]
    assert load_ranges(f)["a"] == (-0.3, 0.0)
    # another host, or no host: this run alone
    write_errors(one, f, source="elsewhere", host="other")
    assert load_ranges(f)["a"] == (0.1, 0.2) and len(json.loads(f.read_text())["runs"]) == 1
    write_errors(two, f, source="no host")
    assert load_ranges(f)["a"] == (-0.3, 0.0) and "runs" not in json.loads(f.read_text())
    with pytest.raises(ValueError, match="history"):
        write_errors(one, f, host="vm", history=0)
