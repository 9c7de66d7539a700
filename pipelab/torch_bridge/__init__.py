"""Run a pipelab plan and schedule on torch.distributed.pipelining's engine.

pipelab's own runtime (``pl.train``) runs every method, asynchronous ones included, with live Gantt
charts and exact resume. People who train at scale compose pipeline parallelism with FSDP and tensor
parallelism under torch's engine (e.g. torchtitan); :func:`to_torch` takes what was planned and
seen in pipelab there: it cuts this rank's stages out of the model by the plan's layer ranges (the
same fx split pipelab's runtime uses, :func:`pipelab.graph.build_stage`), wraps each in torch's
``PipelineStage`` and returns a torch schedule object that executes exactly pipelab's per-worker
order (:func:`pipelab.schedules.to_torch_order`), to ``.step()`` in the caller's own loop under
torchrun, with torch's own process groups::

    dist.init_process_group("gloo")                    # torchrun set RANK, WORLD_SIZE, ...
    torch.manual_seed(0); model = make_model()         # the same weights on every rank
    pipe = pl.torch_bridge.to_torch(plan, schedule, model, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        pipe.step(x, target=y)                         # torch's engine runs pipelab's order
        opt.step()

Synchronous methods only (``gpipe``, ``1f1b-flush``, ``interleaved-1f1b``, ``zb-h1``, and schedules
imported from torch with :func:`pipelab.schedules.from_torch`); asynchronous methods and replicated
stages are refused with the reason and what to use instead. The private torch names used are pinned
in :mod:`pipelab.schedules.torch_api`.
"""

from pipelab.torch_bridge.export import stage_modules, to_torch

__all__ = ["stage_modules", "to_torch"]
