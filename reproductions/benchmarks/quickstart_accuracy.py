"""The README quickstart's figure: the simulator's error against the measured rate, over fresh runs.

Runs the README's quickstart script (taken from README.md, as a user runs it) ``runs`` times, each a
fresh process that calibrates, simulates and trains, and prints each run's verdict line, then the
median and range of the runs' median errors, over all runs and over the runs whose verdict did not
say "busy" (their rounds agreed and other processes held at most ``pipelab.hostload.BUSY_SHARE`` of
the cores). It also prints the machine (cores, CPU model) and its load average before and after,
which is what README.md quotes beside the figure.

    OMP_NUM_THREADS=1 .venv/bin/python reproductions/benchmarks/quickstart_accuracy.py [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERDICT = re.compile(r"simulated vs measured: ([+-]\d+\.\d)% .*")


def readme_script() -> str:
    """The quickstart's script as README.md shows it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    quick = text[text.index("## Quickstart"):]
    start = quick.index("```python") + len("```python")
    return quick[start:quick.index("```", start)]


def cpu_model() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def spread(values: list[float]) -> str:
    """``median (min .. max) over n`` of percentages, or ``none`` for an empty list."""
    if not values:
        return "none"
    mid = statistics.median(values)
    return f"{mid:+.1f}% ({min(values):+.1f}% .. {max(values):+.1f}%) over {len(values)}"


def main(argv: list[str] | None = None) -> int:
    """Run the quickstart ``--runs`` times and print its error with the spread."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="fresh runs of the quickstart (each about a minute)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {cores} cores, {cpu_model()}; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    every, quiet = [], []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "quickstart.py"
        script.write_text(readme_script(), encoding="utf-8")
        for i in range(args.runs):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True,
                                  text=True, check=False)
            m = VERDICT.search(proc.stdout)
            if proc.returncode or not m:
                print(f"run {i + 1}: failed (exit {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            print(f"run {i + 1} ({time.perf_counter() - t0:.0f} s): {m.group(0)}")
            every.append(float(m.group(1)))
            if "busy" not in m.group(0):
                quiet.append(float(m.group(1)))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"median error, every run:           {spread(every)}")
    print(f"median error, runs not said busy:  {spread(quiet)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
