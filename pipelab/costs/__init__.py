"""The one cost model: compute, point-to-point transfers, all-reduce and memory of a layer range.

Partitioners and the simulator both ask this module what things cost, so a plan's prediction and
a simulated run agree by construction. All times are seconds, sizes bytes.

Assumptions (stated once, used everywhere):

* Compute of layers ``[a, b)`` on worker ``w`` is the profiled time divided by ``cluster.speed(w)``;
  a microbatch of ``minibatch / M`` samples takes ``fixed + (t - fixed) / M`` of the minibatch's
  time ``t``, where ``fixed`` is the layers' ``fwd_fixed_s``/``bwd_fixed_s``: the per-call part
  that a smaller batch still pays (measured by ``pl.profile(..., small_batch=...)``; zero, i.e.
  linear in batch size, for profiles without it such as PipeDream's, which holds well once a GPU is
  saturated).
* A transfer of ``n`` bytes from ``a`` to ``b`` takes ``latency + n / compression_ratio / bandwidth``
  of the link it crosses (:meth:`Cluster.link`). Links are full duplex: activations going forward and
  gradients going back use opposite directions and do not slow each other.
* All-reduce of ``n`` bytes over a set of workers is a hierarchical ring (reduce-scatter inside the
  innermost blocks, all-reduce across the next level, all-gather back): at each level with ``p``
  participating sub-blocks it costs ``2 (p - 1) / p * n / bandwidth + 2 (p - 1) * latency``
  (Patarasuk & Yuan's bandwidth-optimal ring), summed over levels. Where a sub-block has several
  uplinks (``Level.uplinks``) the participating GPUs of that sub-block drive them in parallel.
  Gradients are not compressed (compression applies to activations/gradients across cuts only).
* Gradient all-reduce of a replicated stage, ``allreduce_overlap`` (:data:`ALLREDUCE_OVERLAP`):

  - ``"ddp"`` (default): it overlaps the backward pass the way PyTorch DDP does: layer ``l``'s
    gradient can be reduced as soon as its backward finishes, one reduction at a time, in backward
    order. The finish time of one replica's minibatch is then
    ``F + max_l [B(l..end) + kappa * P(start..l)]``: all of the all-reduce hides behind backward
    except what cannot start before the last (earliest) layers' gradients exist;
  - ``"none"``: one all-reduce of all the stage's gradients after the minibatch's backward is
    complete, ``F + B + kappa * P(start..end) + fixed``. This is what pipelab's own runtime does
    (its ``U`` action flattens every gradient and all-reduces them in one call), so a model of a
    pipelab run uses it (:func:`reproductions.pipedream_table1.measure.measure_row`).

  Both in :meth:`CostModel.replica_time_s` (and its matrix form) and in the simulator.
* ``allreduce_bandwidth`` (bytes/s, default None: each level's ``bandwidth``) is what one link
  carries inside the ring all-reduce when that differs from a point-to-point transfer: on one
  CPU, gloo's loopback "links" are memory copies by the same cores, and an all-reduce, where every
  process sends and receives at once and also sums, moves data slower than a ping-pong (measure
  mode measures both, :func:`reproductions.pipedream_table1.measure.gloo_loopback`). It replaces the bandwidth
  of every level in the ring formula above (meant for flat clusters).
* Ports (:meth:`CostModel.ports`): a transfer crossing level ``k`` occupies the sender's egress and
  the receiver's ingress port at that level, owned by their level-``k-1`` blocks (a GPU's PCIe/NVLink
  port inside a server, the server's NIC across servers; ``Level.uplinks`` links per port). Transfers
  sharing a port take turns, so in steady state a port's busy seconds per minibatch bound the time
  per minibatch (:meth:`CostModel.steady_state`): a middle stage's port carries its forward cut's
  activations *and* its backward cut's gradients, and a server's NIC carries every cross-server
  transfer of every stage on it, under round-robin between replica sets.
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

__all__ = [
    "CODEC_RATIOS",
    "compression_ratio_of",
    "ALLREDUCE_OVERLAP",
    "HBM_BYTES_PER_S",
    "OPTIMIZER_STATE",
    "CostModel",
    "Prices",
    "SteadyState",
]


@dataclass(frozen=True)
class CostModel(SteadyStateBound, Memory):
    """Costs of layer ranges of ``profile`` on ``cluster`` (see the module docstring).

    Primitive prices come from :class:`~pipelab.costs.prices.Prices`, the steady-state bound from
    :class:`~pipelab.costs.bound.SteadyStateBound`, memory from :class:`~pipelab.costs.memory.Memory`.
    """
