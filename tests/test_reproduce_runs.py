"""``pipelab reproduce`` writes a run into a run folder git ignores and compares it with the references.

The committed reference results in ``reproductions/<part>/`` are rewritten only by
``--update-references``; a run at the defaults (or ``--quick``) leaves ``git status`` as it was. The
comparison of a run's tables with the references is checked on tables built by hand.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from _runs import Table1QuickRun

from reproductions._common import driver
from reproductions._common.compare import compare_folder, compare_table

REPO = Path(__file__).resolve().parents[1]


def test_matched_rows_and_the_largest_change_are_found() -> None:
    ref = pd.DataFrame({"method": ["dp", "gpipe", "pipedream"], "acc": [0.90, 0.80, 0.50],
                        "epochs": [8, 8, 8]})
    run = pd.DataFrame({"method": ["gpipe", "dp"], "acc": [0.78, 0.90], "epochs": [8, 8]})
    change = compare_table(run, ref, "summary.csv")
    assert (change.rows_run, change.rows_reference, change.rows_matched) == (2, 3, 2)
    assert change.largest == pytest.approx(0.02 / 0.80)
    assert (change.column, change.row) == ("acc", "gpipe / 8")
    assert change.describe() == ("summary.csv: 2 rows matched (this run 2, reference 3), largest change "
                                 "2.5% in acc (gpipe / 8)")
    same = compare_table(ref.iloc[::-1], ref, "summary.csv")   # row order does not matter
    assert same.describe() == "summary.csv: 3 rows, the same as the reference"


def test_whole_number_columns_are_part_of_the_key() -> None:
    ref = pd.DataFrame({"method": ["dp"] * 3, "epoch": [1, 2, 3], "acc": [0.5, 0.6, 0.7]})
    run = ref.assign(acc=[0.5, 0.6, 0.77])
    change = compare_table(run, ref, "accuracy.csv")
    assert change.rows_matched == 3 and change.row == "dp / 3" and change.largest == pytest.approx(0.1)


def test_a_missing_text_value_is_part_of_the_key(tmp_path: Path) -> None:
    """A text column with an empty cell (NaN once read back) keys its row, as weight buffer's tables have."""
    table = pd.DataFrame({"method": ["gpipe", "gpipe"], "compress": ["int8", None], "acc": [0.5, 0.6]})
    table.to_csv(tmp_path / "t.csv", index=False)
    change = compare_table(pd.read_csv(tmp_path / "t.csv"), pd.read_csv(tmp_path / "t.csv"), "t.csv")
    assert change.rows_matched == 2 and change.largest == 0.0


def test_a_missing_value_on_one_side_is_an_infinite_change() -> None:
    ref = pd.DataFrame({"key": ["a"], "x": [1.0]})
    assert compare_table(pd.DataFrame({"key": ["a"], "x": [float("nan")]}), ref, "t").largest == float("inf")


def test_tables_without_a_text_column_match_by_position_and_unmatched_are_named(tmp_path: Path) -> None:
    run, ref = tmp_path / "run", tmp_path / "ref"
    run.mkdir(), ref.mkdir()
    pd.DataFrame({"x": [1.0, 2.0]}).to_csv(run / "a.csv", index=False)
    pd.DataFrame({"x": [1.0, 2.5]}).to_csv(ref / "a.csv", index=False)
    pd.DataFrame({"y": [1]}).to_csv(run / "new.csv", index=False)
    pd.DataFrame({"z": [1]}).to_csv(ref / "old.csv", index=False)
    assert compare_folder(run, ref) == ["a.csv: 2 rows, largest change 20.0% in x (row 1)",
                                        "new.csv: new (no committed reference)",
                                        "old.csv: not written by this run (outside its subset)"]


def test_run_folders_are_named_by_time_and_never_reused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "RUNS", tmp_path)
    now = datetime.datetime(2026, 12, 7, 15, 30, 0, tzinfo=datetime.timezone.utc)
    first = driver.run_folder(now)
    assert first == tmp_path / "20261207-153000"
    first.mkdir()
    assert driver.run_folder(now) == tmp_path / "20261207-153000-2"


def test_updating_the_references_is_refused_with_tiny_or_elsewhere_results(
        capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--quick"], ["--out", "/tmp/x"]):
        with pytest.raises(SystemExit):
            driver.main(["--update-references", *extra])
        assert "rewrites the committed results at full size" in capsys.readouterr().err


def test_the_run_folder_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (or no git here): nothing to keep clean")
    probe = driver.RUNS.relative_to(REPO) / "20260101-000000" / "pipedream_table1" / "results.csv"
    done = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=REPO, check=False)
    assert done.returncode == 0, f"git does not ignore {probe}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reproduction_leaves_the_checkout_clean(table1_quick_run: Table1QuickRun) -> None:
    # the session's one `--only table1 --quick` run (conftest.py); its tables and report are checked
    # by tests/test_reproductions.py::test_driver_writes_table_and_offline_report
    run = table1_quick_run
    if run.status_before is None:
        pytest.skip("not a git checkout (or no git here): nothing to keep clean")
    assert run.code == 0
    assert run.status_after == run.status_before, "a reproduction changed the checkout's git status"
    assert len(run.new_folders) == 1, run.new_folders
    folder = run.new_folders[0]
    assert folder.parent == driver.RUNS
    assert (folder / "pipedream_table1" / "results.csv").is_file()
    out = run.printed
    assert f"this run's results go to {folder}" in out
    assert "pipedream_table1: this run against the committed reference" in out
    assert "results.csv: 2 rows matched (this run 2, reference 10)" in out
