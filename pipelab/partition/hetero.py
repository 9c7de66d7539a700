"""HetPipe (Park et al., USENIX ATC'20): pipelines over virtual workers of heterogeneous GPUs.

Virtual workers (VWs) group the GPUs by policy (§6: ``"NP"`` a node each, ``"ED"`` one GPU of each
type, ``"HD"`` fast nodes paired with slow); a Plan replicates stage ``s`` over the VWs (shared
boundaries, each VW its own device order). The VWs progress at the slowest VW's pace, no faster than
the busiest shared port (:func:`hetpipe_time_s`); parameter-server traffic is assumed hidden by the
staleness bound (HetPipe §4). docs/partitioning.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

import pipelab.metrics as metrics
from pipelab.cluster import Cluster, Device
from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.partition.predict import Pipelining, build_plan, descend

POLICIES = ("ED", "NP", "HD")
MAX_ORDER_SEARCH = 6      # GPUs per VW up to which every order along the pipeline is tried
MAX_ORDER_COMBOS = 4096   # joint order choices (one per class of equivalent VWs) tried exhaustively
REFINE_CANDIDATES = 4     # best DP candidates whose boundaries are refined on the exact score

# what makes two device orders equivalent: the device at each position and the link level of each cut
Signature = tuple[tuple[Device, ...], tuple[int, ...]]


def virtual_workers(cluster: Cluster | str, policy: str = "ED") -> list[list[int]]:
    """Group the cluster's workers into virtual workers by HetPipe's ``policy`` ("ED", "NP", "HD")."""
    cluster = Cluster.of(cluster)
    pol = policy.upper()
    if pol not in POLICIES:
        raise ValueError(f"unknown virtual-worker policy {policy!r}; choose one of {', '.join(POLICIES)}")
    g = cluster.levels[0].size
    nodes = [list(range(s, s + g)) for s in range(0, cluster.num_workers, g)]
    if pol == "NP":
        return nodes
    if pol == "ED":
        by_type: dict[str, list[int]] = {}
        for w, d in enumerate(cluster.devices):
            by_type.setdefault(d.name, []).append(w)
        counts = {len(v) for v in by_type.values()}
        if len(counts) != 1:
            raise ValueError(f"ED needs the same number of GPUs of every type; got "
                             f"{ {k: len(v) for k, v in by_type.items()} }; use policy='NP'")
        return [list(ws) for ws in zip(*by_type.values())]
    # HD: pair nodes fast-with-slow; each VW takes half of each paired node's GPUs
    if len(nodes) % 2 or g % 2:
        raise ValueError("HD pairs nodes and halves them; it needs an even number of nodes and of GPUs per "
                         "node")
    order = sorted(range(len(nodes)), key=lambda i: -cluster.devices[nodes[i][0]].speed)
    h, half = g // 2, len(order) // 2
    return [nodes[a][part] + nodes[b][part] for a, b in zip(order[:half], reversed(order[half:]))
            for part in (slice(None, h), slice(h, None))]


@dataclass(frozen=True)
class HetPipeTime:
    """Predicted pace of HetPipe VWs sharing one set of stage boundaries (:func:`hetpipe_time_s`)."""

    time_s: float                      # seconds per minibatch of the whole cluster
    vw_times_s: tuple[float, ...]      # per VW: seconds per minibatch of that VW alone
    port_max_s: float                  # busiest port's seconds per cluster minibatch, all VWs together
    bottleneck: str                    # "virtual worker v" or "port"


def hetpipe_time_s(cm: CostModel, bounds: Sequence[int], orders: Sequence[Sequence[int]]) -> HetPipeTime:
    """Seconds per minibatch of VWs cutting the model at ``bounds``, VW ``v`` running stage ``s`` on
    ``orders[v][s]``: ``max_v T_v / V`` (each ``T_v`` a straight pipeline's
    :meth:`CostModel.steady_state`; HetPipe §4-5), at least the busiest port shared by all VWs."""
    V = len(orders)
    if V == 0:
        raise ValueError("hetpipe_time_s needs at least one virtual worker's device order")
    k = len(orders[0])
    if any(len(o) != k for o in orders) or len(bounds) != k - 1:
        raise ValueError(f"every VW order needs one device per stage ({len(bounds) + 1} stages); got orders "
                         f"of lengths {[len(o) for o in orders]}")
    cuts = [0, *bounds, cm.num_layers]
    ranges = list(zip(cuts[:-1], cuts[1:]))
    flights = [metrics.in_flight([1] * k, s) for s in range(k)]
    vw = tuple(cm.steady_state(ranges, [[w] for w in o], in_flight=flights).time_s for o in orders)
    # the shared ports: replica v of every stage is VW v's device (only the port loads are used)
    ports = cm.steady_state(ranges, [[o[s] for o in orders] for s in range(k)], in_flight=flights).ports_s
    port = max(ports.values(), default=0.0)
    slow = max(range(V), key=lambda v: vw[v])
    time = max(vw[slow] / V, port)
    return HetPipeTime(time_s=time, vw_times_s=vw, port_max_s=port,
                       bottleneck="port" if port > vw[slow] / V else f"virtual worker {slow}")


def _signature(cm: CostModel, order: Sequence[int]) -> Signature:
    return (tuple(cm.cluster.devices[w] for w in order),
            tuple(cm.cluster.level_between(a, b) for a, b in zip(order, order[1:])))


def _order_candidates(cm: CostModel, devices: Sequence[int], search_order: bool
                      ) -> dict[Signature, list[int]]:
    """Device orders of one VW to try, one per :data:`Signature` (same devices and links: same times)."""
    if search_order and len(devices) <= MAX_ORDER_SEARCH:
        orders = sorted(itertools.permutations(devices))
    else:
        orders = [tuple(devices), tuple(sorted(devices, key=lambda w: -cm.cluster.speed(w)))]
    out: dict[Signature, list[int]] = {}
    for o in orders:
        out.setdefault(_signature(cm, o), list(o))
    return out


class _StageTerms:
    """The DP's per-stage cost matrices over ranges ``[i, j)``, cached per (device, neighbours, in flight)."""

    def __init__(self, cm: CostModel, memory_limit: float | None) -> None:
        n = cm.num_layers
        self.cm, self.n, self.memory_limit = cm, n, memory_limit
        compute = cm.forward_prefix + cm.backward_prefix
        comp = compute[None, :] - compute[:, None]
        self.comp = np.where(np.triu(np.ones((n + 1, n + 1), dtype=bool), 1), comp, np.inf)
        self.P, self.A = cm.memory_arrays()
        self._cache: dict[tuple[int, int | None, int | None, int, bool], np.ndarray] = {}

    def _port_vector(self, src: int, dst: int) -> np.ndarray:
        """Port seconds per minibatch of the cut at position ``i`` (after layer ``i - 1``) sent src -> dst."""
        cm, n = self.cm, self.n
        level = cm.cluster.level_between(src, dst)
        lv = cm.cluster.levels[level]
        x = np.zeros(n + 1)
        # the same arithmetic as CostModel.transfer_s / port_slots, vectorised over the cuts
        x[1:n] = (lv.latency + cm.cuts / cm.compression_ratio / lv.transfer_bandwidth) / lv.uplinks
        return x

    def stage(self, order: Sequence[int], s: int, serial: bool = False) -> np.ndarray:
        """Cost of ranges as stage ``s`` of a VW with device ``order`` (inf where it does not fit):
        max(compute, own port term), a lower bound; with ``serial`` compute plus both cuts, an upper one."""
        k, w = len(order), order[s]
        prev = order[s - 1] if s > 0 else None
        nxt = order[s + 1] if s < k - 1 else None
        key = (w, prev, nxt, k - s, serial)
        if key in self._cache:
            return self._cache[key]
        cm, kf = self.cm, k - s
        cost = self.comp / cm.cluster.speed(w)
        xin = self._port_vector(prev, w) if prev is not None else None
        xout = self._port_vector(w, nxt) if nxt is not None else None
        if serial:
            if xin is not None:
                cost = cost + xin[:, None]
            if xout is not None:
                cost = cost + xout[None, :]
        elif xin is not None and xout is not None:
            same = cm.cluster.level_between(prev, w) == cm.cluster.level_between(w, nxt)   # type: ignore[arg-type]
            # both cuts on one level share the port (CostModel.stage_port_s)
            port = xin[:, None] + xout[None, :] if same else np.maximum(xin[:, None], xout[None, :])
            cost = np.maximum(cost, port)
        elif xin is not None:
            cost = np.maximum(cost, xin[:, None])
        elif xout is not None:
            cost = np.maximum(cost, xout[None, :])
        lim = self.memory_limit if self.memory_limit is not None else cm.cluster.memory(w)
        cost = np.where((kf + 1 + cm.state_factor) * self.P + kf * self.A <= lim, cost, np.inf)
        self._cache[key] = cost
        return cost

    def solve(self, orders: Sequence[Sequence[int]], serial: bool = False) -> tuple[float, list[int]] | None:
        """Exact DP: shared boundaries minimising the costliest stage (:meth:`stage`) over all ``orders``;
        None if nothing fits in memory."""
        n, k = self.n, len(orders[0])
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        parents = []
        for s in range(k):
            cost = self.stage(orders[0], s, serial)
            for o in orders[1:]:
                cost = np.maximum(cost, self.stage(o, s, serial))
            cand = np.maximum(best[:, None], cost)
            arg = cand.argmin(axis=0)
            best = cand[arg, np.arange(n + 1)]
            parents.append(arg)
        if not math.isfinite(best[n]):
            return None
        bounds, j = [], n
        for s in range(k - 1, 0, -1):
            j = int(parents[s][j])
            bounds.append(j)
        return float(best[n]), bounds[::-1]


