"""Run a pipelab plan and schedule on torch.distributed.pipelining's engine (synchronous methods).

:func:`to_torch` cuts this rank's stages out of the model by the plan's layer ranges (pipelab's own fx
split), wraps each in torch's ``PipelineStage`` and returns a torch schedule that executes pipelab's
per-worker order, to ``.step()`` in the caller's loop under torchrun (``docs/torch_bridge.md``).
Asynchronous methods and replicated stages are refused with what to use instead; the private torch
names used are pinned in :mod:`pipelab.schedules.torch_api`.
"""

from pipelab.torch_bridge.export import BridgeOptions, stage_modules, to_torch

__all__ = ["BridgeOptions", "stage_modules", "to_torch"]
