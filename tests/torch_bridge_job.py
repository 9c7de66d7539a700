"""A torchrun program for tests/test_torch_bridge_mp.py: train pipelab-exported schedules on torch's engine.

    torchrun --standalone --nproc-per-node 2 tests/torch_bridge_job.py OUT_DIR STEPS CASE [CASE ...]

Each case is ``name:method:cuts:model`` (``cuts`` joined by ``-``; ``method`` is a pipelab method, or
``torch-<Name>`` for torch's own schedule class imported with :func:`pipelab.schedules.from_torch`).
For every case, every rank builds the model (``pair`` or ``mlp`` of tests/test_runtime_helpers.py)
under seed 0, exports it with ``pl.torch_bridge.to_torch`` and trains
``STEPS`` minibatches of the test data on torch's engine; it writes its weights and (on the last
stage's rank) the per-minibatch mean loss, and the compute actions torch's runtime executed, to
``OUT_DIR/<name>-<rank>.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_runtime_helpers as H  # noqa: E402

import pipelab as pl  # noqa: E402

MICRO = 4
#: model name -> (model_fn, data_fn, layers)
MODELS = {"pair": (H.pair, H.pair_data, 14), "mlp": (H.mlp, H.mlp_data, 5)}


def schedule_for(method: str, plan: pl.Plan, workers: int) -> pl.Schedule:
    """The pipelab schedule a case exports: built by pipelab, or torch's ZB-V imported."""
    if method.startswith("torch-"):
        return pl.schedules.from_torch(method.removeprefix("torch-"), workers=workers, microbatches=MICRO)
    opts = {"chunks": plan.num_stages // workers} if method == "interleaved-1f1b" else {}
    return pl.schedules.build(method, plan, microbatches=MICRO, minibatches=1, **opts)


def main() -> None:
    """Run every case given on the command line (see the module doc)."""
    out, steps, cases = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    for case in cases:
        name, method, cuts, model_name = case.split(":")
        model_fn, data_fn, n_layers = MODELS[model_name]
        plan = pl.Plan.from_boundaries(n_layers, [int(c) for c in cuts.split("-")])
        sched = schedule_for(method, plan, size)
        torch.manual_seed(0)
        model = model_fn()
        pipe = pl.torch_bridge.to_torch(plan, sched, model, loss_fn=H.loss_fn)
        opt = H.sgd(list(pipe.parameters()))
        losses_per_step = []
        data = iter(data_fn())
        for _ in range(steps):
            x, y = next(data)
            losses: list[torch.Tensor] = []
            opt.zero_grad()
            pipe.step(*(x if isinstance(x, tuple) else (x,)), target=y, losses=losses)
            opt.step()
            if losses:
                losses_per_step.append(float(torch.stack(losses).detach().mean()))
        torch.save({"state": pipe.local_state_dict(), "losses": losses_per_step,
                    "order": [str(a) for a in pipe.pipeline_order_with_comms[rank] if a.is_compute_op]},
                   out / f"{name}-{rank}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
