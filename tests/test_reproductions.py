"""The reproductions: every notebook runs under papermill with tiny parameters, the driver writes its
tables and report, and the helpers behind them agree with hand computations.

Notebook runs are real (a kernel per notebook), so a broken notebook fails ``make test``.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from _runs import Table1QuickRun

from reproductions._common import report
from reproductions.hetpipe import virtual_workers
from reproductions.pipedream_table1 import measure, rows
from reproductions.weight_stashing import stashing

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "reproductions"
NOTEBOOKS = sorted(REPRO.glob("*/*.ipynb"))


def _papermill(nb: Path, out: Path, **params: object) -> nbformat.NotebookNode:
    report.run_notebook(nb, out / nb.name, {"out_dir": str(out), "report": True, **params}, cwd=nb.parent)
    return nbformat.read(str(out / nb.name), as_version=4)


# ----------------------------------------------------------------------------- notebooks as stored


def test_notebooks_are_stored_clean_and_built_from_source() -> None:
    assert {p.parent.name for p in NOTEBOOKS} >= {"pipedream_table1", "weight_stashing", "hetpipe",
                                                  "weight_buffer"}
    for path in NOTEBOOKS:
        nb = nbformat.read(str(path), as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.outputs and c.execution_count is None, f"{path.name}: stored with outputs"
        assert path.stat().st_size < 100_000
    # that each .ipynb is what its jupytext .py source converts to: tests/test_notebook_sources.py


# ----------------------------------------------------------------------------- helpers vs hand values


def test_paper_table_and_config_shapes() -> None:
    row = rows.paper_row("vgg16", "pipedream-a", 4, 4)
    assert row is not None and (row.config, row.speedup) == ("15-1", 5.28)
    assert rows.paper_row("vgg16", "pipedream-a", 1, 1) is None
    assert {r.key for r in rows.TABLE1} >= {"gnmt8/pipedream-a/3x4", "gnmt16/pipedream-b/2x8",
                                          "resnet50/pipedream-b/2x8"}
    assert rows.config_shape("15-1") == "replicated-front"
    assert rows.config_shape("16") == "dp"
    assert rows.config_shape("straight") == "straight"
    assert rows.config_shape("1-3") == "hybrid"
    with pytest.raises(ValueError, match="notation"):
        rows.config_shape("fifteen-one")


def test_table1_row_error_and_shape() -> None:
    from pipelab.partition.plan import Plan

    plan = Plan.from_boundaries(10, [8], replicas=[15, 1])
    row = rows.table1_row(model="vgg16", cluster="pipedream-a", servers=4, gpus_per_server=4, plan=plan,
                        predicted_speedup=5.0, simulated_speedup=4.224)
    assert row["config"] == "15-1" and row["shape_matches"] is True
    assert row["error"] == pytest.approx(4.224 / 5.28 - 1, abs=1e-3)
    assert row["within_25pct"] is True
    straight = rows.table1_row(model="vgg16", cluster="pipedream-a", servers=4, gpus_per_server=4,
                             plan=Plan.even(10, 4), predicted_speedup=2.0, simulated_speedup=2.0)
    assert straight["shape_matches"] is False and straight["within_25pct"] is False
    # the second baseline: DP with its all-reduce after backward, 3 s per minibatch against the plan's 1 s
    row = rows.table1_row(model="vgg16", cluster="pipedream-a", servers=4, gpus_per_server=4, plan=plan,
                        predicted_speedup=2.0, simulated_speedup=2.0, sim_ms=(1.0, 2.0),
                        sim_dp_no_overlap_s=3.0)
    assert row["simulated_speedup_dp_no_overlap"] == 3.0 and row["sim_dp_no_overlap_ms"] == 3000.0
    assert row["error_dp_no_overlap"] == pytest.approx(3.0 / 5.28 - 1, abs=1e-3)
    md = rows.table1_markdown(pd.DataFrame([row]))
    assert "sim. × over DP, no overlap" in md and "-43%" in md


def test_steady_throughput_typical_and_mean() -> None:
    """Completions at 0, 1, 2, 3, 10, 11, 12 s (a 6 s stall), warm-up 1: the typical interval is 1 s
    (8 samples/s at 8 per minibatch), the mean rate 5 minibatches in 11 s."""
    from types import SimpleNamespace

    from reproductions.pipedream_table1.measure import _steady_throughput

    ends = [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0]
    evs = [SimpleNamespace(kind="U", microbatch=k, end_s=t) for k, t in enumerate(ends)]
    evs.append(SimpleNamespace(kind="U", microbatch=4, end_s=9.5))   # the other replica's update: max counts
    run = SimpleNamespace(trace=SimpleNamespace(compute_events=lambda: evs), throughput=-1.0)
    assert _steady_throughput(run, 8, 1, typical=True) == pytest.approx(8.0)
    assert _steady_throughput(run, 8, 1) == pytest.approx(5 * 8 / 11)


def test_gloo_loopback_needs_two_workers() -> None:
    with pytest.raises(ValueError, match="workers=1"):
        measure.gloo_loopback(1)


def test_wsp_timeline_by_hand() -> None:
    # two VWs, 1 s and 2 s per wave, push and pull 0.5 s each.
    # D = 0: wave k starts when every VW has pushed wave k-1, then a pull: 2 + 0.5 + 0.5 = 3.0, ...
    assert virtual_workers.wsp_makespan([1.0, 2.0], waves=3, staleness=0, push_s=0.5, pull_s=0.5) == [
        [1.0, 4.0, 7.0], [2.0, 5.0, 8.0]]
    # D = 1: the fast VW starts wave 1 at once (1.0 -> 2.0); wave 2 needs every push of wave 0 (2.5),
    # which it waits for and pulls (3.0 -> 4.0); the slow VW never waits (its own wave 0 push is
    # done before its wave 1 ends).
    assert virtual_workers.wsp_makespan([1.0, 2.0], waves=3, staleness=1, push_s=0.5, pull_s=0.5) == [
        [1.0, 2.0, 4.0], [2.0, 4.0, 6.0]]
    with pytest.raises(ValueError, match="D=-1"):
        virtual_workers.wsp_makespan([1.0], waves=2, staleness=-1)


def test_rebatch_scales_activations_not_weights() -> None:
    from pipelab.profile.records import Profile

    prof = Profile.synthetic([1.0, 2.0], [2.0, 4.0], out_bytes=[100, 40], param_bytes=[8, 16], batch_size=8,
                             input_bytes=64)
    half = virtual_workers.rebatch(prof, 4)
    assert half.batch_size == 4 and half.input_bytes == 32
    assert [layer.fwd_s for layer in half.layers] == [0.5, 1.0]
    assert [layer.out_bytes for layer in half.layers] == [50, 20]
    assert half.cut_bytes == (prof.cut_bytes[0] // 2,)
    assert half.param_bytes == prof.param_bytes


def test_parse_method() -> None:
    assert stashing.parse_method("pipedream+vertical_sync") == ("pipedream", {"vertical_sync": True})
    assert stashing.parse_method("buffered:3") == ("buffered", {"versions": 3})
    assert stashing.parse_method("dp") == ("dp", {})


def test_mean_over_seeds() -> None:
    per_seed = pd.DataFrame({"method": ["pd", "pd", "dp", "dp"] * 2, "epoch": [1, 2, 1, 2] * 2,
                             "test_accuracy": [0.4, 0.8, 0.5, 0.9, 0.2, 0.6, 0.7, 0.9],
                             "train_loss": [1.0, 0.6, 1.0, 0.5, 1.0, 0.7, 1.0, 0.4],
                             "seed": [0] * 4 + [1] * 4})
    mean = stashing.mean_over_seeds(per_seed)
    assert list(mean["method"]) == ["pd", "pd", "dp", "dp"]      # first-seen order kept
    assert list(mean["test_accuracy"]) == pytest.approx([0.3, 0.7, 0.6, 0.9])
    assert list(mean["accuracy_spread"]) == pytest.approx([0.2, 0.2, 0.2, 0.0])
    summary = stashing.stash_summary(mean, last=2).set_index("method")
    assert summary.loc["pd", "late_gap_to_dp_pts"] == pytest.approx(-25.0)


def test_svg_chart_is_well_formed() -> None:
    df = pd.DataFrame({"epoch": [1, 2, 1, 2], "acc": [0.5, 0.9, 0.4, 0.6], "method": ["dp", "dp", "x", "x"]})
    svg = report.svg_curves(df, x="epoch", y="acc", color="method", title="t & <u>")
    root = ET.fromstring(svg)
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 2


def test_markdown_table_without_tabulate() -> None:
    df = pd.DataFrame({"a": [1.5, math.nan], "b": ["x", None]})
    assert report.markdown_table(df).splitlines() == ["| a | b |", "|---|---|", "| 1.5 | x |", "|  |  |"]


def test_simulated_table1_row_is_deterministic() -> None:
    import pipelab as pl

    prof = pl.models.pipedream_profile("gnmt8")
    cl = pl.Cluster.preset("pipedream-a", servers=1, gpus_per_server=4)
    plan = pl.partition(prof, cl, method="pipedream")
    a = rows.simulate_plan(plan, prof, cl, minibatches=16).throughput
    b = rows.simulate_plan(pl.partition(prof, cl, method="pipedream"), prof, cl, minibatches=16).throughput
    assert a == b and a > 0


# ----------------------------------------------------------------------------- notebooks under papermill


@pytest.mark.slow
def test_table1_notebook_simulate(tmp_path: Path) -> None:
    nb = _papermill(REPRO / "pipedream_table1" / "table1.ipynb", tmp_path, model="gnmt8",
                    cluster="pipedream-a", servers=1, gpus_per_server=4, minibatches=8, gantt_minibatches=2)
    row = json.loads((tmp_path / "row.json").read_text())
    assert row["paper_config"] == "straight" and row["paper_speedup"] == 1.5
    assert row["simulated_speedup"] > 0 and row["config"]
    # as PipeDream ran it: batch 64 per worker, and PipeDream's own 4-stage configuration simulated too
    assert row["batch_size"] == 64 and row["paper_config_name"] == "gnmt/gpus=4/mp_conf"
    assert row["paper_config_as_run"] == "straight" and row["paper_config_simulated_speedup"] > 0
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "Plotly.newPlot" in html and "plotly.js v" not in html  # the figure, without its own plotly.js


@pytest.mark.slow
def test_table1_notebook_measure_mode(tmp_path: Path) -> None:
    # the code path of measure mode (profile the reduced model here, partition for this machine, run
    # the plans, simulate them); the reference executor and a given bandwidth keep it to seconds
    _papermill(REPRO / "pipedream_table1" / "table1.ipynb", tmp_path, model="vgg16", minibatches=4,
               gantt_minibatches=1, mode="measure", backend="local", measure_steps=2, measure_warmup=1,
               measure_batch=4, measure_width=0.0625, measure_rounds=1, measure_bandwidth=2e9)
    row = json.loads((tmp_path / "row.json").read_text())
    assert row["measure_workers"] == 2 and row["measure_gloo_GBps"] == 2.0
    for name in ("chosen", "straight"):
        assert row[f"measure_{name}_measured_speedup"] > 0 and row[f"measure_{name}_simulated_speedup"] > 0
    assert row["measure_straight_config"] == "straight"
    assert row["measure_allreduce_overlap"] == "none" and row["measure_allreduce_GBps"] == 2.0
    assert row["measure_optimizer_GBps"] > 0
    assert len(str(row["measure_straight_measured_rounds"]).split()) == 1


@pytest.mark.slow
def test_weight_stashing_notebook(tmp_path: Path) -> None:
    _papermill(REPRO / "weight_stashing" / "weight_stashing.ipynb", tmp_path, methods=["dp", "pipedream"],
               epochs=1, train_limit=64, batch_size=16, sweep_lrs=[0.1], sweep_methods=["dp"], sweep_epochs=1,
               seeds=[0, 1])
    df = pd.read_csv(tmp_path / "accuracy.csv")
    assert set(df["method"]) == {"dp", "pipedream"}
    per_seed = pd.read_csv(tmp_path / "accuracy_per_seed.csv")
    assert len(per_seed) == 2 * len(df) and set(per_seed["seed"]) == {0, 1}
    assert df["test_accuracy"].between(0, 1).all()
    ET.parse(tmp_path / "accuracy.svg")


@pytest.mark.slow
def test_hetpipe_notebook(tmp_path: Path) -> None:
    _papermill(REPRO / "hetpipe" / "hetpipe.ipynb", tmp_path, staleness=[0, 1], minibatches=8,
               policies=["ED"], emu_epochs=1, emu_train_limit=128, emu_staleness=[1], backend="local")
    sim = pd.read_csv(tmp_path / "simulated.csv")
    assert sim["config"].iloc[0].startswith("dp") and (sim["samples_per_s"] > 0).all()
    # D = 1 takes the wave synchronisation off the critical path: never slower than D = 0
    het = sim.set_index("D")["samples_per_s"]
    assert het[1] >= het[0]
    emu = pd.read_csv(tmp_path / "emulated.csv")
    assert list(emu["config"]) == ["dp", "hetpipe D=1"] and (emu["samples_per_s"] > 0).all()


@pytest.mark.slow
def test_weight_buffer_notebook(tmp_path: Path) -> None:
    _papermill(REPRO / "weight_buffer" / "weight_buffer.ipynb", tmp_path, quick=True)
    table = pd.read_csv(tmp_path / "results_lr0.02.csv")
    assert list(table["config"])[0] == "gpipe" and table["test_accuracy_mean"].between(0, 1).all()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_driver_writes_table_and_offline_report(table1_quick_run: Table1QuickRun) -> None:
    # the session's one `pipelab reproduce --only table1 --quick` (conftest.py), into its run folder;
    # that the checkout stays clean is tests/test_reproduce_runs.py's
    assert table1_quick_run.code == 0 and len(table1_quick_run.new_folders) == 1
    out = table1_quick_run.new_folders[0] / "pipedream_table1"
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 and set(df["paper_config"]) == {"15-1"}
    md = (out / "results.md").read_text()
    assert "15-1" in md and "paper" in md
    html = (out / "report.html").read_text()
    assert html.count("plotly.js v") == 1          # plotly.js once, for every figure
    assert html.count("Plotly.newPlot") == 2       # one Gantt per row
    assert len(html) < 6_000_000
    assert not (out / "_runs").exists()


@pytest.mark.slow
def test_sim_accuracy_notebook(tmp_path: Path) -> None:
    # a calibrated cluster of this machine's shape without the half-minute calibration: the notebook's
    # own calibration step is pl.calibrate, covered by tests/test_calibrate.py
    import dataclasses
    import socket

    from pipelab.cluster import Calibration, Cluster
    from pipelab.measured import HostEffects

    cal = Calibration(host=socket.gethostname(), backend="gloo", device="cpu:test", date="2026-11-25",
                      torch="2.14.1", cores=2, workers=2, p2p_latency_s=1e-4, p2p_bandwidth=2e9,
                      allreduce_latency_s=1e-4, allreduce_bandwidth=1e9,
                      overhead_s={"F": 1e-4, "B": 1e-4, "W": 1e-4, "U": 1e-4},
                      optimizer_s={"sgd-momentum": (5e-5, 1e-10)}, memory_bandwidth=1e10,
                      host_effects=HostEffects(busy_sender_s=2e-4))
    path = dataclasses.replace(Cluster.flat(2, bandwidth=2e9, latency=1e-4), calibration=cal).save(
        tmp_path / "cluster.json")
    # the second calibration, after the runs: every compute action's overhead ten times larger
    slow = dataclasses.replace(cal, overhead_s={k: 1e-3 for k in cal.overhead_s})
    path2 = dataclasses.replace(Cluster.flat(2, bandwidth=2e9, latency=1e-4), calibration=slow).save(
        tmp_path / "cluster2.json")
    _papermill(REPRO / "sim_accuracy" / "sim_accuracy.ipynb", tmp_path, models=["cnn"],
               methods=["gpipe", "pipedream"], steps=6, rounds=1, cluster_path=str(path),
               second_cluster_path=str(path2), planner_errors=str(tmp_path / "sim_errors.json"),
               pair_model_factors=False, held_out_rounds=0)
    df = pd.read_csv(tmp_path / "results.csv")
    # the same runs against the second calibration: slower actions, slower predictions, same plans
    assert (df["simulated_recalibrated"] < df["simulated"]).all()
    assert ((df["simulated_recalibrated"] - df["measured"]) / df["measured"]).tolist() == \
        pytest.approx(df["error_recalibrated"].tolist())
    assert "recalibrated" in (tmp_path / "results.md").read_text()
    # and on a second profile of the model, taken after the runs
    assert (df["simulated_reprofiled"] > 0).all()
    assert "error_reprofiled" in (tmp_path / "results.md").read_text()
    # what make reproduce also writes: the planner's per-method margins from these results
    from pipelab.planner.decide import load_errors
    assert set(load_errors(tmp_path / "sim_errors.json")) >= {"gpipe", "pipedream"}
    assert list(df["method"]) == ["gpipe", "pipedream"] and (df["measured"] > 0).all()
    assert (df["simulated"] > 0).all() and df["error"].notna().all()
    # a host effect only ever slows a message: with it, no prediction is faster than the core model's
    assert (df["error"] <= df["error_core"] + 1e-9).all()
    assert df["error_without_busy_sender"].notna().all()
    assert "ALL" in (tmp_path / "results.md").read_text()
    # a profile taken right before each configuration's runs, paired; no model factors asked for
    assert (df["error_fresh_profile"].abs() < 10).all() and df["error_model_factor"].isna().all()
    # less the run's common shift: the median of the rescaled errors is 0 by construction
    from reproductions.sim_accuracy.accuracy import less_shift, shift_of
    assert shift_of(df) == pytest.approx(df["error"].median())
    assert less_shift(df).median() == pytest.approx(0.0, abs=1e-12)
    assert "common shift" in (tmp_path / "results.md").read_text()
    assert "without busy_sender" in (tmp_path / "results.md").read_text()
    ET.parse(tmp_path / "scatter.svg")


def test_reproduce_without_a_checkout_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from pipelab.cli import main as cli_main
    from pipelab.cli import reproduce

    monkeypatch.setattr(reproduce, "ROOT", tmp_path)   # an installed package: no reproductions/ beside it
    assert cli_main(["reproduce", "--quickstart"]) == 2
    assert "clone it and run `make reproduce`" in capsys.readouterr().err
