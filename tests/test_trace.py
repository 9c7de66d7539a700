"""Trace exports: Chrome trace and JSONL round trips, per-worker measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelab.cluster import Cluster
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules import build
from pipelab.schedules.dataflow import UnitCosts
from pipelab.sim import simulate, simulate_schedule
from pipelab.trace import Trace


def _sim_trace() -> tuple[Trace, int]:
    prof = Profile.synthetic([1e-3] * 8, [2e-3] * 8, out_bytes=[10**6] * 8, param_bytes=[10**6] * 8,
                             batch_size=16)
    plan = Plan.from_boundaries(8, [3, 5], [2, 1, 1], batch_size=16)
    res = simulate(
        plan, prof, Cluster.preset("pipedream-a", servers=1, gpus_per_server=4), method="pipedream"
    )
    return res.trace, len(res.schedule)


def test_chrome_trace_round_trip(tmp_path: Path) -> None:
    """to_chrome_trace writes one X event per action (plus transfers); loading it back is lossless."""
    trace, n_actions = _sim_trace()
    path = trace.to_chrome_trace(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in "FBWU"]
    assert len(xs) == n_actions
    back = Trace.load_chrome_trace(path)
    assert len(back.compute_events()) == n_actions
    assert sorted(back.events, key=lambda e: (e.worker, e.start_s, e.kind)) == \
        sorted(trace.events, key=lambda e: (e.worker, e.start_s, e.kind))
    assert {e.kind for e in back} >= {"F", "B", "U", "send", "allreduce"}
    assert back.actions_by_worker() == trace.actions_by_worker()
    with pytest.raises(ValueError, match="not a Chrome trace"):
        (tmp_path / "bad.json").write_text("{}")
        Trace.load_chrome_trace(tmp_path / "bad.json")


def test_jsonl_round_trip(tmp_path: Path) -> None:
    trace, _ = _sim_trace()
    back = Trace.load_jsonl(trace.save_jsonl(tmp_path / "t.jsonl"))
    assert back.events == trace.events and back.meta["method"] == "pipedream"
    df = back.to_dataframe()
    assert len(df) == len(trace) and (df["duration_s"] >= 0).all()


def test_busy_time_and_bubble_fraction_match_sim() -> None:
    """Trace.bubble_fraction equals the simulator's for a flush schedule measured over the whole run."""
    res = simulate_schedule(build("1f1b-flush", 4, microbatches=6), UnitCosts())
    assert list(res.trace.bubble_fraction().values()) == pytest.approx(list(res.bubble_fraction))
    assert res.trace.busy_time() == pytest.approx({w: 6 * 3.0 for w in range(4)})
    assert res.trace.busy_time(0.0, 1.0)[0] == pytest.approx(1.0)
    assert res.trace.busy_time(0.0, 1.0)[3] == pytest.approx(0.0)
