"""Per-worker memory, stacked by component, against the device limit.

Components: weights, stashed versions (extra weight copies a method keeps), activations saved for
backward, gradients and optimizer state. Plans are costed by the simulator's cost model, so the chart,
the partitioner's memory check and the simulator agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.costs.tensor import check_priceable, layer_degrees, per_device
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules.actions import Schedule

COMPONENTS = ("weights", "stashed versions", "gradients", "optimizer state", "activations")
COMPONENT_COLORS = {"weights": "#1f77b4", "stashed versions": "#9467bd", "gradients": "#8c564b",
                    "optimizer state": "#2ca02c", "activations": "#ff7f0e", "total": "#7f7f7f"}

#: display names of the components of pipelab.costs.CostModel.memory_bytes
_COMPONENT_NAMES = {"weights": "weights", "stashed_weights": "stashed versions", "gradients": "gradients",
                    "optimizer": "optimizer state", "activations": "activations"}


def memory_breakdown(plan: Plan, profile: Profile, *, optimizer: str = "sgd-momentum",
                     microbatches: int = 1) -> dict[int, dict[str, int]]:
    """Predicted peak bytes per worker and component (:meth:`pipelab.costs.CostModel.memory_bytes`); a
    worker of a tensor-parallel stage is one member of its group."""
    plan.validate(profile)
    ranges, degrees = [(st.start, st.end) for st in plan.stages], [st.tensor for st in plan.stages]
    check_priceable(profile, ranges, degrees)   # a tensor group's member holds its shard (costs.tensor)
    device = per_device(profile, layer_degrees(profile, ranges, degrees))
    # memory does not depend on the interconnect: any cluster with enough workers will do
    cm = CostModel(device, Cluster.flat(plan.num_workers), optimizer=optimizer)
    parts = {st.index: cm.memory_bytes(st.start, st.end, versions=st.versions, in_flight=st.in_flight,
                                       microbatches=microbatches) for st in plan.stages}
    out = {r: {_COMPONENT_NAMES.get(k, k): int(v) for k, v in parts[st.index].items() if k != "total"}
           for st in plan.stages for r in st.ranks}
    return dict(sorted(out.items()))


def schedule_memory(schedule: Schedule) -> dict[int, dict[str, int]]:
    """Memory of a bare schedule in units (a stage's weights, a microbatch's activations) per worker.

    ``activations`` is the most microbatches whose forward ran and whose last backward (``B``, or ``W``
    when split) has not: GPipe keeps all ``M`` (Huang et al. §2.2), 1F1B ``P - s`` on stage ``s``
    (Narayanan et al. SC'21 §2.2).
    """
    if len(schedule) == 0:
        raise ValueError("the schedule has no actions; build it with pl.schedules.build(...)")
    split = {a.stage for acts in schedule.actions for a in acts if a.kind == "W"}
    out: dict[int, dict[str, int]] = {}
    for w, acts in enumerate(schedule.actions):
        stages = schedule.stages_of(w) or tuple(sorted({a.stage for a in acts}))
        stash = (sum(max(schedule.versions_held(s) - 1, 0) for s in stages)
                 if schedule.versions is not None else 0)
        live: set[tuple[int, int]] = set()
        peak = 0
        for a in acts:
            if a.kind == "F":
                live.add((a.stage, a.microbatch))
                peak = max(peak, len(live))
            elif a.kind == ("W" if a.stage in split else "B"):
                live.discard((a.stage, a.microbatch))
        out[w] = {"weights": len(stages), "stashed versions": stash, "activations": peak}
    return out


def _normalize(obj: Any) -> dict[int, dict[str, float]]:
    """Accept {worker: {component: bytes}}, {worker: bytes}, a per-worker sequence, or a DataFrame."""
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):          # pandas DataFrame, index = worker
        obj = {int(k): v for k, v in obj.to_dict(orient="index").items()}
    if isinstance(obj, Mapping):
        return {int(w): {str(k): float(b) for k, b in v.items()} if isinstance(v, Mapping)
                else {"total": float(v)} for w, v in obj.items()}
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return {w: {"total": float(b)} for w, b in enumerate(obj)}
    raise TypeError(f"cannot read a memory breakdown from {type(obj).__name__}")


def _from_source(source: Any, profile: Profile | None, optimizer: str,
                 microbatches: int) -> tuple[dict[int, dict[str, float]], str]:
    if isinstance(source, Plan):
        what = f"plan {source.config!r} ({source.method})"
        if profile is not None:
            got = memory_breakdown(source, profile, optimizer=optimizer, microbatches=microbatches)
            return _normalize(got), what
        if source.memory_per_worker:
            return _normalize(list(source.memory_per_worker)), f"{what}, predicted"
        raise ValueError("this plan has no memory prediction; pass the profile too: memory(plan, profile)")
    for attr in ("memory_breakdown", "memory"):              # SimResult / RunResult
        val = getattr(source, attr, None)
        if callable(val):
            val = val()
        if val is not None and not isinstance(val, (int, float)):
            try:
                return _normalize(val), f"{type(source).__name__}"
            except TypeError:
                pass
    peak = getattr(source, "peak_memory", None)
    if peak is not None:
        return _normalize(peak), f"{type(source).__name__} peak"
    if isinstance(source, (Mapping, Sequence)) or hasattr(source, "columns"):
        return _normalize(source), "memory"
    raise TypeError(f"memory() takes a Plan (with its Profile), a simulation/run result with per-worker "
                    f"memory, or a mapping worker -> bytes; got {type(source).__name__}")


def memory(sim_or_plan: Any, profile: Profile | None = None, *, limit: float | None = None,
           optimizer: str = "sgd-momentum", microbatches: int = 1, title: str | None = None,
           unit: str = "GB") -> go.Figure:
    """Per-worker stacked bars of memory by component, with the device ``limit`` (bytes) as a line.

    Args:
        sim_or_plan: a Plan (with ``profile`` for the breakdown), a result with ``memory_breakdown``,
            ``memory`` or ``peak_memory``, a mapping worker -> bytes (or -> {component: bytes}), or a
            bare Schedule (drawn in units, :func:`schedule_memory`).
        unit: ``"GB"``, ``"MB"`` or ``"B"`` for byte data.
    """
    if isinstance(sim_or_plan, Schedule):
        data, unit = _normalize(schedule_memory(sim_or_plan)), "units"
        what = f"{sim_or_plan.method} (1 unit = a stage's weights or a microbatch's activations)"
    else:
        data, what = _from_source(sim_or_plan, profile, optimizer, microbatches)
    scale = {"GB": 1e9, "MB": 1e6}.get(unit, 1.0)
    if not data:
        raise ValueError("no workers to draw: the memory breakdown is empty")
    workers = sorted(data)
    names = [c for c in COMPONENTS if any(c in data[w] for w in workers)]
    names += sorted({c for w in workers for c in data[w]} - set(names))
    x = [f"w{w}" for w in workers]
    fig = go.Figure([go.Bar(name=c, x=x, y=[data[w].get(c, 0.0) / scale for w in workers],
                            marker={"color": COMPONENT_COLORS.get(c)},
                            hovertemplate="%{x}: %{y:.4g} " + unit + " " + c + "<extra></extra>")
                     for c in names])
    totals = [sum(data[w].values()) for w in workers]
    over = [x[i] for i, t in enumerate(totals) if limit is not None and t > limit]
    head = title or f"memory per worker — {what}"
    if limit is not None:
        fig.add_hline(y=limit / scale, line={"color": "red", "dash": "dash"},
                      annotation_text=f"limit {limit / scale:.4g} {unit}", annotation_position="top left")
        head += f" — {len(over)} over the limit" + (f" ({', '.join(over[:8])})" if over else "")
    fig.update_layout(barmode="stack", title={"text": head}, yaxis={"title": {"text": unit}},
                      xaxis={"title": {"text": "worker"}}, height=420,
                      margin={"l": 10, "r": 10, "t": 60, "b": 40},
                      meta={"totals": totals, "over_limit": over})
    return fig
