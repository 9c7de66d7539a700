"""Test set-up: one thread per process (set before torch is imported), shared fixtures.

One calibration of this machine serves the whole session (:func:`calibration_run`): ``pipelab
calibrate`` runs once, as a user runs it, and ``tests/test_calibrate.py`` checks that run (the command's
output and the record it wrote). The tests that only need *a* calibrated cluster of this machine (the
quickstart notebook and script, the planner notebook's real runs) load that file instead of measuring
the machine again: the measurement takes most of a minute here and its result does not change what
they check. Likewise one ``pipelab reproduce --only table1 --quick`` (:func:`table1_quick_run`) serves
the two tests that check such a run: the checkout stays clean, and its tables and report.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from _calibrations import CalibrationRun  # noqa: E402
from _runs import Table1QuickRun  # noqa: E402

from pipelab.hostload import HostLoadSampler  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: the most a calibration of this machine may take before a test says so (a quiet 2-core machine: ~50 s)
CALIBRATION_TIMEOUT_S = 300



@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository's root folder."""
    return REPO


@pytest.fixture(scope="session")
def calibration_run(tmp_path_factory: pytest.TempPathFactory) -> CalibrationRun:
    """This machine calibrated once per session by the ``pipelab calibrate`` command (2 gloo workers,
    the default sizes and rounds), for every test that needs a calibrated cluster of it."""
    out = tmp_path_factory.mktemp("calibration") / "me.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with HostLoadSampler() as load:
        try:
            proc: subprocess.CompletedProcess[str] | None = subprocess.run(
                [sys.executable, "-m", "pipelab.cli", "calibrate", "-o", str(out), "--quiet"],
                capture_output=True, text=True, timeout=CALIBRATION_TIMEOUT_S, env=env, cwd=REPO)
        except subprocess.TimeoutExpired:
            proc = None
    return CalibrationRun(out, proc, load.result)


@pytest.fixture
def calibrated_cluster_file(calibration_run: CalibrationRun) -> Path:
    """The session's calibrated cluster JSON; skips saying why on a busy machine where the calibration
    ran out of time, fails where the command failed."""
    from timing import holds_or_skip

    run = calibration_run
    holds_or_skip(run.proc is not None, run.load,
                  f"the session's calibration did not end within {CALIBRATION_TIMEOUT_S} s")
    assert run.proc is not None and run.proc.returncode == 0, \
        f"pipelab calibrate failed:\n{run.proc.stderr[-3000:] if run.proc else ''}"
    return run.path


@pytest.fixture(scope="session")
def table1_quick_run() -> Iterator[Table1QuickRun]:
    """``pipelab reproduce --only table1 --quick`` run once per session as ``make reproduce`` runs it
    (no ``--out``: into a new run folder under ``reproductions/runs/``), with what it printed and the
    checkout's ``git status`` before and after (None where this is not a git checkout). The run folder
    is removed at the session's end. ``tests/test_reproduce_runs.py`` checks the checkout stays clean
    and the comparison it printed; ``tests/test_reproductions.py`` checks the tables and the report."""
    import contextlib
    import io
    import shutil

    from reproductions._common import driver

    def status() -> str | None:
        if shutil.which("git") is None or not (REPO / ".git").exists():
            return None
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                              check=True, capture_output=True, text=True).stdout

    def folders() -> set[Path]:
        return set(driver.RUNS.iterdir()) if driver.RUNS.is_dir() else set()

    before, runs_before = status(), folders()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = driver.main(["--only", "table1", "--quick"])
        yield Table1QuickRun(code, printed.getvalue(), before, status(), sorted(folders() - runs_before))
    finally:
        for folder in folders() - runs_before:
            shutil.rmtree(folder, ignore_errors=True)
