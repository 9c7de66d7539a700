"""Versions held and peak weight memory per stage: measured by the runtime vs the cost model.

For the digits CNN over 4 stages, runs ``pipedream``, ``2bw``, ``buffered`` (K = 3) and ``gpipe`` with
the reference executor and prints, per stage, the weight versions the runtime held at most and the
peak bytes of weight storage it held (distinct storages: the master plus stashed versions), beside
``CostModel.memory_bytes(...)["weights"] + ["stashed_weights"]`` for the closed-form version count
(PipeDream P - s, 2BW 2, buffered K, GPipe 1).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python reproductions/weight_buffer/memory.py``
"""

from __future__ import annotations

import functools
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from pipelab.cluster import Cluster  # noqa: E402
from pipelab.costs import CostModel  # noqa: E402
from pipelab.partition.plan import Plan  # noqa: E402
from pipelab.profile.measure import profile  # noqa: E402
from pipelab.runtime import train  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402


def main() -> int:
    """Print the table."""
    torch.set_num_threads(1)
    P = 4
    plan = Plan.even(9, P)
    torch.manual_seed(0)
    x = next(iter(R.make_data(1)()))[0]
    cm = CostModel(profile(R.model_fn(), x, progress=False), Cluster.flat(P))
    opt = functools.partial(torch.optim.SGD, lr=0.02, momentum=0.9)
    closed = {"pipedream": lambda s: P - s, "2bw": lambda s: 2, "buffered": lambda s: 3, "gpipe": lambda s: 1}
    print(
        f"{'method':10s} {'stage':>5s} {'versions':>8s} {'closed':>6s} {'measured B':>11s} {'model B':>9s} "
        f"{'ratio':>6s}"
    )
    for method, kw in [
        ("pipedream", {}),
        ("2bw", {"microbatches": 4}),
        ("buffered", {"microbatches": 4, "versions": 3}),
        ("gpipe", {"microbatches": 4}),
    ]:
        r = train(
            R.model_fn,
            plan,
            method=method,
            data=R.make_data(1),
            loss_fn=R.loss_fn,
            optimizer=opt,
            steps=24,
            backend="local",
            progress=False,
            **kw,
        )
        for st in plan.stages:
            mem = cm.memory_bytes(st.start, st.end, versions=closed[method](st.index), in_flight=1)
            model = mem["weights"] + mem["stashed_weights"]
            got = r.weight_bytes[st.index]
            print(f"{method:10s} {st.index:5d} {r.versions_held[st.index]:8d} {closed[method](st.index):6d} "
                  f"{got:11d} {model:9d} {got / model:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
