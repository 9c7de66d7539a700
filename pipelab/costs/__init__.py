"""The one cost model: compute, point-to-point transfers, all-reduce and memory of a layer range.

Partitioners and the simulator both ask it what things cost, so a plan's prediction and a simulated
run agree by construction. Times are seconds, sizes bytes; the assumptions are in docs/cost_model.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelab.costs.bound import SteadyState, SteadyStateBound
from pipelab.costs.memory import Memory
from pipelab.costs.prices import (
    ALLREDUCE_OVERLAP,
    CODEC_RATIOS,
    HBM_BYTES_PER_S,
    OPTIMIZER_STATE,
    Prices,
    compression_ratio_of,
)

__all__ = ["CODEC_RATIOS", "compression_ratio_of", "ALLREDUCE_OVERLAP", "HBM_BYTES_PER_S", "OPTIMIZER_STATE",
           "CostModel", "Prices", "SteadyState"]


@dataclass(frozen=True)
class CostModel(SteadyStateBound, Memory):
    """Costs of layer ranges of ``profile`` on ``cluster``: prices, the steady-state bound, memory."""