def _fits(cm: CostModel, cuts: Sequence[int], orders: Sequence[Sequence[int]],
          memory_limit: float | None) -> bool:
    k = len(cuts) - 1
    need = [cm.memory_bytes(cuts[s], cuts[s + 1], versions=k - s, in_flight=k - s)["total"]
            for s in range(k)]
    return all(need[s] <= (memory_limit if memory_limit is not None else cm.cluster.memory(o[s]))
               for s in range(k) for o in orders)


def _refine(cm: CostModel, bounds: list[int], orders: Sequence[Sequence[int]], memory_limit: float | None
            ) -> tuple[float, list[int]]:
    """Coordinate descent of the boundaries on :func:`hetpipe_time_s` (orders fixed, memory respected)."""
    return descend([0, *bounds, cm.num_layers], lambda c: hetpipe_time_s(cm, c[1:-1], orders).time_s,
                   lambda c, _: _fits(cm, c, orders, memory_limit))


def shared_partition(cm: CostModel, vws: Sequence[Sequence[int]], *, memory_limit: float | None = None,
                     search_order: bool = True) -> tuple[HetPipeTime, list[int], list[list[int]]]:
    """Best shared boundaries and per-VW device orders for ``vws``: ``(time, boundaries, orders)``.

    Every joint choice of one order per class of equivalent VWs gets the exact DP over shared boundaries
    with both stage costs of :meth:`_StageTerms.stage`; the :data:`REFINE_CANDIDATES` best by
    :func:`hetpipe_time_s` are refined on it. Exact (brute force agrees) unless transfers rival compute.
    """
    _check_vws(cm, vws)
    found = _dp_candidates(cm, vws, search_order, _StageTerms(cm, memory_limit))
    if not found:
        raise ValueError(f"no partition of {cm.profile.model or 'this model'} over virtual workers "
                         f"{[list(v) for v in vws]} fits in their memory; use a smaller batch or more "
                         "devices per virtual worker")
    # the DP's stage costs bracket the exact ones; refine the few best candidates on the exact score
    best: tuple[float, list[int], list[list[int]]] | None = None
    for (bnd, ords), _ in sorted(found.items(), key=lambda kv: kv[1])[:REFINE_CANDIDATES]:
        orders_l = [list(o) for o in ords]
        t, bounds = _refine(cm, list(bnd), orders_l, memory_limit)
        if best is None or t < best[0] * (1 - 1e-12):
            best = (t, bounds, orders_l)
    assert best is not None
    return hetpipe_time_s(cm, best[1], best[2]), best[1], best[2]


