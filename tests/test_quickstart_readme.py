"""The README's quickstart, run as a user runs it: it runs, and prints its verdict in the README's format.

The script is taken from README.md (the first ``python`` block under "## Quickstart"), written to a
file and run once with this interpreter. What is checked is behaviour, never this machine's speed:
the run ends cleanly, prints ``simulated vs measured: ...`` in the format the README quotes, the
median lies inside the printed range, a "busy" note appears exactly when the printed rounds disagree
by over :data:`pipelab.metrics.BUSY_SPREAD` or the machine's load note says other processes held the
cores, and it writes the Gantt chart. Its one call of ``pl.calibrate`` is replaced by loading the
session's calibration of this machine (``calibration_run`` in conftest.py, made by ``pipelab calibrate``
with the same workers and checked by ``tests/test_calibrate.py``): the same cluster, without measuring
the machine a second time. The simulator's accuracy on this machine (the README's figure)
is a benchmark, ``reproductions/benchmarks/quickstart_accuracy.py``, which prints it with its spread;
the verdict logic itself is tested on synthetic rounds in ``tests/test_hostload.py``. Slow: the run
trains for real in two processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from timing import holds_or_skip

from pipelab.hostload import HostLoadSampler
from pipelab.metrics import BUSY_SPREAD

REPO = Path(__file__).resolve().parents[1]
#: the README script's calibration, which the suite's run replaces by the session's calibrated cluster
CALIBRATE = "pl.calibrate(workers=2, progress=False)"
#: the verdict line; group 4: a busy machine; 5: the rounds disagreed (6: by how much); 7: other
#: processes held the cores (8: their share, 9: of how many cores)
LINE = re.compile(r"simulated vs measured: ([+-]\d+\.\d)% \(([+-]\d+\.\d)% \.\. ([+-]\d+\.\d)% over 5 "
                  r"rounds\)(; (the measured rate moved (\d+\.\d+)x between rounds, so )?the machine was busy"
                  r"(: other processes took (\d+)% of the (\d+) cores' time)?)?")


def readme_script() -> str:
    """The quickstart's script as the README shows it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    quick = text[text.index("## Quickstart"):]
    return quick[quick.index("```python") + len("```python"):quick.index("```", quick.index("```python") + 9)]


def test_the_readme_quotes_the_benchmark_with_date_machine_and_load() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## What the quickstart prints"):]
    section = section[:section.index("\n## ")]
    assert "reproductions/benchmarks/quickstart_accuracy.py" in section
    assert re.search(r"20\d\d-\d\d-\d\d", section), "the quoted figures carry no date"
    assert re.search(r"\d+ cores?", section) and "load" in section, "no machine or load beside the figures"


def test_the_readme_script_samples_the_load_for_its_verdict() -> None:
    script = readme_script()
    assert "HostLoadSampler" in script and "load=load.result" in script


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_readme_quickstart_prints_its_verdict_in_the_readme_format(tmp_path: Path,
                                                                  calibrated_cluster_file: Path) -> None:
    script = tmp_path / "quickstart.py"
    text = readme_script()
    assert text.count(CALIBRATE) == 1, f"the README's quickstart no longer calls {CALIBRATE} once"
    script.write_text(text.replace(CALIBRATE, f"pl.Cluster.load({str(calibrated_cluster_file)!r})"),
                      encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with HostLoadSampler() as load:
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=380)
        except subprocess.TimeoutExpired:
            proc = None
    holds_or_skip(proc is not None, load.result, "the quickstart did not end within 380 s")
    assert proc is not None and proc.returncode == 0, proc.stderr[-3000:] if proc else ""
    m = LINE.search(proc.stdout)
    assert m, proc.stdout[-1500:]
    median, lo, hi = (float(m.group(i)) / 100 for i in (1, 2, 3))
    assert lo <= median <= hi
    moved = (1 + hi) / (1 + lo)                      # the rounds' rates, largest over smallest (rounded)
    if m.group(5) is not None:                       # the rounds disagreed: said, with their spread
        assert moved > BUSY_SPREAD * 0.98, m.group(0)
    else:
        assert moved <= BUSY_SPREAD * 1.02, m.group(0)
    if m.group(4) is not None:                       # busy: the rounds or the load say why
        assert m.group(5) is not None or m.group(7) is not None, m.group(0)
    if m.group(7) is not None:                       # a steady load: said, with its share
        assert int(m.group(8)) > 0 and int(m.group(9)) >= 1, m.group(0)
    assert "Warning" not in proc.stderr, proc.stderr[-1500:]
    assert (tmp_path / "gantt.html").is_file()
    print("\n" + m.group(0))
