"""How fast a whole LLM job simulates and plans: 1T parameters on 3,072 A100s (no asserts).

Prints the median and range of seconds of ``simulate_llm`` for the SC'21 1T configuration (128 layers,
t=8, p=64, d=6, global batch 3,072) at several microbatch counts per pipeline and orders, and of one
``plan_llm`` over the whole search space. Issue 45's targets: one iteration under 5 s, a plan under 60 s.

Run: ``python reproductions/benchmarks/llm_job_speed.py [--runs N] [--no-plan]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from pipelab.llm.parallel import Parallel
from pipelab.llm.shape import Transformer
from pipelab.planner.llm import plan_llm
from pipelab.sim.llm import simulate_llm

MODEL = Transformer(name="gpt-1T", layers=128, hidden=25600, heads=160, seq=2048, vocab=51200)
CLUSTER = "dgx-a100:3072"
CASES = {
    "1f1b, 512 x 1 per pipeline": Parallel(tensor=8, pipeline=64, data=6, microbatch_size=1, microbatches=512,
                                           recompute="full", sequence_parallel=True),
    "1f1b, 128 x 4 per pipeline": Parallel(tensor=8, pipeline=64, data=6, microbatch_size=4, microbatches=128,
                                           recompute="full", sequence_parallel=True),
    "interleaved v=2, 128 x 4": Parallel(tensor=8, pipeline=64, data=6, microbatch_size=4, microbatches=128,
                                         virtual=2, schedule="interleaved", recompute="selective",
                                         sequence_parallel=True),
    "zb-h1, 128 x 4": Parallel(tensor=8, pipeline=64, data=6, microbatch_size=4, microbatches=128,
                               schedule="zb-h1", recompute="selective", sequence_parallel=True),
}


def _times(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-plan", action="store_true", help="skip the planner's timing")
    args = ap.parse_args()
    print(f"{'case':32s} {'actions':>8s} {'median s':>9s} {'min s':>7s} {'max s':>7s}  s/iteration")
    for name, par in CASES.items():
        res = simulate_llm(MODEL, CLUSTER, par)
        ts = _times(lambda par=par: simulate_llm(MODEL, CLUSTER, par), args.runs)
        print(f"{name:32s} {len(res.schedule):8d} {statistics.median(ts):9.2f} {min(ts):7.2f} {max(ts):7.2f}"
              f"  {res.time_per_iteration_s:.2f}")
    if not args.no_plan:
        t0 = time.perf_counter()
        table = plan_llm(MODEL, CLUSTER, 3072)
        print(f"plan_llm: {time.perf_counter() - t0:.1f} s for {table.considered} configurations "
              f"({len(table.simulated)} simulated); pick {table.best.parallel.describe()}")


if __name__ == "__main__":
    main()
