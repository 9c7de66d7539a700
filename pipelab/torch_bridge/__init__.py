"""Run a pipelab plan and synchronous schedule on torch.distributed.pipelining's engine.

:func:`to_torch` cuts this rank's stages out of the model (pipelab's fx split), wraps each in torch's
``PipelineStage`` and returns a torch schedule executing pipelab's per-worker order
(``docs/torch_bridge.md``). The private torch names used are pinned in :mod:`pipelab.schedules.torch_api`.
"""

from pipelab.torch_bridge.export import BridgeOptions, stage_modules, to_torch

__all__ = ["BridgeOptions", "stage_modules", "to_torch"]
