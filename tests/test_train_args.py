"""One record behind train, launch, the job file and the CLI: each knob declared once (TrainArgs, the
registry's runtime options), unknown keys refused listing the valid ones, the keyword signature kept."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import test_runtime_helpers as H

import pipelab as pl
import pipelab.methods as methods
from pipelab.runtime.args import JOB_FIELDS, TrainArgs
from pipelab.runtime.job import load_job_file
from pipelab.runtime.options import RuntimeOptions

GOOD = {"model_fn": "test_runtime_helpers:mlp", "data": "test_runtime_helpers:mlp_data",
        "loss_fn": "test_runtime_helpers:loss_fn",
        "optimizer": {"fn": "torch.optim:SGD", "kwargs": {"lr": 0.1}}, "method": "gpipe", "steps": 2}


def _job(folder: Path, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "job.json"
    p.write_text(json.dumps({**GOOD, "plan": pl.Plan.from_boundaries(5, [2]).to_dict(), **over}))
    return p


def test_train_and_launch_show_every_field_of_the_record_as_a_keyword() -> None:
    fields = [f.name for f in dataclasses.fields(TrainArgs) if f.name != "options"]
    for fn in (pl.train, pl.launch):
        params = inspect.signature(fn).parameters
        assert list(params)[:-1] == fields and list(params)[-1] == "options"
        assert params["backend"].default == "gloo" and params["timeout"].default == 300.0
    assert "checkpoint_every" not in fields     # runtime options stay options, declared in the registry


def test_the_record_splits_knobs_from_options_and_names_missing_ones() -> None:
    a = TrainArgs.of(model_fn=H.mlp, plan=pl.Plan.from_boundaries(5, [2]), data=H.mlp_data, loss_fn=H.loss_fn,
                     optimizer=H.sgd, steps=2, backend="local", compression="fp16", chunks=2)
    assert a.backend == "local" and dict(a.options) == {"compression": "fp16", "chunks": 2}
    with pytest.raises(TypeError, match="lacks data=, loss_fn="):
        TrainArgs.of(model_fn=H.mlp, plan=pl.Plan.from_boundaries(5, [2]), optimizer=H.sgd, steps=2)
    with pytest.raises(ValueError, match="steps=0"):
        dataclasses.replace(a, steps=0).check()


def test_runtime_options_defaults_are_the_registrys() -> None:
    rt = RuntimeOptions()
    declared = {o.name: o.default for o in methods.COMMON_RUNTIME_OPTIONS}
    fields = {f.name for f in dataclasses.fields(RuntimeOptions)} - {"method", "resume_step"}
    assert fields == set(declared)           # every registry knob is a field, and nothing else
    for name in fields - {"slowdown"}:
        assert getattr(rt, name) == declared[name], name
    assert RuntimeOptions.from_options("gpipe", {}) == rt
    assert RuntimeOptions.from_options("gpipe", {"checkpoint_keep": None}).checkpoint_keep == 2


def test_a_job_files_keys_are_the_records_fields(tmp_path: Path) -> None:
    args, _ = load_job_file(_job(tmp_path, seed=3, timeout=60, options={"compression": "fp16"}))
    rec = TrainArgs.of(**args)
    assert rec.seed == 3 and rec.timeout == 60.0 and dict(rec.options) == {"compression": "fp16"}
    assert set(JOB_FIELDS) >= {"model_fn", "plan", "steps", "seed", "backend", "timeout", "microbatches"}
    assert "schedule" not in JOB_FIELDS and "progress" not in JOB_FIELDS


def test_unknown_job_keys_are_refused_listing_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'microbatch'.*keys are model_fn, plan.*out"):
        load_job_file(_job(tmp_path, microbatch=4))
    with pytest.raises(ValueError, match="'seed' in \"options\" are the job's own keys"):
        load_job_file(_job(tmp_path, options={"seed": 1}))


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="compresion"):
        pl.train(H.mlp, pl.Plan.from_boundaries(5, [2]), method="gpipe", data=H.mlp_data, loss_fn=H.loss_fn,
                 optimizer=H.sgd, steps=1, backend="local", compresion="fp16")


def test_train_runs_from_the_record_as_before() -> None:
    kw = dict(method="1f1b-flush", data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=2,
              microbatches=2, backend="local")
    res = pl.train(H.mlp, pl.Plan.from_boundaries(5, [2]), **kw)
    ref = pl.train(H.mlp, pl.Plan.from_boundaries(5, [2]), **{**kw, "method": "gpipe"})
    assert len(res.losses) == 2 and res.losses == pytest.approx(ref.losses, rel=1e-6)