def _check_vws(cm: CostModel, vws: Sequence[Sequence[int]]) -> None:
    """Raise unless ``vws`` are equally sized, non-empty and no larger than the model's layers."""
    if not vws:
        raise ValueError("no virtual workers to partition over")
    n, k = cm.num_layers, len(vws[0])
    if k == 0:
        raise ValueError("a virtual worker needs at least one device")
    if any(len(v) != k for v in vws):
        raise ValueError(f"virtual workers of different sizes {[len(v) for v in vws]} cannot share one plan")
    if k > n:
        raise ValueError(f"{k} devices but the model has {n} layers; use at most {n} devices per virtual "
                         "worker")


def _dp_candidates(cm: CostModel, vws: Sequence[Sequence[int]], search_order: bool, terms: _StageTerms
                   ) -> dict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], float]:
    """``{(boundaries, orders): hetpipe time}`` of the DP's solutions, per joint choice of orders (one per
    class of VWs with the same candidate signatures; over :data:`MAX_ORDER_COMBOS`, each class's best
    order alone and its fastest-first order)."""
    cands = [_order_candidates(cm, v, search_order) for v in vws]
    classes: dict[frozenset[Signature], list[int]] = {}
    for v, c in enumerate(cands):
        classes.setdefault(frozenset(c), []).append(v)
    members = list(classes.values())
    sigs = [list(cands[m[0]]) for m in members]
    if math.prod(len(s) for s in sigs) > MAX_ORDER_COMBOS:
        reduced = []
        for m, ss in zip(members, sigs):
            alone = [(r[0], sg) for sg in ss if (r := terms.solve([cands[m[0]][sg]])) is not None]
            fastest = _signature(cm, sorted(vws[m[0]], key=lambda w: -cm.cluster.speed(w)))
            keep = [min(alone, key=lambda x: x[0])[1]] if alone else []
            reduced.append(list(dict.fromkeys([*keep, fastest])))
        sigs = reduced if math.prod(len(s) for s in reduced) <= MAX_ORDER_COMBOS else [r[:1] for r in reduced]
    cls_of = {v: i for i, m in enumerate(members) for v in m}
    found: dict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], float] = {}
    for combo in itertools.product(*sigs):
        reps = [cands[m[0]][sg] for m, sg in zip(members, combo)]
        orders = tuple(tuple(cands[v][combo[cls_of[v]]]) for v in range(len(vws)))
        for serial in (False, True):
            r = terms.solve(reps, serial)
            if r is not None and (tuple(r[1]), orders) not in found:
                found[(tuple(r[1]), orders)] = hetpipe_time_s(cm, r[1], orders).time_s
    return found


