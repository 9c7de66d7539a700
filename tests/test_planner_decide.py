"""The planner's decision: a candidate replaces the default only beyond the simulator's error, ties go to
the simpler plan, and a pipelining method on one stage is named (or collapsed) as data parallelism."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

import pipelab as pl
from pipelab.cluster import Calibration
from pipelab.planner import COLUMNS, SIM_ERROR, decide, margin_from_accuracy, plan
from pipelab.planner.decide import ONE_STAGE_ASYNC, ONE_STAGE_SYNC

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


def test_a_candidate_within_the_margin_does_not_replace_the_default() -> None:
    t = _table(_row(throughput=100.0), _row("gpipe", 125.0, stages=4))
    got = decide(t, 0, 0.30)
    assert _pick(got) == 0
    assert got["vs_default"].tolist() == pytest.approx([1.0, 1.25])
    assert got["within_error"].tolist() == [True, True]
    assert _pick(decide(t, 0, 0.0)) == 1          # no margin: the fastest
    assert _pick(decide(t, 0, 0.25)) == 0         # exactly the margin is not beyond it


def test_a_candidate_beyond_the_margin_replaces_the_default() -> None:
    t = _table(_row(throughput=100.0), _row("gpipe", 135.0, stages=4), _row("zb-h1", 60.0))
    got = decide(t, 0, 0.30)
    assert _pick(got) == 1
    assert got["within_error"].tolist() == [True, False, False]   # 0.60 < 1 / 1.3: outside, below


def test_candidates_within_the_margin_of_the_fastest_tie_to_the_simpler_plan() -> None:
    # asynchronous 200, synchronous 180: the simulator cannot tell them apart -> the synchronous one
    t = _table(_row(throughput=100.0), _row("pipedream", 200.0, synchronous=False),
               _row("1f1b-flush", 180.0, stages=4))
    assert _pick(decide(t, 0, 0.30)) == 2
    # beyond the margin of each other (200 / 140 > 1.3): the faster, asynchronous or not
    t.loc[2, "throughput"] = 140.0
    assert _pick(decide(t, 0, 0.30)) == 1
    # an exact tie between synchronous plans: fewer stages, then dp itself, then fewer microbatches
    t = _table(_row(throughput=100.0), _row("gpipe", 300.0, stages=4), _row("1f1b-flush", 300.0, stages=1),
               _row("dp", 300.0, stages=1), _row("dp", 300.0, stages=1, microbatches=4))
    assert _pick(decide(t, 0, 0.0)) == 3


def test_the_decision_is_deterministic_whatever_the_row_order() -> None:
    t = _table(_row(throughput=100.0), _row("gpipe", 150.0, stages=4), _row("zb-h1", 150.0, stages=4),
               _row("pipedream", 151.0, synchronous=False), _row("2bw", 149.0, synchronous=False, stages=1))
    want = _pick(decide(t, 0, 0.30))
    assert want == 1                                   # gpipe and zb-h1 tie; the earlier row
    for seed in range(5):
        shuffled = t.sample(frac=1.0, random_state=seed)
        assert _pick(decide(shuffled, 0, 0.30)) == want


def test_without_a_fitting_default_the_fastest_fitting_candidate_is_picked() -> None:
    t = _table(_row(throughput=100.0, fits=False), _row("gpipe", 110.0, stages=4),
               _row("dp", 500.0, stages=1, fits=False))
    got = decide(t, 0, 0.30)
    assert _pick(got) == 1
    assert not got["within_error"].any() or not got.loc[0, "within_error"]
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
    free = plan(_profile(), cl, **KW)
    assert free.margin == 0.0                          # an analytic cluster: no measured error
    assert free.best.name == free.fastest.name
    gain = free.fastest["throughput"] / free.default["throughput"]
    assert gain > 1.05
    tight = plan(_profile(), cl, margin=gain - 1 + 0.01, **KW)
    assert tight.best.name == tight.default.name       # the fastest is within the margin: the default stays
    assert bool(tight.table.loc[tight.fastest.name, "within_error"])
    assert "margin" in tight.describe(5) and list(tight.table.columns) == list(COLUMNS)
    loose = plan(_profile(), cl, margin=(gain - 1) / 2, **KW)
    assert loose.best["throughput"] > loose.default["throughput"] * (1 + loose.margin)
    assert plan(_profile(), cl, margin=gain - 1 + 0.01, **KW).table.equals(tight.table)


def test_a_calibrated_cluster_defaults_to_the_simulators_measured_error() -> None:
    cal = Calibration(host="test", backend="gloo", device="cpu:test", date="2026-11-25T00:00:00+00:00",
                      torch="2", cores=2, workers=4, p2p_latency_s=50e-6, p2p_bandwidth=5e9,
                      allreduce_latency_s=80e-6, allreduce_bandwidth=1e9,
                      overhead_s={"F": 1e-4, "B": 2e-4, "W": 3e-5, "U": 4e-4},
                      optimizer_s={"sgd-momentum": (5e-5, 1e-10)}, memory_bandwidth=1e10)
    cl = dataclasses.replace(pl.Cluster.flat(4, bandwidth=5e9, memory=2**30), calibration=cal)
    assert plan(_profile(), cl, **KW).margin == SIM_ERROR


def test_the_default_margin_is_no_smaller_than_sim_accuracys_measured_error() -> None:
    results = REPO / "reproductions" / "sim_accuracy" / "results.csv"
    measured = margin_from_accuracy(str(results))
    assert 0 < measured <= SIM_ERROR
    df = pd.DataFrame({"error": [0.1, -0.5, 0.2, math.nan]})
    assert margin_from_accuracy(df) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="error"):
        margin_from_accuracy(pd.DataFrame({"x": [1]}))


def test_a_bad_margin_is_refused() -> None:
    cl = pl.Cluster.flat(4, bandwidth=5e9, memory=2**30)
    for bad in (-0.1, math.nan, True, "0.3"):
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
