"""Two calibrations in a row: does each figure of the second fall within the spread the first reports?

Prints, per figure, both values, their relative difference and the spread between rounds that the
first calibration recorded (``Calibration.spread``), and the time each calibration took.

    OMP_NUM_THREADS=1 .venv/bin/python reproductions/benchmarks/calibration_repeatability.py [repeats]

``repeats``: rounds of each measurement (``pl.calibrate(repeats=...)``; default: calibrate's own).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pipelab as pl

FIGURES = ("p2p_latency_s", "p2p_bandwidth", "allreduce_latency_s", "allreduce_bandwidth", "memory_bandwidth")


def main(repeats: int | None = None) -> None:
    """Calibrate twice and compare."""
    runs = []
    kw: dict[str, Any] = {} if repeats is None else {"repeats": repeats}
    for _ in range(2):
        t0 = time.perf_counter()
        runs.append((pl.calibrate(workers=2, progress=False, **kw).calibration, time.perf_counter() - t0))
    (a, ta), (b, tb) = runs
    assert a is not None and b is not None
    print(f"calibration took {ta:.1f} s and {tb:.1f} s")
    print(f"{'figure':28s} {'first':>12s} {'second':>12s} {'diff':>8s} {'spread':>8s}  within")
    rows = [(f, getattr(a, f), getattr(b, f), a.spread.get(f, 0.0)) for f in FIGURES]
    rows += [
        (
            f"overhead_s.{k}",
            a.overhead_s[k],
            b.overhead_s.get(k, float("nan")),
            a.spread.get(f"overhead_s.{k}", 0.0),
        )
        for k in sorted(a.overhead_s)
    ]
    rows += [
        (f"message_s.{k}", a.message_s[k], b.message_s.get(k, float("nan")),
         a.spread.get(f"message_s.{k}", 0.0))
        for k in sorted(a.message_s)
    ]
    rows += [
        (f"optimizer {k} per byte", a.optimizer_s[k][1], b.optimizer_s[k][1], 0.0) for k in a.optimizer_s
    ]
    # the host effects' scalar terms (Calibration.host_effects)
    rows += [
        (f"host_effects.{k}", getattr(a.host_effects, k), getattr(b.host_effects, k),
         a.spread.get(f"host_effects.{k}", 0.0))
        for k in ("busy_sender_s",)
    ]
    # the all-reduce's latency after the longer compute (Calibration.allreduce_after's last point)
    if a.allreduce_after and b.allreduce_after:
        rows.append(("allreduce_after, longer compute", a.allreduce_after[-1][1], b.allreduce_after[-1][1],
                     a.spread.get("allreduce_after.long", 0.0)))
    inside = 0
    for name, x, y, sp in rows:
        diff = abs(y - x) / x if x else 0.0
        ok = diff <= sp if sp else None
        inside += bool(ok)
        print(f"{name:28s} {x:12.4g} {y:12.4g} {diff:8.1%} {sp:8.1%}  {'-' if ok is None else ok}")
    print(f"{inside} of {sum(1 for r in rows if r[3])} figures with a spread are within it")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
