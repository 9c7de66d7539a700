"""Where ``pl.simulate`` puts a plan's tensor-parallel groups on the cluster, and how it draws their work.

A schedule worker whose stages have degree ``t`` is a group of ``t`` devices: the groups take the
cluster's devices in worker order, each a contiguous block (so a group fits one node of a
hierarchical cluster whenever the node's size is a multiple of it), and the first device of a block,
the *leader*, sends and receives the stage's activations, as in the runtime
(:mod:`pipelab.runtime.tensor_group`). The simulated trace numbers the groups' members the way a run
does (:mod:`pipelab.schedules.groups`, shared with the runtime), so the views draw a simulated group
exactly as a measured one (:func:`pipelab.views.gantt_groups`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pipelab.cluster import Cluster
from pipelab.costs.tensor import GroupComm
from pipelab.trace import Event


def place_groups(degrees: Sequence[int], cluster: Cluster) -> list[tuple[int, ...]]:
    """Per schedule worker, the cluster devices of its group (leader first), contiguous in worker order."""
    need = sum(degrees)
    if need > cluster.num_workers:
        raise ValueError(f"the plan's tensor groups need {need} devices (degrees {list(degrees)} per worker) "
                         f"but cluster {cluster.name!r} has {cluster.num_workers}; use a bigger cluster or "
                         "smaller tensor degrees")
    out, nxt = [], 0
    for t in degrees:
        group = tuple(range(nxt, nxt + t))
        speeds = {cluster.speed(d) for d in group}
        if len(speeds) > 1:
            raise ValueError(f"tensor group on devices {list(group)} of cluster {cluster.name!r} mixes "
                             f"device speeds {sorted(speeds)}: its members run in lockstep at the slowest "
                             "one's pace, which pl.simulate does not model; give each group devices of one "
                             "kind")
        out.append(group)
        nxt += t
    return out


def comm_events(events: Sequence[Event], comm: Mapping[int, GroupComm], recompute_forward: bool
                ) -> list[Event]:
    """Each ``F``/``B`` of a split stage's collectives as a ``tensor`` event at the action's end (their
    total time: the ring collectives interleave with the layers, drawn together at the end)."""
    out = []
    for e in events:
        c = comm.get(e.stage)
        if c is None or e.kind not in ("F", "B"):
            continue
        secs, nbytes = (c.forward_s, c.forward_bytes) if e.kind == "F" else (c.backward_s, c.backward_bytes)
        if e.kind == "B" and recompute_forward:
            secs, nbytes = secs + c.forward_s, nbytes + c.forward_bytes
        if secs > 0:
            out.append(Event(e.worker, e.stage, "tensor", e.microbatch, e.end_s - secs, e.end_s, nbytes))
    return out


def member_events(events: Sequence[Event], ranks: Sequence[Sequence[int]]) -> list[Event]:
    """The other members' copies of each group's events: every action and collective of their leader's,
    not its sends (the leader alone sends and receives)."""
    return [dataclasses.replace(e, worker=r) for e in events if e.worker < len(ranks) and e.kind != "send"
            for r in ranks[e.worker][1:]]
