"""The teaching notebooks: stored clean, generated from their jupytext ``.py`` sources, and runnable.

That each ``.ipynb`` is what its percent-format source converts to is checked by
``tests/test_notebook_sources.py``.

Each notebook runs top to bottom under papermill with small parameters (the ones a reader would not
notice: fewer steps, fewer sweep points). Their solution cells end with checks against oracles
(brute force, closed forms, the schedule itself), so a notebook that runs is also a notebook whose
answers hold. How long each takes at its defaults (the 90 s a teaching notebook may take) is a speed
claim, printed by ``reproductions/benchmarks/notebook_times.py``, not asserted here.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from browser.labdriver import find_chromium
from timing import holds_or_skip

from pipelab.hostload import HostLoadSampler

REPO = Path(__file__).resolve().parents[1]
NB_DIR = REPO / "notebooks"

# Small parameters per notebook for the suite (each run should take well under 60 s on 2 cores).
SMALL: dict[str, dict[str, Any]] = {
    "01_quickstart": {"backend": "gloo", "steps": 6, "rounds": 2, "microbatches": 2, "batch_size": 32},
    "02_why_pipelining": {"worker_counts": [1, 4, 16], "bandwidths_gbps": [10, 100], "minibatches": 2},
    "03_partitioning": {"explorer_models": ["vgg16"]},
    "04_schedules": {"microbatches": 4, "microbatch_sweep": [1, 4, 8]},
    "05_weight_versions": {"backend": "local", "steps": 8, "compare_steps": 30, "learning_rates": [0.1]},
    "06_heterogeneous": {"policies": ["ED", "NP"], "staleness_bounds": [0, 2], "minibatches": 8},
    "07_beyond_dnns": {},   # at its defaults: as cheap as any smaller run (about 5 s here)
    "08_planner": {"full_search": False, "models": ["gnmt16"], "clusters": ["pipedream-a:1x4"],
                   "run_real": True, "real_models": ["cnn"], "real_steps": 8, "real_rounds": 1,
                   "confirm_rounds": 1, "confirm_top": 0},
    "09_transformers": {"backend": "gloo", "stages": 2, "n_layer": 2, "steps": 3},
    "10_3d_parallelism": {"gpus": 256, "global_batch": 512, "shortlist": 2, "gantt_rounds": 1},
}
#: notebooks that calibrate this machine at their defaults: the suite gives them the session's
#: calibrated cluster (``calibration_run`` in conftest.py) as ``cluster_file`` instead. ``pl.calibrate``
#: is what ``pipelab calibrate`` runs (tests/test_calibrate.py); run from a kernel (its probes spawn
#: processes there), it is the quickstart's calibration cell, which the browser test runs at its defaults
#: (tests/browser/test_quickstart_browser.py). Where no Chromium is installed that test skips, so the
#: quickstart's papermill run calibrates in its kernel itself.
CALIBRATED = ("01_quickstart", "08_planner")
NOTEBOOKS = sorted(p.stem for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))


def _load(name: str) -> dict[str, Any]:
    return json.loads((NB_DIR / f"{name}.ipynb").read_text(encoding="utf-8"))


def test_all_eight_notebooks_exist_and_have_small_parameters() -> None:
    assert NOTEBOOKS == sorted(SMALL), \
        f"notebooks on disk {NOTEBOOKS} differ from those tested {sorted(SMALL)}"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_is_stored_clean(name: str) -> None:
    path = NB_DIR / f"{name}.ipynb"
    size = path.stat().st_size
    assert size < 100_000, f"{path.name} is {size} bytes; store it without outputs"
    nb = _load(name)
    codes = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in codes), f"{name} has outputs"
    tagged = [c for c in codes if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1 and codes.index(tagged[0]) == 0, \
        f"{name}: first code cell must be the parameters cell"
    # every small parameter the suite overrides is in the parameters cell (papermill would add it silently)
    source = "".join(tagged[0]["source"])
    for key in [*SMALL[name], *(["cluster_file"] if name in CALIBRATED else [])]:
        assert f"\n{key} =" in "\n" + source, f"{name}: parameter {key!r} is not in its parameters cell"
    solutions = [c for c in codes if "solution" in c["metadata"].get("tags", [])]
    assert all(c["metadata"]["jupyter"]["source_hidden"] for c in solutions)
    if name != "01_quickstart":
        assert solutions, f"{name} teaches, so it needs at least one exercise with a hidden solution"


@pytest.mark.slow
@pytest.mark.timeout(540)   # the session's calibration may fall in this test's set-up (300 s at most)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_runs_under_papermill(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      request: pytest.FixtureRequest) -> None:
    papermill = pytest.importorskip("papermill")
    parameters = dict(SMALL[name])
    if name in CALIBRATED and (name != "01_quickstart" or find_chromium() is not None):
        parameters["cluster_file"] = str(request.getfixturevalue("calibrated_cluster_file"))
    from nbclient.exceptions import CellTimeoutError
    # the kernel imports pipelab and reproductions.* from this checkout (as `make lab` sets it)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    t0 = time.perf_counter()
    out = tmp_path / f"{name}.out.ipynb"
    try:
        with HostLoadSampler() as load:
            papermill.execute_notebook(str(NB_DIR / f"{name}.ipynb"), str(out), parameters=parameters,
                                       kernel_name="python3", cwd=str(NB_DIR), progress_bar=False,
                                       execution_timeout=180)
    except CellTimeoutError as exc:      # a cell over 180 s: a busy machine skips, a quiet one fails
        holds_or_skip(False, load.result, f"{name}: a cell ran over 180 s ({exc})")
    except papermill.PapermillExecutionError as exc:
        tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(exc.traceback[-4:]))   # drop terminal colours
        pytest.fail(f"{name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n{tb}", pytrace=False)
    print(f"{name}: {time.perf_counter() - t0:.1f} s")
    executed = json.loads(out.read_text(encoding="utf-8"))
    errors = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors


def test_the_timing_benchmark_covers_every_notebook_and_refuses_unknown_names() -> None:
    """``reproductions/benchmarks/notebook_times.py`` times each notebook at its defaults (the 90 s
    claim): it picks every notebook tested here, by stem or prefix, and names an unknown one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "notebook_times", REPO / "reproductions" / "benchmarks" / "notebook_times.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert [p.stem for p in bench.notebooks()] == NOTEBOOKS
    assert [p.stem for p in bench.notebooks(["01", "08_planner"])] == ["01_quickstart", "08_planner"]
    with pytest.raises(SystemExit, match="no teaching notebook named \\['99'\\]"):
        bench.notebooks(["99"])
    assert bench.BOUND_S == 90.0
