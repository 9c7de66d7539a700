"""The planner: pruning loses nothing (brute force is the oracle), memory limits, staleness, determinism."""

from __future__ import annotations

import math

import pytest

import pipelab as pl
from pipelab.methods import MethodError
from pipelab.partition.plan import Plan
from pipelab.planner import COLUMNS, plan


def _profile() -> pl.Profile:
    """An unbalanced 8-layer model: one heavy layer, big activations."""
    fwd = [1e-3, 1e-3, 4e-3, 1e-3, 1e-3, 2e-3, 1e-3, 1e-3]
    return pl.Profile.synthetic(fwd, out_bytes=[2_000_000] * 8, param_bytes=[4_000_000] * 8, batch_size=16)


def _cluster() -> pl.Cluster:
    return pl.Cluster.flat(4, bandwidth=5e9, memory=2**30)


KW = dict(methods=["gpipe", "1f1b-flush", "zb-h1", "interleaved-1f1b", "pipedream", "2bw", "dp"],
          compression=(None, "fp16"))


@pytest.fixture(scope="module")
def table() -> pl.planner.PlanTable:
    return plan(_profile(), _cluster(), **KW)


def test_pruning_loses_no_pareto_point_and_not_the_best(table: pl.planner.PlanTable) -> None:
    full = plan(_profile(), _cluster(), prune=False, **KW)
    assert (full.table["status"] == "simulated").sum() > (table.table["status"] == "simulated").sum()
    assert table.best["throughput"] == pytest.approx(full.best["throughput"])
    key = ["throughput", "peak_memory"]
    got, want = table.pareto[key].values.ravel(), full.pareto[key].values.ravel()
    assert got.tolist() == pytest.approx(want.tolist())
    # every skipped row's bound is indeed beaten: its simulation (in the full run) is no faster
    skipped = table.table["status"].str.startswith("skipped: dominated")
    assert skipped.any()
    t_full = full.table.loc[skipped, "time_per_minibatch_s"].dropna()
    assert (t_full >= table.table.loc[t_full.index, "bound_s"] * (1 - 1e-9)).all()


def test_bounds_are_lower_bounds(table: pl.planner.PlanTable) -> None:
    sim = table.table[table.table["status"] == "simulated"]
    assert (sim["time_per_minibatch_s"] >= sim["bound_s"] * (1 - 1e-9)).all()


def test_the_pick_is_at_least_the_default_1f1b_uniform_split(table: pl.planner.PlanTable) -> None:
    t = table.table
    default = pl.simulate(Plan.even(8, 4, batch_size=16), _profile(), _cluster(), "1f1b-flush",
                          microbatches=4)
    row = t[(t.method == "1f1b-flush") & (t.partitioner == "uniform") & (t.stages == 4)
            & (t.microbatches == 4) & ~t.recompute & (t.compression == "none")]
    assert len(row) == 1 and row.iloc[0]["throughput"] == pytest.approx(default.throughput)
    assert table.default.name == row.index[0]
    assert table.best["throughput"] > default.throughput   # unbalanced: a better split exists
    assert table.simulate().throughput == pytest.approx(table.best["throughput"])


def test_memory_limit_is_respected() -> None:
    full = plan(_profile(), _cluster(), **KW)
    smallest = full.pareto["peak_memory"].min()
    limit = int(smallest * 1.01)
    tight = plan(_profile(), _cluster(), memory_limit=limit, **KW)
    fits = tight.table[tight.table["fits"]]
    assert (fits["peak_memory"] <= limit).all()
    assert tight.best["peak_memory"] <= limit
    assert tight.best["throughput"] <= full.best["throughput"]
    with pytest.raises(ValueError, match="no candidate fits"):
        _ = plan(_profile(), _cluster(), memory_limit=1000, **KW).best


def test_recomputation_trades_time_for_memory(table: pl.planner.PlanTable) -> None:
    t = table.table
    sel = (t.method == "gpipe") & (t.partitioner == "balanced") & (t.stages == 4) & (t.microbatches == 16) \
        & (t.compression == "none")
    on, off = t[sel & t.recompute].iloc[0], t[sel & ~t.recompute].iloc[0]
    if on["status"] == off["status"] == "simulated":
        assert on["peak_memory"] < off["peak_memory"]
        assert on["throughput"] < off["throughput"]


