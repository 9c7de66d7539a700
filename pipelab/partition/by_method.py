"""``partition(profile, cluster, method=...)``: the one entry point of the partitioners, by name.

``"pipedream"`` (:mod:`.pipedream`), ``"prefix-sum"`` (:mod:`.prefix_sum`), ``"gpipe"``
(:mod:`.balance`), ``"hetpipe"`` (:mod:`.hetero`), ``"dp"`` (:mod:`.dp`, the baseline of every
``speedup_over_dp``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelab.cluster import Cluster
from pipelab.costs import CostModel, compression_ratio_of
from pipelab.partition.balance import partition_gpipe
from pipelab.partition.dp import partition_dp
from pipelab.partition.hetero import partition_hetpipe
from pipelab.partition.pipedream import partition_pipedream
from pipelab.partition.plan import Plan
from pipelab.partition.prefix_sum import partition_prefix_sum
from pipelab.profile.records import Profile

#: each partitioning method: its function and the options it takes
_PARTITIONERS: dict[str, tuple[Callable[..., Plan], tuple[str, ...]]] = {
    "pipedream": (partition_pipedream, ("straight", "memory_limit", "workers", "hierarchical")),
    "prefix-sum": (partition_prefix_sum, ("stages", "memory_limit", "buffers", "workers")),
    "gpipe": (partition_gpipe, ("stages", "microbatches", "by", "memory_limit")),
    "hetpipe": (partition_hetpipe, ("policy", "memory_limit")),
    "dp": (partition_dp, ("workers", "memory_limit")),
}
METHODS = tuple(_PARTITIONERS)


def partition(profile: Profile, cluster: Cluster | str, method: str = "pipedream", *,
              compression: str | float | None = None, optimizer: str = "sgd-momentum",
              allreduce_overlap: str = "ddp", allreduce_bandwidth: float | None = None,
              **options: Any) -> Plan:
    """Partition ``profile`` for ``cluster`` (a Cluster or a spec like ``"pipedream-a:4x4"``) by ``method``.

    Options per method: pipedream ``straight``, ``memory_limit``, ``workers``, ``hierarchical``;
    prefix-sum ``stages``, ``memory_limit``, ``buffers``, ``workers``; gpipe ``stages``,
    ``microbatches``, ``by``, ``memory_limit``; hetpipe ``policy``, ``memory_limit``; dp ``workers``,
    ``memory_limit`` (bytes per worker; default each device's memory). ``allreduce_overlap``,
    ``allreduce_bandwidth``: as :class:`~pipelab.costs.CostModel`. ``compression``: as ``train``
    names it (``"fp16"``, ``"int8"``) or a ratio.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"partition() needs a pipelab Profile, got {type(profile).__name__}; "
                        f"load one with Profile.load / Profile.from_pipedream or pl.profile(model, x)")
    cl = Cluster.of(cluster)
    ratio = compression_ratio_of(compression)
    cm = CostModel(profile, cl, compression_ratio=ratio, optimizer=optimizer,
                   allreduce_overlap=allreduce_overlap, allreduce_bandwidth=allreduce_bandwidth)
    m = method.lower()
    if m not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    fn, takes = _PARTITIONERS[m]
    bad = set(options) - set(takes)
    if bad:
        raise TypeError(f"method {m!r} does not take option(s) {sorted(bad)}; it takes {list(takes)}")
    plan = fn(cm, **options)
    # the profile's shared parameters ride on the plan: Plan.shared() names the stages holding a copy
    return plan.with_predictions(ties=profile.ties) if plan.ties != profile.ties else plan
