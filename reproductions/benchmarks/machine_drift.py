"""The noise floor of a speed figure on this machine: how much one fixed piece of compute drifts.

Two measurements of the same thing, no pipeline involved:

* *drift*: one process on one core times a fixed forward + backward (the held-out GRU of
  ``reproductions/sim_accuracy``, 8 samples) over and over for ``--seconds``; each window of
  ``--window`` seconds gives a median, and the spread of those medians is how far the machine's own
  speed moves while a benchmark runs;
* *pair*: the same compute alone on core 0, then on cores 0 and 1 at once (two processes, pinned as
  the runtime pins its workers), in alternating rounds: the ratio is what running two workers side by
  side costs each of them, the quantity ``Calibration.compute_slowdown`` stands for.

A simulated throughput cannot be shown closer to a measured one than these spreads allow.

    OMP_NUM_THREADS=1 .venv/bin/python reproductions/benchmarks/machine_drift.py [--seconds 30] [--rounds 5]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch.multiprocessing as mp  # noqa: E402

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "sim_accuracy"


def _step() -> Any:
    """A closure running one forward + backward of the held-out GRU on 8 samples."""
    import torch

    sys.path.insert(0, str(MODELS))
    import held_out_models as hm

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = hm.gru()
    x, y = hm.gru_data(8)[0]

    def step() -> None:
        hm.token_loss(model(x), y).backward()

    for _ in range(5):
        step()
    return step


def _timed(core: int, seconds: float, window: float, start: Any, queue: Any) -> None:
    """Time steps on ``core`` for ``seconds`` after ``start`` (a barrier or None); put window medians."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    step = _step()
    if start is not None:
        start.wait()
    medians, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        ts, w_end = [], time.perf_counter() + window
        while time.perf_counter() < w_end:
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        medians.append(statistics.median(ts))
    queue.put((core, medians))


def _run(cores: list[int], seconds: float, window: float) -> dict[int, list[float]]:
    """Window medians of each core's process, the processes started together."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Barrier(len(cores)) if len(cores) > 1 else None
    procs = [ctx.Process(target=_timed, args=(c, seconds, window, start, queue)) for c in cores]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=seconds + 120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _spread(xs: list[float]) -> str:
    m = statistics.median(xs)
    lo, hi = min(xs), max(xs)
    return f"median {m * 1e3:.2f} ms, range {lo * 1e3:.2f}-{hi * 1e3:.2f} ms ({(hi - lo) / m:.0%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the drift measurement")
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window of the drift measurement")
    ap.add_argument("--rounds", type=int, default=5, help="alternating alone/pair rounds")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0, 1]
    print(f"start: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {len(cores)} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    drift = _run(cores[:1], args.seconds, args.window)[cores[0]]
    print(f"drift, one process, {len(drift)} windows of {args.window:.0f} s: {_spread(drift)}")
    if len(cores) < 2:
        print("pair: needs two cores")
        return
    ratios = []
    for r in range(args.rounds):
        alone = statistics.median(_run(cores[:1], 3.0, 1.0)[cores[0]])
        both = _run(cores[:2], 3.0, 1.0)
        pair = statistics.mean(statistics.median(v) for v in both.values())
        ratios.append(pair / alone)
        print(f"round {r}: alone {alone * 1e3:.2f} ms, two at once {pair * 1e3:.2f} ms, "
              f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"pair / alone over {len(ratios)} rounds: median {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    print(f"end: load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