def test_staleness_is_flagged_for_asynchronous_methods_only(table: pl.planner.PlanTable) -> None:
    sim = table.table[table.table["status"] == "simulated"]
    sync = sim[sim.method.isin(["gpipe", "1f1b-flush", "zb-h1", "interleaved-1f1b", "dp"])]
    assert (sync["delay"] == 0).all() and (sync["staleness_risk"] == "").all()
    pd_rows = sim[(sim.method == "pipedream") & (sim.stages > 1)]
    assert (pd_rows["delay"] >= 1).all() and pd_rows["staleness_risk"].str.contains("stale").all()
    # straight 4-stage PipeDream: the input stage stashes 4 versions, reads 3 updates old
    straight = pd_rows[(pd_rows.config == "straight") & (pd_rows.stages == 4)]
    assert (straight["versions"] == 4).all() and (straight["delay"] == 3).all()


def test_deterministic_and_well_formed(table: pl.planner.PlanTable) -> None:
    again = plan(_profile(), _cluster(), **KW)
    assert again.table.equals(table.table)
    assert list(table.table.columns) == list(COLUMNS)
    ranked = table.table[table.table["rank"] > 0].sort_values("rank")
    thr = ranked["throughput"].to_numpy()
    assert (thr[1:] <= thr[:-1] * (1 + 1e-8)).all()   # fastest first (float ties go to less memory)
    assert ranked["rank"].tolist() == list(range(1, len(ranked) + 1))
    front = table.pareto
    assert front["throughput"].is_monotonic_increasing and front["peak_memory"].is_monotonic_increasing
    assert not math.isnan(table.best["throughput"])


def test_bad_input_is_refused() -> None:
    with pytest.raises(MethodError):
        plan(_profile(), _cluster(), methods=["no-such-method"])
    with pytest.raises(TypeError, match="Profile"):
        plan("gnmt16", _cluster())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_limit"):
        plan(_profile(), _cluster(), memory_limit=[1, 2])


def test_progress_callback_sees_every_candidate() -> None:
    seen: list[tuple[int, int]] = []
    pt = plan(_profile(), _cluster(), methods=["1f1b-flush"], progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (len(pt.table), len(pt.table))


def test_cli_auto_prints_the_pick_and_writes_its_plan(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from pipelab.cli.plan import main

    prof = tmp_path / "p.json"
    _profile().save(prof)
    out, csv = tmp_path / "plan.json", tmp_path / "table.csv"
    rc = main([str(prof), "--cluster", "flat:4", "--auto", "--no-progress", "--methods", "1f1b-flush,gpipe",
               "-o", str(out), "--table", str(csv)])
    text = capsys.readouterr().out
    assert rc == 0 and "pick: " in text and "default (1f1b-flush" in text and "Pareto front" in text
    best = plan(_profile(), pl.Cluster.parse("flat:4"), methods=["1f1b-flush", "gpipe"]).candidate()
    assert Plan.load(out).stages == best.plan.stages
    assert csv.read_text().splitlines()[0].startswith("rank,method,synchronous,partitioner")
    assert main([str(prof), "--cluster", "flat:4", "--auto", "--methods", "nope"]) == 2


def test_reported_memory_is_the_memory_models(table: pl.planner.PlanTable) -> None:
    """1F1B-flush on a straight split keeps ``min(M, P - s)`` microbatches on stage ``s``: its peak is
    the cost model's closed form (weights, gradients, momentum, activations), which the table reports."""
    t = table.table
    row = t[(t.method == "1f1b-flush") & (t.partitioner == "uniform") & (t.stages == 4)
            & (t.microbatches == 8) & ~t.recompute & (t.compression == "none")].iloc[0]
    assert row["status"] == "simulated" and bool(row["synchronous"])
    c = table.candidate(int(row.name))
    cm = pl.partition.CostModel(_profile(), _cluster())
    want = max(cm.memory_bytes(s.start, s.end, versions=1, in_flight=min(8, 4 - s.index),
                               microbatches=8)["total"] for s in c.plan.stages)
    assert row["peak_memory"] == want
    assert not t[t.method == "pipedream"]["synchronous"].any()


@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush", "zb-h1", "interleaved-1f1b"])
def test_one_minibatch_plus_optimizer_state_is_the_steady_peak(method: str) -> None:
    """The planner simulates a flushed method for one minibatch and adds the optimizer state its
    first update allocates; a simulation of three minibatches is the oracle."""
    pt = plan(_profile(), _cluster(), methods=[method], compression=(None,), recompute=(False,), prune=False)
    for i in pt.table.index[pt.table["status"] == "simulated"][:6]:
        long = pt.simulate(int(i), minibatches=3)
        assert pt.table.loc[i, "peak_memory"] == max(long.peak_memory)
        # one flushed minibatch: never optimistic (ZB-H1's deferred W may overlap the next one)
        assert pt.table.loc[i, "time_per_minibatch_s"] >= long.time_per_minibatch * (1 - 1e-9)
