"""Transformer LLMs at cluster scale: a model by its shape, tensor x pipeline x data plans, their costs
and memory per device (docs/llm.md)."""

from pipelab.llm.analytic import transformer_profile
from pipelab.llm.collectives import all_gather_s, allreduce_s, p2p_s, reduce_scatter_s
from pipelab.llm.costs import ATTENTION, BlockCosts, LlmCosts, StageCosts, block_costs, stage_costs
from pipelab.llm.devices import DeviceRates, device_table
from pipelab.llm.memory import (
    KERNELS,
    RECIPES,
    MemoryBreakdown,
    Recipe,
    check_fits,
    in_flight,
    layer_activation_bytes,
    memory_per_device,
)
from pipelab.llm.parallel import RECOMPUTE, SCHEDULES, SHARDING, Parallel, ParallelError
from pipelab.llm.shape import PRESETS, Transformer

__all__ = ["ATTENTION", "BlockCosts", "DeviceRates", "KERNELS", "LlmCosts", "MemoryBreakdown", "PRESETS",
           "Parallel", "ParallelError", "RECIPES", "RECOMPUTE", "Recipe", "SCHEDULES", "SHARDING",
           "StageCosts",
           "Transformer", "all_gather_s", "allreduce_s", "block_costs", "check_fits", "device_table",
           "in_flight", "layer_activation_bytes", "memory_per_device", "p2p_s", "reduce_scatter_s",
           "stage_costs", "transformer_profile"]
