"""The README's quickstart, run as a user runs it, three times: what it prints is what the README says.

The script is taken from README.md (the first ``python`` block under "## Quickstart"), written to a
file and run with this interpreter. Each run prints the simulated rate's error against the measured one
in five rounds of the run. The README quotes a bound for a run whose rounds agree (the machine's speed
held still); a run whose rounds do not agree must say so instead of offering its error as the
simulator's. Slow: each run calibrates this machine (about a minute here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelab.metrics import BUSY_SPREAD

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"simulated vs measured: ([+-]\d+\.\d)% \(([+-]\d+\.\d)% \.\. ([+-]\d+\.\d)% over 5 "
                  r"rounds\)(; the measured rate moved (\d+\.\d+)x between rounds)?")


def readme_script() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    quick = text[text.index("## Quickstart"):]
    return quick[quick.index("```python") + len("```python"):quick.index("```", quick.index("```python") + 9)]


def quoted_bound() -> float:
    """The README's bound on the error of a run whose rounds agree, as a fraction."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"rounds agree.{0,120}?within ±(\d+)%", text, re.S)
    assert m, "the README quotes no bound for a run whose rounds agree"
    return int(m.group(1)) / 100


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_quickstart_three_times_prints_what_the_readme_quotes(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(readme_script(), encoding="utf-8")
    bound = quoted_bound()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    seen = []
    for _ in range(3):
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=280)
        assert proc.returncode == 0, proc.stderr[-3000:]
        m = LINE.search(proc.stdout)
        assert m, proc.stdout[-1500:]
        median, lo, hi = (float(m.group(i)) / 100 for i in (1, 2, 3))
        assert lo <= median <= hi
        moved = (1 + hi) / (1 + lo)                  # the rounds' rates, largest over smallest (rounded)
        if m.group(4) is not None:                   # a busy machine: said, with the rounds' spread
            assert moved > BUSY_SPREAD * 0.98, m.group(0)
        else:                                        # a quiet machine: the README's bound holds
            assert moved <= BUSY_SPREAD * 1.02, m.group(0)
            assert abs(median) <= bound, f"{m.group(0)}: outside the README's ±{bound:.0%}"
        assert "Warning" not in proc.stderr, proc.stderr[-1500:]
        assert (tmp_path / "gantt.html").is_file()
        seen.append(m.group(0))
    print("\n" + "\n".join(seen))
