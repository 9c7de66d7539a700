"""Your own model through the CLI: ``module:function`` in profile, plan and simulate, the shipped
example job run from another folder, and one error style across sub-commands."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import pipelab as pl
from pipelab.cli import main

MODEL = '''
import torch
from torch import nn

def make(width: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 3))
'''


@pytest.fixture
def own_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A model module in a fresh folder that is the current directory (not on the import path before)."""
    name = f"own_model_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return f"{name}:make"


def test_profile_plan_simulate_take_module_function(own_model: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "own.json"
    assert main(["profile", "--model", own_model, "--input-shape", "8,12", "--repeats", "1", "--quiet",
                 "-o", str(out)]) == 0
    prof = pl.Profile.load(out)
    assert len(prof) == 5 and prof.batch_size == 8 and prof.model == own_model   # one layer per child
    capsys.readouterr()
    assert main(["plan", own_model, "--input-shape", "8,12", "--cluster", "flat:2", "--method", "gpipe"]) == 0
    text = capsys.readouterr().out
    assert "M=2 microbatches of 4 samples, fill and drain (the flush) included" in text
    assert main(["simulate", str(out), "--cluster", "flat:2", "--method", "1F1B-flush",
                 "--partition", "gpipe"]) == 0
    text = capsys.readouterr().out
    assert "M=2 microbatches of 4 samples" in text and "flush) included" in text
    assert main(["profile", "--model", own_model]) == 2     # no input shape: said so
    assert "needs --input-shape" in capsys.readouterr().err
    assert main(["profile", "--model", own_model.replace(":make", ":mak"), "--input-shape", "8,12"]) == 2
    assert "has no function 'mak'; did you mean 'make'?" in capsys.readouterr().err


@pytest.mark.slow
def test_example_job_runs_from_another_folder(repo_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    job = tmp_path / "examples"
    shutil.copytree(repo_root / "examples", job, ignore=shutil.ignore_patterns("out", "__pycache__"))
    monkeypatch.chdir(repo_root.parent)              # neither the repository nor the example folder
    monkeypatch.setattr(sys, "path", list(sys.path))
    doc = json.loads((job / "job.json").read_text())
    doc["steps"] = 6                                 # the same job, shorter
    (job / "job.json").write_text(json.dumps(doc))
    chrome = tmp_path / "trace.json"
    assert main(["train", str(job / "job.json"), "--backend", "local", "--no-progress",
                 "--chrome", str(chrome)]) == 0
    text = capsys.readouterr().out
    assert "steady state" in text and "start-up" in text
    events = json.loads(chrome.read_text())["traceEvents"]
    plan = pl.Plan.load(job / "plan.json")
    sched = pl.schedules.build(doc["method"], plan, microbatches=doc["microbatches"], minibatches=6)
    assert sum(e.get("ph") == "X" for e in events) >= sum(len(a) for a in sched.actions)
    assert (job / "out" / "state_dict.pt").is_file()


def test_one_error_style_did_you_mean_and_cluster_list(capsys) -> None:
    cases = [(["plan", "vgg16", "--cluster", "pipdream-a:4x4"], "pipelab plan: error:", "'pipedream-a'?"),
             (["plan", "vgg61", "--cluster", "flat:2"], "pipelab plan: error:", "'vgg16'?"),
             (["simulate", "vgg16", "--cluster", "flat:2", "--microbatches", "3", "--method", "gpipe"],
              "pipelab simulate: error:", "does not split into microbatches=3"),
             (["train", "no_such_job.json"], "pipelab train: error:", "examples/job.json")]
    for argv, head, hint in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(head) and hint in err, (argv, err)
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "vgg16", "--method", "1f1b-flsh"])
    assert exc.value.code == 2
    assert "did you mean '1f1b-flush'?" in capsys.readouterr().err
    assert main(["plan", "--cluster", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in pl.Cluster.presets())
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "``" not in capsys.readouterr().out
