"""A tensor-parallel stage's measured action times against their prediction from pipelab's cost model.

One stage of a GPT (``_tp_gpt.py``: 2 blocks, width 256, 8 heads, vocabulary 512, 64 tokens, 8 per
microbatch) runs with GPipe on one gloo process (tensor degree 1) and on two (degree 2). The
prediction of a degree-2 ``F`` (``B``) is half the measured degree-1 time plus the group's collectives
priced with the cost model's ring all-reduce (``CostModel.allreduce_coeffs`` on this machine's
``pl.calibrate(workers=2)``): per block two all-reduces of one ``[8, 64, 256]`` fp32 activation
forward (Megatron's *g* after each row-parallel layer) and two backward (*f* before each
column-parallel layer), the embedding's *g* forward, the head's *f* backward and its logits'
all-gather forward (half an all-reduce of the whole ``[8, 64, 512]`` logits). It prints, per action
kind, the median measured times (range over rounds) and the prediction. ``pl.simulate`` now prices a
stage's tensor degree itself from the profile's recorded split: ``tp_simulate_vs_measured.py``
compares whole runs with it. Run:

    python reproductions/benchmarks/tensor_parallel_costs.py [--rounds 3] [--steps 6]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tp_gpt as G  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.costs import CostModel  # noqa: E402

M = 2   # microbatches


def _plan(tensor: int) -> pl.Plan:
    from pipelab.graph import layer_nodes, trace

    plan = pl.Plan.from_boundaries(len(layer_nodes(trace(G.gpt()))), [])
    return dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], tensor=tensor),))


def _times(tensor: int, steps: int) -> dict[str, float]:
    res = pl.train(G.gpt, _plan(tensor), method="gpipe", data=G.data, loss_fn=G.loss_fn, optimizer=G.sgd,
                   steps=steps, microbatches=M, progress=False, timeout=600)
    out = {}
    for kind in ("F", "B"):
        ds = [e.end_s - e.start_s for e in res.trace.events if e.kind == kind and e.microbatch >= M]
        out[kind] = statistics.median(ds)
    return out


def coefficients(cluster: pl.Cluster) -> tuple[float, float]:
    """The cost model's ``(seconds per byte, fixed seconds)`` of a ring all-reduce over 2 workers. No
    compute time is passed: a tensor group's members reach each collective together (they run the same
    actions), unlike data-parallel replicas, whose after-compute latency the calibration also fits."""
    profile = pl.profile(G.gpt(), next(G.data())[0][: G.BATCH // M], progress=False)
    return CostModel(profile, cluster).allreduce_coeffs([0, 1])


def predicted_comm(per_byte: float, fixed: float) -> dict[str, float]:
    """Seconds of the degree-2 group's collectives in one F and one B."""
    act = (G.BATCH // M) * G.SEQ * G.EMBD * 4
    logits = (G.BATCH // M) * G.SEQ * G.VOCAB * 4

    def ar(n: float) -> float:
        return fixed + per_byte * n
    fwd = (2 * G.LAYERS + 1) * ar(act) + ar(logits) / 2
    bwd = (2 * G.LAYERS + 1) * ar(act)
    return {"F": fwd, "B": bwd}


def main() -> None:
    """Measure, predict, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    cluster = pl.calibrate(workers=2, progress=False)
    one: dict[str, list[float]] = {"F": [], "B": []}
    two: dict[str, list[float]] = {"F": [], "B": []}
    for _ in range(a.rounds):
        for t, store in ((1, one), (2, two)):
            for k, v in _times(t, a.steps).items():
                store[k].append(v)
    per_byte, fixed = coefficients(cluster)
    print(f"ring all-reduce over 2 workers (cost model, calibrated here): {fixed * 1e6:.0f} us + "
          f"{1 / per_byte / 1e9:.2f} GB/s")
    print(f"{'kind':>4} {'degree 1 ms':>20} {'degree 2 ms':>20} {'predicted ms':>13} {'comm ms':>8} "
          f"{'measured/predicted':>19}")
    for k in ("F", "B"):
        t1 = statistics.median(one[k])
        comm = predicted_comm(per_byte, fixed)[k]
        pred = t1 / 2 + comm
        t2 = statistics.median(two[k])
        print(f"{k:>4} {t1 * 1e3:>8.2f} ({min(one[k]) * 1e3:.2f}-{max(one[k]) * 1e3:.2f}) "
              f"{t2 * 1e3:>8.2f} ({min(two[k]) * 1e3:.2f}-{max(two[k]) * 1e3:.2f}) {pred * 1e3:>13.2f} "
              f"{comm * 1e3:>8.2f} {t2 / pred:>19.2f}")


if __name__ == "__main__":
    main()
