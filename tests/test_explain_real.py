"""``explain`` on a measured run: a worker slowed by ``train(slowdown=...)`` on real gloo processes.

The model's first stage holds nearly all its compute (two wide linear layers; the second stage is one
narrow layer), so worker 0 is the pipeline's bottleneck throughout; slowed down 2x it doubles. The oracle is a
closed form over the run's own trace: replayed with worker 0's durations divided by ``factor``, the run
ends ``(1 - 1/factor) x`` worker 0's measured busy time earlier (it is on the critical path from its
first action to its last), and that is the straggler part of the other worker; worker 0's own
straggler part is that less the busy time the slowdown added to it.
"""

from __future__ import annotations

import pytest
import test_runtime_helpers as H
from torch import nn

import pipelab as pl
from pipelab.explain import PARTS
from pipelab.partition.plan import Plan


def heavy_first() -> nn.Sequential:
    """Six inputs to 3 classes; the first stage (``[0, 3)``) does nearly all the work."""
    return nn.Sequential(nn.Linear(6, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 3))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
def test_the_straggler_of_a_real_run_lands_on_the_other_worker_with_its_size(method: str) -> None:
    factor = 2.0
    run = pl.train(heavy_first, Plan.from_boundaries(5, [3]), method=method, data=H.long_data,
                   loss_fn=H.loss_fn, optimizer=H.sgd, steps=4, microbatches=4, backend="gloo",
                   progress=False, timeout=120, slowdown={0: factor})
    bd = pl.explain(run.trace, run.schedule, slowdown={0: factor})
    busy0 = float(bd.table.loc[0, "busy"])   # every action of worker 0 (F, B, U) was slowed
    added = (1 - 1 / factor) * busy0
    assert bd.table.loc[1, "straggler"] == pytest.approx(added, rel=0.25)
    assert bd.table.loc[0, "straggler"] == pytest.approx(0.0, abs=0.25 * added)
    assert bd.straggler_by_culprit[0] == pytest.approx(added, rel=0.25)
    # worker 1's own stalls (a shared machine's) are small beside the slowdown
    assert all(v < 0.25 * added for w, v in bd.straggler_by_culprit.items() if w != 0)
    # the parts of each worker add up to its measured idle time
    parts = bd.table[list(PARTS)].sum(axis=1)
    assert parts.tolist() == pytest.approx(bd.table["idle"].tolist(), abs=1e-9)
    # not told of the slowdown, the same trace reads as a slower stage, not a straggler
    blind = pl.explain(run.trace, run.schedule, slowdown={})
    assert blind.table.loc[1, "imbalance"] > 0.5 * added