def partition_virtual_worker(cm: CostModel, devices: Sequence[int], *, memory_limit: float | None = None,
                             search_order: bool = True) -> tuple[float, list[int], list[int]]:
    """Best straight pipeline over ``devices`` (one VW): ``(time, boundaries, device order)``."""
    t, bounds, orders = shared_partition(cm, [list(devices)], memory_limit=memory_limit,
                                         search_order=search_order)
    return t.time_s, bounds, orders[0]


def partition_hetpipe(cm: CostModel, *, policy: str = "ED", memory_limit: float | None = None) -> Plan:
    """HetPipe plan: VWs by ``policy``, stage ``s`` replicated over them; boundaries and orders minimise
    :func:`hetpipe_time_s`, the plan's ``time_per_minibatch``."""
    vws = virtual_workers(cm.cluster, policy)
    pace, bounds, orders = shared_partition(cm, vws, memory_limit=memory_limit)
    k, V = len(orders[0]), len(vws)
    # stage s runs on the s-th device (in its VW's order) of every VW: replica v is VW v
    ranks_of = [orders[v][s] for s in range(k) for v in range(V)]
    plan = build_plan(cm, bounds, [V] * k, method="hetpipe", ranks_of=ranks_of,
                      run=Pipelining(in_flight=[metrics.in_flight([1] * k, s) for s in range(k)]),
                      notes={"policy": policy.upper(), "virtual_workers": vws})
    time = pace.time_s
    return plan.with_predictions(
        stages=tuple(replace(st, versions=st.in_flight) for st in plan.stages), time_per_minibatch=time,
        speedup_over_dp=plan.time_per_minibatch * plan.speedup_over_dp / time,
        notes={**plan.notes, "vw_orders": orders, "vw_times_s": list(pace.vw_times_s),
               "port_max_s": pace.port_max_s, "bottleneck": pace.bottleneck,
               "sync": "parameter server under WSP, assumed hidden by staleness"})
