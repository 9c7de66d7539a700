"""Ring collectives over a group of a cluster's workers: all-reduce, reduce-scatter, all-gather.

A ring all-reduce of ``n`` bytes over ``p`` members moves ``2 (p - 1) / p * n`` bytes through each
member's link (Patarasuk and Yuan 2009); a reduce-scatter or an all-gather half of it. Over a hierarchy
the ring runs per level (NCCL's hierarchical rings): each level the group crosses adds its term with
its ``p`` (members per block) and its bus bandwidth (``Level.ring_bandwidth``, NCCL's measured
``busbw``) times the links the members of one block use at once (``Level.uplinks``). A cluster built
with ``allreduce_ring="flat"`` (gloo's ring) instead runs one ring of all ``n`` members in rank order:
``2 (n - 1) / n`` per byte over the slowest level's bus bandwidth it crosses (one link), and ``2 (n - 1)``
of the slowest latency crossed -- the same terms as the 2019 cost model's
(:meth:`pipelab.costs.prices.CostModel.allreduce_coeffs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.cluster import Cluster


def ring_terms(cluster: Cluster, workers: Sequence[int]) -> tuple[float, float]:
    """``(seconds per byte, fixed seconds)`` of a ring all-reduce over ``workers``: the sum over the
    levels the group crosses of ``2 (p - 1) / p / (busbw x links)`` and ``2 (p - 1)`` latencies; for a
    ``"flat"`` cluster one ring of all members over the slowest level crossed."""
    crossed = cluster.ring_levels(workers)
    if cluster.allreduce_ring == "flat" and crossed:
        n = len(set(int(w) for w in workers))
        return (2.0 * (n - 1) / n / min(lv.ring_bandwidth for lv, _, _ in crossed),
                2.0 * (n - 1) * max(lv.latency for lv, _, _ in crossed))
    per_byte = fixed = 0.0
    for lv, p, links in crossed:
        per_byte += 2.0 * (p - 1) / p / (lv.ring_bandwidth * links)
        fixed += 2.0 * (p - 1) * lv.latency
    return per_byte, fixed


def allreduce_s(cluster: Cluster, workers: Sequence[int], nbytes: float) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``workers`` (0 for one worker or no bytes)."""
    per_byte, fixed = ring_terms(cluster, workers)
    return 0.0 if per_byte == 0.0 or nbytes <= 0 else fixed + per_byte * nbytes


def reduce_scatter_s(cluster: Cluster, workers: Sequence[int], nbytes: float) -> float:
    """Seconds of a ring reduce-scatter of ``nbytes`` (the whole tensor) over ``workers``: half an
    all-reduce."""
    per_byte, fixed = ring_terms(cluster, workers)
    return 0.0 if per_byte == 0.0 or nbytes <= 0 else (fixed + per_byte * nbytes) / 2


def all_gather_s(cluster: Cluster, workers: Sequence[int], nbytes: float) -> float:
    """Seconds of a ring all-gather producing ``nbytes`` (the whole tensor) on each of ``workers``."""
    return reduce_scatter_s(cluster, workers, nbytes)


def p2p_s(cluster: Cluster, src: int, dst: int, nbytes: float) -> float:
    """Seconds to send ``nbytes`` from ``src`` to ``dst`` over the link between them."""
    if src == dst or nbytes <= 0:
        return 0.0
    lv = cluster.link(src, dst)
    return lv.latency + nbytes / lv.transfer_bandwidth
