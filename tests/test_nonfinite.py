"""Non-finite values stop a run (pipelab.runtime.guards): a NaN loss names its step, stage and action;
"warn" goes on, "skip" drops the update as a loss scaler does (oracle: plain training without that
update); a non-finite checkpoint is never sealed, so rotation keeps the last finite ones; the losses
written are valid JSON, with null for a non-finite value."""

from __future__ import annotations

import json
import time
from pathlib import Path

import fault_helpers as F
import pytest
import test_runtime_helpers as H
import torch
from timing import holds_or_skip

import pipelab as pl
from pipelab.hostload import HostLoadSampler
from pipelab.runtime import WorkerError
from pipelab.runtime import checkpoint_files as ck
from pipelab.runtime.guards import NonFiniteError, json_losses

PLAN = pl.Plan.from_boundaries(5, [2])


def _train(backend: str = "local", steps: int = 6, **kw):
    opts = {"data": F.inf_data, "optimizer": H.sgd, **kw}
    return pl.train(H.mlp, PLAN, method="1f1b-flush", loss_fn=H.loss_fn, steps=steps, microbatches=2,
                    backend=backend, progress=False, timeout=60, **opts)


def test_a_nan_loss_raises_naming_step_stage_and_action() -> None:
    with pytest.raises(NonFiniteError, match=r"^loss is nan at step 3 \(stage 1, action 1F6\)$"):
        _train()


def test_a_huge_learning_rate_is_stopped() -> None:
    with pytest.raises(NonFiniteError, match=r"(loss|gradient) is (nan|inf|-inf) at step \d+ \(stage \d"):
        _train(data=H.mlp_data, optimizer=F.huge_lr, steps=12)


def test_skip_drops_the_update_as_a_loss_scaler_does() -> None:
    with pytest.warns(RuntimeWarning, match="update is skipped"):
        r = _train(on_nonfinite="skip")
    assert H.max_diff(r.state_dict(), F.reference_skipping(6, {F.NAN_STEP})) < 1e-5
    assert all(torch.isfinite(v).all() for v in r.state_dict().values())
    # the test can fail: the same training with the NaN step's update kept is NaN
    assert not all(torch.isfinite(v).all() for v in F.reference_skipping(6, set()).values())


def test_warn_goes_on_but_never_seals_a_nonfinite_checkpoint(tmp_path: Path) -> None:
    from pipelab.runtime.torchrun import save_outputs

    with pytest.warns(RuntimeWarning, match="loss is nan at step 3"):
        r = _train(on_nonfinite="warn", checkpoint_every=1, checkpoint_dir=tmp_path / "ck", checkpoint_keep=2)
    # steps 1-3 were finite; from step 4 on the weights are NaN: never sealed, and rotation kept 2 and 3
    assert [p.name for p in ck.list_checkpoints(tmp_path / "ck")] == ["step-00000002", "step-00000003"]
    save_outputs(tmp_path / "out", r)
    text = (tmp_path / "out" / "losses.json").read_text()

    def strict(token: str) -> None:
        raise ValueError(f"not JSON: {token}")
    doc = json.loads(text, parse_constant=strict)
    assert doc["losses"][:3] == pytest.approx(r.losses[:3]) and doc["losses"][3] is None
    assert doc["nonfinite_steps"] == [3, 4, 5]
    assert json_losses([1.0, float("inf")]) == ([1.0, None], [1])


def test_a_bad_on_nonfinite_is_refused() -> None:
    with pytest.raises(ValueError, match="on_nonfinite='ignore'; use one of"):
        _train(on_nonfinite="ignore")


@pytest.mark.slow
def test_a_nan_loss_ends_a_process_run_with_a_worker_error() -> None:
    t0 = time.perf_counter()
    with HostLoadSampler() as load, pytest.raises(WorkerError) as info:
        _train(backend="gloo")
    surfaced = time.perf_counter() - t0
    e = info.value
    assert (e.rank, e.stage, e.action) == (1, 1, "1F6"), str(e)
    assert str(e).startswith("worker 1 (stage 1, action 1F6) failed: "
                             "pipelab.runtime.guards.NonFiniteError: loss is nan at step 3"), str(e)
    holds_or_skip(surfaced < 30, load.result, f"the NaN surfaced after {surfaced:.1f} s, over 30 s")
