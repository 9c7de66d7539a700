"""Both engines agree: pipelab schedules exported with ``pl.torch_bridge.to_torch`` and run by torch's own
engine under torchrun (2 gloo processes, one thread each) train to pipelab's runtime's weights.

One torchrun launch (tests/torch_bridge_job.py) trains every case on torch's engine: 1F1B-flush and
GPipe (compared with ``pl.train(..., backend="gloo")`` on the same model, data and seed), ZB-H1 and
interleaved 1F1B (compared with plain single-process training), and torch's own ZB-V imported with
``pl.schedules.from_torch`` and handed back (V placement, split backward; compared with plain training).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import test_runtime_helpers as H
import torch

import pipelab as pl
from pipelab.schedules.torch_format import to_torch_order

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TESTS = Path(__file__).resolve().parent
STEPS = 5
CASES = {   # name -> (method, cuts, model)
    "flush": ("1f1b-flush", [7], "pair"),
    "gpipe": ("gpipe", [7], "pair"),
    "zbh1": ("zb-h1", [7], "pair"),
    "inter": ("interleaved-1f1b", [3, 7, 10], "pair"),
    "zbh2": ("zb-h2", [7], "pair"),
    "zbv-own": ("zb-v", [3, 7, 10], "pair"),        # pipelab's own ZB-V (not torch's order)
    "dpv-own": ("dualpipev", [3, 7, 10], "pair"),   # pipelab's own DualPipeV
    "zbv": ("torch-ZBVZeroBubble", [3, 7, 10], "pair"),
    "izb": ("torch-InterleavedZeroBubble", [3, 7, 10], "pair"),
    "dpv": ("torch-DualPipeV", [3, 7, 10], "pair"),
    "zbv-mlp": ("torch-ZBVZeroBubble", [1, 2, 4], "mlp"),
}


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory):
    """Run every case on torch's engine in one torchrun launch; return name -> (state, losses, orders)."""
    out = tmp_path_factory.mktemp("torch_bridge")
    cases = [f"{n}:{m}:{'-'.join(map(str, c))}:{model}" for n, (m, c, model) in CASES.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(TESTS / "torch_bridge_job.py"), str(out), str(STEPS), *cases]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:     # a hang: end torchrun and its workers (one process group)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"torchrun failed:\n{log[-6000:]}"
    runs = {}
    for name in CASES:
        state: dict[str, torch.Tensor] = {}
        losses: list[float] = []
        orders = {}
        for rank in range(2):
            d = torch.load(out / f"{name}-{rank}.pt")
            state.update(d["state"])
            losses += d["losses"]
            orders[rank] = d["order"]
        runs[name] = (state, losses, orders)
    return runs


def _pipelab(method: str, cuts: list[int]) -> pl.runtime.RunResult:
    plan = pl.Plan.from_boundaries(14, cuts)
    return pl.train(H.pair, plan, method=method, data=H.pair_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                    steps=STEPS, microbatches=4, backend="gloo", progress=False, timeout=120)


@pytest.mark.parametrize("name", ["flush", "gpipe"])
def test_torch_engine_running_pipelab_schedules_equals_pipelab_runtime(torch_runs, name):
    method, cuts, _ = CASES[name]
    state, losses, _ = torch_runs[name]
    ours = _pipelab(method, cuts)
    assert H.max_diff(state, ours.state_dict()) < 1e-5
    assert losses == pytest.approx(ours.losses, abs=1e-5)        # torch's per-microbatch losses, averaged
    assert H.max_diff(state, H.reference_pair(H.sgd, STEPS)) < 1e-5


@pytest.mark.parametrize("name", ["zbh1", "inter", "zbh2", "zbv-own", "dpv-own"])
def test_split_backward_and_interleaving_on_torchs_engine_equal_plain_training(torch_runs, name):
    state, _, _ = torch_runs[name]
    assert H.max_diff(state, H.reference_pair(H.sgd, STEPS)) < 1e-5


@pytest.mark.parametrize("name", ["zbv", "izb", "dpv"])
def test_torchs_own_schedules_imported_and_run_by_torch_via_the_bridge_equal_plain_training(torch_runs, name):
    """V placement (ZB-V, DualPipeV: stages 1 and 2 on one rank, handed over in memory) and split backward
    on the Pair model, whose second input crosses stage 0 untouched into stage 1's CNN: torch 2.14.1's
    split backward gets that stage's weights wrong unless the bridge hands the input on with a gradient
    (``_PassThroughGrad``; torch's own ZBV/InterleavedZeroBubble on these stages end 0.04 off)."""
    state, _, orders = torch_runs[name]
    assert H.max_diff(state, H.reference_pair(H.sgd, STEPS)) < 1e-5
    assert any("I" in a for a in orders[0]) and any("W" in a for a in orders[0])


def test_a_v_schedule_on_a_plain_chain_equals_plain_training(torch_runs):
    state, _, _ = torch_runs["zbv-mlp"]
    assert H.max_diff(state, H.reference_training(H.mlp, H.mlp_data, H.sgd, STEPS)) < 1e-5


@pytest.mark.parametrize("name", ["flush", "gpipe", "zbh1", "inter", "zbh2", "zbv-own", "dpv-own"])
def test_torchs_runtime_executes_exactly_pipelabs_order(torch_runs, name):
    """The compute actions torch's runtime iterated over (its lowered order, sends and receives aside)."""
    method, cuts, _ = CASES[name]
    plan = pl.Plan.from_boundaries(14, cuts)
    opts = {"chunks": 2} if method == "interleaved-1f1b" else {}
    expect = to_torch_order(pl.schedules.build(method, plan, microbatches=4, minibatches=1, **opts))
    assert torch_runs[name][2] == expect
