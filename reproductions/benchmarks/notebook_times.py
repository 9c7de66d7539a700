"""Each teaching notebook run at its defaults under papermill: its wall time against the 90 s bound.

The project's standard is that every teaching notebook (``notebooks/NN_*.ipynb``) runs top to bottom
at its defaults in at most 90 s here. That is a speed claim, so it lives here and not in the test
suite: ``tests/test_notebooks.py`` runs each notebook with the smallest parameters that still execute
every cell. This script runs each one ``--rounds`` times exactly as a reader opens it (no parameter
overridden, cluster calibration included), in the notebooks' folder, each inside
``pipelab.hostload.HostLoadSampler`` (papermill through ``reproductions._common.report.run_notebook``,
as ``make reproduce`` runs its notebooks), and prints per notebook the median time, its range, the bound
and the share of the cores other processes held meanwhile.

    OMP_NUM_THREADS=1 .venv/bin/python reproductions/benchmarks/notebook_times.py [--rounds N] [NAME ...]

``NAME``: notebook stems (``01_quickstart``) or prefixes (``01``); default: every teaching notebook.
Exit status 1 if a notebook failed to run (a time over the bound is printed, not an error).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pipelab.hostload import HostLoadSampler

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # reproductions._common, run from a checkout
NB_DIR = REPO / "notebooks"
#: the most a teaching notebook may take at its defaults on the project's 2-core machine (seconds)
BOUND_S = 90.0


def notebooks(names: Sequence[str] = ()) -> list[Path]:
    """The teaching notebooks matching ``names`` (stems or prefixes; all of them when empty)."""
    found = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return found
    picked = [p for p in found if any(p.stem == n or p.stem.startswith(n) for n in names)]
    if unknown := [n for n in names if not any(p.stem == n or p.stem.startswith(n) for p in found)]:
        raise SystemExit(f"no teaching notebook named {unknown}; choose from {[p.stem for p in found]}")
    return picked


def run_once(path: Path, out_dir: Path) -> tuple[float, float]:
    """Run one notebook at its defaults; return (seconds, share of the cores other processes held)."""
    from reproductions._common.report import run_notebook

    with HostLoadSampler() as load:
        t0 = time.perf_counter()
        run_notebook(path, out_dir / path.name, {}, cwd=NB_DIR, timeout=180)   # a cell over 180 s: failed
        seconds = time.perf_counter() - t0
    return seconds, load.result.others_share


def main(argv: Sequence[str] | None = None) -> int:
    """Time every selected notebook at its defaults and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="notebook stems or prefixes (default: all)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each notebook, interleaved (default 3)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    paths = notebooks(args.names)
    times: dict[str, list[float]] = {q.stem: [] for q in paths}
    others: dict[str, list[float]] = {q.stem: [] for q in paths}
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for q in paths:
                if q.stem in failed:
                    continue
                try:
                    s, other = run_once(q, Path(tmp))
                except Exception as exc:   # noqa: BLE001 -- name the notebook and go on with the others
                    print(f"{q.stem}: FAILED ({type(exc).__name__}: {str(exc)[:300]})", file=sys.stderr)
                    failed.append(q.stem)
                    continue
                times[q.stem].append(s)
                others[q.stem].append(other)
                print(f"round {r + 1}: {q.stem} {s:.1f} s", flush=True)
    print(f"\n{'notebook':22s} {'median s':>9s} {'range s':>15s} {'bound s':>8s}  within  other load")
    for stem, ts in times.items():
        if not ts:
            print(f"{stem:22s} {'failed':>9s}")
            continue
        med = statistics.median(ts)
        print(f"{stem:22s} {med:9.1f} {min(ts):7.1f}-{max(ts):<7.1f} {BOUND_S:8.0f}  "
              f"{'yes' if med <= BOUND_S else 'NO':6s}  {statistics.median(others[stem]):.0%}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
