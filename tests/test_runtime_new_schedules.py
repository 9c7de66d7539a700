"""pipelab's own ZB-H2, ZB-V, DualPipe, DualPipeV and interleaved 1F1B with M not a multiple of P,
run for real on gloo processes: the weights equal plain single-process minibatch SGD (1e-6 of the
reference executor, 1e-5 of plain training, as tests/test_runtime_mp.py holds the older builders
to), and the runtime executes exactly the schedule's order."""

from __future__ import annotations

import pytest
import test_runtime_helpers as H

import pipelab as pl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PAIR_L = 14
STEPS = 3

CASES = [   # method, cuts of the Pair model's 14 layers, microbatches, options, workers
    ("zb-h2", [5, 9], 8, {}, 3),                        # 2P - 1 = 5 microbatches in flight
    ("zb-v", [3, 7, 10], 4, {}, 2),                     # 2 stages per worker in a V
    ("interleaved-1f1b", [2, 5, 7, 9, 12], 4, {"chunks": 2}, 3),   # M = 4 on 3 workers: one round of 4
    ("dualpipe", [7], 4, {}, 2),                        # each stage on both workers, gradients summed
    ("dualpipev", [3, 7, 10], 4, {}, 2),                # F&B pairs across the V
]


def _run(plan, method, backend, microbatches, **kw):
    return pl.train(H.pair, plan, method=method, data=H.pair_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                    steps=STEPS, microbatches=microbatches, backend=backend, progress=False, timeout=180,
                    **kw)


@pytest.mark.parametrize("method, cuts, M, opts, workers", CASES, ids=[c[0] for c in CASES])
def test_new_schedules_on_gloo_processes_equal_plain_sgd(method, cuts, M, opts, workers):
    plan = pl.Plan.from_boundaries(PAIR_L, cuts)
    res = _run(plan, method, "gloo", M, **opts)
    assert H.max_diff(res.state_dict(), H.reference_pair(H.sgd, STEPS)) < 1e-5
    local = _run(plan, method, "local", M, **opts)
    assert H.max_diff(res.state_dict(), local.state_dict()) < 1e-6
    assert res.trace.actions_by_worker() == {w: [str(a) for a in acts]
                                             for w, acts in enumerate(res.schedule.actions)}
    assert res.schedule.microbatches == M and res.schedule.num_workers == workers
