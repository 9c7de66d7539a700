"""Transports: how a pipeline transfer and an all-reduce move bytes at each level of a cluster.

:meth:`pipelab.cluster.Cluster.with_transport` applies them; the cost model, the partitioners and
the simulator then read only ``Level.transfer_bandwidth`` and ``Level.ring_bandwidth``. Sources of
the figures are given beside each constant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

#: pipeline transports (:meth:`Cluster.with_transport`): ``"link"`` sends over the raw link (NCCL
#: point-to-point, CUDA IPC); ``"gloo-host"`` is PipeDream's runtime with ``distributed_backend: gloo``:
#: the sender copies the tensor to host memory, gloo moves it over TCP (the cluster's Ethernet across
#: servers, the host's loopback inside one), the receiver copies it back to its GPU, one after another
PIPELINE_TRANSPORTS = ("link", "gloo-host")
#: all-reduce transports: ``"link"`` (the ring at each level's link bandwidth), ``"nccl-ring"``
#: (NCCL's ring at the bus bandwidth NCCL achieves over TCP on the Ethernet levels; PipeDream's
#: data-parallel runs, ``distributed_backend: nccl``) or ``"gloo-ring"`` (gloo's ring on the host,
#: each link at the slower of the level's path and gloo's host-side rate,
#: :data:`GLOO_ALLREDUCE_BUS_BANDWIDTH`; PipeDream's replicated stages, whose
#: DistributedDataParallel groups take the runs' default backend, gloo)
ALLREDUCE_TRANSPORTS = ("link", "nccl-ring", "gloo-ring")
#: bytes/s of one host<->device or host memory copy on the gloo path: PCIe 3 x16 at the 10 GB/s that
#: cluster A's PCIe level uses (the issue's figure); the loopback TCP copy inside a server is priced
#: at the same rate (an assumption: no published figure for gloo's loopback on these hosts)
HOST_COPY_BYTES_PER_S = 10 * 1e9
#: NCCL all-reduce bus bandwidth over TCP (bytes/s) by Ethernet level. 25 Gbps: 1.7 GB/s, measured
#: with nccl-tests' all_reduce_perf (ring, 8 ranks on 2 hosts, 25 Gbps TCP; iperf-class tools reach
#: 25 Gbps one way there): NVIDIA/nccl-tests issue #83 (2021). 10 Gbps: 60% of wire speed,
#: 0.75 GB/s, the ceiling NCCL 2.4 reached over TCP (32 Gbps, large messages): NVIDIA/nccl issue #209
#: (April 2019, the NCCL generation of PipeDream's nvcr.io/nvidia/pytorch:19.05 container); no direct
#: 10 Gbps measurement was found, so the fraction is carried over. Fixed from these sources before
#: any comparison with PipeDream's Table 1.
NCCL_TCP_BUS_BANDWIDTH: dict[str, float] = {"ethernet-10g": 0.6 * 10 * 1e9 / 8, "ethernet-25g": 1.7e9}
#: gloo's all-reduce bus bandwidth on the host (bytes/s), ``2 (n - 1) / n * S / t``: its ring
#: (``allreduce_ring_chunked``, TCP) over 4 machines on 40 GbE reduced 5,000,000 floats (20 MB) in
#: 10,608 us at the median, 2.83 GB/s, 57% of the wire (gloo's README, "Example output (running on 4
#: machines with a 40GbE network)"). PyTorch's gloo process group all-reduces a CUDA tensor by copying
#: it to pinned host memory once, running gloo's ring on the host and copying it back once
#: (``ProcessGroupGloo.cpp``, ``AsyncAllreduceCUDAWork``); DistributedDataParallel's buckets overlap one
#: bucket's copies with another's ring, so the ring's per-link rate is the slower of the level's path
#: and this. The default of ``"gloo-ring"``.
GLOO_ALLREDUCE_BUS_BANDWIDTH = 2 * 3 / 4 * 20e6 / 10_608e-6


#: bytes of one all-reduce call of PyTorch's DistributedDataParallel: its gradient buckets
#: (``bucket_cap_mb=25``, the default since PyTorch 1.0)
DDP_BUCKET_BYTES = 25 * 2**20


def nccl24_tree_threshold(nodes: int, ranks: int, nvlink: bool, channels: int = 1) -> float:
    """Bytes below which NCCL 2.4 all-reduces with its tree rather than its ring, by default (no
    ``NCCL_TREE_THRESHOLD``): NCCL 2.4's own model of the two (``ncclTreeThreshold``, ``src/init.cu``).

    Latency: 6 us per ring step over ``ranks - 1`` steps; the tree 15 us per level of a binary tree of
    ``nodes`` plus 4 us per rank inside a node. Bandwidth per channel: the tree at 2/3 of the ring's
    over PCIe, at 3/4 with NVLink (whose ring runs ``channels`` channels), doubled on two NVLink nodes.
    The tree is never used on one node or where the ring's latency is not the larger (0 bytes), always
    where its bandwidth is the higher (two NVLink nodes: ``inf``), else below the size at which the two
    times cross. E.g. cluster B (two 8-GPU NVLink servers): ``inf``, every bucket goes by the tree;
    cluster A (PCIe, 4 x 4): 480 kB, so DistributedDataParallel's 25 MiB buckets take the ring."""
    for label, v in (("nodes", nodes), ("ranks", ranks), ("channels", channels)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{label}={v!r} must be a positive integer")
    ring_bw = 5000.0 * (channels if nvlink else 1)          # bytes per us
    tree_bw = ring_bw * (3 / 4 if nvlink else 2 / 3)
    if nvlink and nodes == 2:
        tree_bw *= 2
    ring_lat = 6.0 * (ranks - 1)
    tree_lat = 15.0 * (nodes.bit_length() - 1) + 4.0 * (ranks // nodes - 1)
    if nodes < 2 or ring_lat <= tree_lat:
        return 0.0
    if tree_bw > ring_bw:
        return math.inf
    return ring_bw * tree_bw / (ring_bw - tree_bw) * (ring_lat - tree_lat)


def nccl_flat_ring(levels: Sequence[Any]) -> tuple[Any, ...]:
    """``levels`` (a cluster's levels after ``transport_levels(..., allreduce="nccl-ring")``) as the one
    ring NCCL runs an all-reduce of every worker on: a single level of all the workers whose ring
    runs at the slowest crossed level's ``ring_bandwidth`` (its bus bandwidth) and latency.

    NCCL builds flat rings through every rank, never a 2-D (per-server, then across servers) ring
    (NVIDIA/nccl issue #471, 2021: "we only build flat rings, no 2D ring"; on PCIe systems NCCL 2.4
    used trees for small sizes and rings for large ones, NVIDIA/nccl issue #226, May 2019), and a bus
    bandwidth ``B`` is defined by ``t = (S / B) * 2 (n - 1) / n`` over all ``n`` ranks, ``B`` the
    hardware bottleneck's speed (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``). The hierarchical ring
    of the cost model prices the Ethernet hop at ``2 (p - 1) / p`` of the bytes for ``p`` servers;
    NCCL's ring moves ``2 (n - 1) / n`` of them through every server's NIC (1.875 against 1 on two
    servers of 8 GPUs, 1.875 against 1.5 on four of 4). Only for an all-reduce over every worker
    (a data-parallel baseline): a pipeline priced on this level would lose the topology.
    """
    crossed = [lv for lv in levels if lv.size > 1] or list(levels[:1])
    n = math.prod(int(lv.size) for lv in levels)
    slowest = min(crossed, key=lambda lv: lv.ring_bandwidth)
    bus = float(slowest.ring_bandwidth)
    return (replace(slowest, name=f"nccl-flat-ring({slowest.name})", size=n, uplinks=1,
                    latency=max(float(lv.latency) for lv in crossed), allreduce_bandwidth=bus),)


def transport_levels(levels: Sequence[Any], pipeline: str = "link", allreduce: str = "link", *,
                     host_copy_bandwidth: float = HOST_COPY_BYTES_PER_S,
                     allreduce_bus_bandwidth: dict[str, float] | None = None,
                     gloo_allreduce_bandwidth: float = GLOO_ALLREDUCE_BUS_BANDWIDTH) -> tuple[Any, ...]:
    """``levels`` (a cluster's :class:`~pipelab.cluster.Level` records, innermost first) with
    ``p2p_bandwidth`` and ``allreduce_bandwidth`` set for the transports (see
    :meth:`pipelab.cluster.Cluster.with_transport`)."""
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
        via_host = 1.0 / (2.0 / host_copy_bandwidth + 1.0 / net)
        if pipeline == "gloo-host":
            changes["p2p_bandwidth"] = via_host
        if allreduce == "nccl-ring" and lv.name in bus:
            changes["allreduce_bandwidth"] = float(bus[lv.name])
        elif allreduce == "gloo-ring":
            changes["allreduce_bandwidth"] = min(net, float(gloo_allreduce_bandwidth))
        out.append(replace(lv, **changes))
    return tuple(out)
