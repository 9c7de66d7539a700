"""Transports: how a pipeline transfer and an all-reduce move bytes at each level of a cluster.

:meth:`pipelab.cluster.Cluster.with_transport` applies them; everything downstream reads only
``Level.transfer_bandwidth`` and ``Level.ring_bandwidth``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

#: pipeline transports: ``"link"`` (the raw link: NCCL point-to-point, CUDA IPC) or ``"gloo-host"``
#: (device -> host copy, gloo over TCP, host -> device copy, one after another)
PIPELINE_TRANSPORTS = ("link", "gloo-host")
#: all-reduce transports: ``"link"`` (a ring at each level's link bandwidth), ``"nccl-ring"`` (NCCL's
#: bus bandwidth over TCP on Ethernet levels) or ``"gloo-ring"`` (gloo's ring on the host, each link at
#: the slower of the level's path and :data:`GLOO_ALLREDUCE_BUS_BANDWIDTH`)
ALLREDUCE_TRANSPORTS = ("link", "nccl-ring", "gloo-ring")
#: bytes/s of one host<->device or host copy on the gloo path (PCIe 3 x16; loopback assumed the same)
HOST_COPY_BYTES_PER_S = 10 * 1e9
#: NCCL all-reduce bus bandwidth over TCP (bytes/s) by Ethernet level: 25 Gbps 1.7 GB/s (nccl-tests'
#: all_reduce_perf, NVIDIA/nccl-tests#83); 10 Gbps at 60% of wire speed, NCCL 2.4's ceiling over TCP
#: (NVIDIA/nccl#209)
NCCL_TCP_BUS_BANDWIDTH: dict[str, float] = {"ethernet-10g": 0.6 * 10 * 1e9 / 8, "ethernet-25g": 1.7e9}
#: gloo's host all-reduce bus bandwidth (bytes/s), ``2 (n - 1) / n * S / t``: its chunked ring reduced
#: 20 MB over 4 machines on 40 GbE in 10,608 us (gloo's README, "Example output"). PyTorch's gloo group
#: copies a CUDA tensor to the host once and back once, overlapped across DDP buckets.
GLOO_ALLREDUCE_BUS_BANDWIDTH = 2 * 3 / 4 * 20e6 / 10_608e-6


def nccl_flat_ring(levels: Sequence[Any]) -> tuple[Any, ...]:
    """``levels`` as the one flat ring NCCL builds through every worker (NVIDIA/nccl#471: no 2-D rings),
    at the slowest crossed level's bus bandwidth and latency. For an all-reduce over every worker only
    (a data-parallel baseline): a pipeline priced on this level would lose the topology."""
    crossed = [lv for lv in levels if lv.size > 1] or list(levels[:1])
    n = math.prod(int(lv.size) for lv in levels)
    slowest = min(crossed, key=lambda lv: lv.ring_bandwidth)
    return (replace(slowest, name=f"nccl-flat-ring({slowest.name})", size=n, uplinks=1,
                    latency=max(float(lv.latency) for lv in crossed),
                    allreduce_bandwidth=float(slowest.ring_bandwidth)),)


def transport_levels(levels: Sequence[Any], pipeline: str = "link", allreduce: str = "link", *,
                     host_copy_bandwidth: float = HOST_COPY_BYTES_PER_S,
                     allreduce_bus_bandwidth: dict[str, float] | None = None,
                     gloo_allreduce_bandwidth: float = GLOO_ALLREDUCE_BUS_BANDWIDTH) -> tuple[Any, ...]:
    """``levels`` (innermost first) with ``p2p_bandwidth`` and ``allreduce_bandwidth`` set for the
    transports."""
    if pipeline not in PIPELINE_TRANSPORTS:
        raise ValueError(f"pipeline={pipeline!r} is not one of {PIPELINE_TRANSPORTS}")
    if allreduce not in ALLREDUCE_TRANSPORTS:
        raise ValueError(f"allreduce={allreduce!r} is not one of {ALLREDUCE_TRANSPORTS}")
    for label, v in (("host_copy_bandwidth", host_copy_bandwidth),
                     ("gloo_allreduce_bandwidth", gloo_allreduce_bandwidth)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{label}={v!r} must be a finite number of bytes/s > 0")
    bus = NCCL_TCP_BUS_BANDWIDTH if allreduce_bus_bandwidth is None else dict(allreduce_bus_bandwidth)
    multi_gpu_servers = len(levels) > 1
    out: list[Any] = []
    for k, lv in enumerate(levels):
        changes: dict[str, Any] = {}
        net = host_copy_bandwidth if (k == 0 and multi_gpu_servers) else lv.bandwidth
        if pipeline == "gloo-host":    # device -> host, the link, host -> device, one after another
            changes["p2p_bandwidth"] = 1.0 / (2.0 / host_copy_bandwidth + 1.0 / net)
        if allreduce == "nccl-ring" and lv.name in bus:
            changes["allreduce_bandwidth"] = float(bus[lv.name])
        elif allreduce == "gloo-ring":
            changes["allreduce_bandwidth"] = min(net, float(gloo_allreduce_bandwidth))
        out.append(replace(lv, **changes))
    return tuple(out)
