"""``pipelab profile`` through pipelab.cli.main, and the installed script once via a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from timing import holds_or_skip

import pipelab as pl
from pipelab.cli import main
from pipelab.hostload import HostLoadSampler


def test_profile_save_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mlp.json"
    assert (
        main(["profile", "--model", "mlp", "--batch", "4", "--repeats", "1", "--quiet", "-o", str(out)]) == 0
    )
    prof = pl.Profile.load(out)
    assert prof.model == "mlp" and prof.batch_size == 4 and prof.source.startswith("measured")
    assert prof.param_bytes == 4 * sum(p.numel() for p in pl.models.mlp().parameters())
    capsys.readouterr()
    assert main(["profile", "--show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TOTAL" in text and "Linear" in text and "batch=4" in text


def test_profile_gnmt_tiny_and_pipedream_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.json"
    with HostLoadSampler() as load:      # the fixed-part check below is a timing
        assert (
            main(
                [
                    "profile",
                    "--model",
                    "gnmt8",
                    "--vocab",
                    "40",
                    "--hidden",
                    "8",
                    "--seq-len",
                    "5",
                    "--batch",
                    "2",
                    "--repeats",
                    "3",
                    "--warmup",
                    "1",
                    "--quiet",
                    "--small-batch",
                    "1",
                    "-o",
                    str(out),
                ]
            )
            == 0
        )
    g = pl.Profile.load(out)
    assert g.param_bytes == 4 * pl.models.gnmt_param_count(8, 40, 8)
    # timed again on one sequence of the two (both inputs sliced): tiny layers are mostly fixed cost (a
    # median of 3 after a warm-up: one cold timing per batch size is too noisy for it; CHANGELOG.md)
    fixed = sum(layer.fwd_fixed_s for layer in g.layers)   # checked last: a busy machine skips it
    pd_out = tmp_path / "vgg_pd.json"
    assert main(["profile", "--pipedream", "vgg16", "-o", str(pd_out)]) == 0
    assert "node1" in capsys.readouterr().out
    assert pl.Profile.load(pd_out) == pl.models.pipedream_profile("vgg16")
    holds_or_skip(fixed > 0.2 * g.fwd_s, load.result,
                  f"the fixed part is {fixed / g.fwd_s:.0%} of the forward, not over 20%")


def test_profile_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"pipelab": "plan", "schema": 1}')
    assert main(["profile", "--show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "is not a pipelab profile file" in err and err.count("\n") == 1
    assert main(["profile", "--pipedream", str(tmp_path / "nope.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["profile", "--model", "resnet5"]) == 2      # a near miss: named, with the zoo's names
    err = capsys.readouterr().err
    assert err.startswith("pipelab profile: error: unknown model 'resnet5'; did you mean 'resnet50'?")
    assert err.count("\n") == 1


def test_installed_script_help() -> None:
    script = Path(sys.executable).with_name("pipelab")
    res = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "profile" in res.stdout
    res = subprocess.run([str(script), "profile", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--pipedream" in res.stdout
