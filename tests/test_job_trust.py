"""A job file is data unless trusted: its callables come from its own folder, the current project or
an allow-list; os, subprocess, builtins and the like are never factories; its paths stay inside its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pipelab as pl
from pipelab.runtime.job import load_job_file

GOOD = {"model_fn": "test_runtime_helpers:mlp", "data": "test_runtime_helpers:mlp_data",
        "loss_fn": "test_runtime_helpers:loss_fn",
        "optimizer": {"fn": "torch.optim:SGD", "kwargs": {"lr": 0.1}}, "method": "gpipe", "steps": 1}


def _job(folder: Path, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {**GOOD, "plan": pl.Plan.from_boundaries(5, [2]).to_dict(), **over}
    p = folder / "job.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_plain_job_loads(tmp_path: Path) -> None:
    args, extra = load_job_file(_job(tmp_path, out="out"))
    assert args["model_fn"].__name__ == "mlp" and extra["out"] == (tmp_path / "out").resolve()


@pytest.mark.parametrize("fn", ["subprocess:run", "os:system", "builtins:exec", "shutil:rmtree",
                                "importlib:import_module", {"fn": "subprocess:run", "kwargs": {"args": "id"}},
                                "torch.hub:load", "os.path:join"])
def test_dangerous_factories_are_refused_even_when_trusted(tmp_path: Path, fn) -> None:
    for trust in (False, True):
        with pytest.raises(ValueError, match="never a factory"):
            load_job_file(_job(tmp_path, model_fn=fn), trust=trust)


def test_a_reexported_dangerous_function_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sneaky_mod.py").write_text("from os import system\nfrom subprocess import run\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        for name in ("system", "run"):
            with pytest.raises(ValueError, match="never a factory"):
                load_job_file(_job(tmp_path, data=f"sneaky_mod:{name}"))
    finally:
        sys.path.remove(str(tmp_path))


def test_modules_outside_the_job_and_project_need_trust(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)      # the current project is now tmp_path: tests/ is outside it
    with pytest.raises(ValueError, match="outside the job file's folder and the current project.*--trust"):
        load_job_file(_job(tmp_path / "job"))
    args, _ = load_job_file(_job(tmp_path / "job"), trust=True)
    assert args["data"].__name__ == "mlp_data"
    with pytest.raises(ValueError, match="public top-level"):
        load_job_file(_job(tmp_path / "job", model_fn="torch.optim:SGD.__init__"), trust=True)


@pytest.mark.parametrize("key,value", [("out", "../elsewhere"), ("out", "/tmp/x"),
                                       ("options", {"checkpoint_dir": "../ck", "checkpoint_every": 1})])
def test_paths_stay_inside_the_jobs_folder_unless_trusted(tmp_path: Path, key: str, value) -> None:
    job = _job(tmp_path / "job", **{key: value})
    with pytest.raises(ValueError, match="outside the job's folder.*--trust"):
        load_job_file(job)
    load_job_file(job, trust=True)


def test_relative_paths_resolve_against_the_job(tmp_path: Path) -> None:
    args, extra = load_job_file(_job(tmp_path / "job", out="o",
                                     options={"checkpoint_dir": "ck", "checkpoint_every": 1}))
    assert extra["out"] == (tmp_path / "job" / "o").resolve()
    assert args["checkpoint_dir"] == str((tmp_path / "job" / "ck").resolve())


def test_the_cli_says_how_to_trust(tmp_path: Path, capsys, monkeypatch) -> None:
    from pipelab.cli.train import main

    job = _job(tmp_path / "job", model_fn="subprocess:run")
    assert main([str(job), "--backend", "local"]) == 2
    assert "never a factory" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    job = _job(tmp_path / "job")
    assert main([str(job), "--backend", "local", "--no-progress"]) == 2
    assert "--trust" in capsys.readouterr().err
    assert main([str(job), "--backend", "local", "--no-progress", "--trust"]) == 0
