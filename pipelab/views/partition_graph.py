"""The layer graph of a profile, coloured by the stage a plan gives each layer.

A layered drawing: x is a layer's longest-path depth from an input, so every edge points right; layers
of equal depth spread vertically. Node area ~ forward + backward time, edge width ~ bytes carried.
A shared (tied) parameter is a dashed curve joining the layers that use it, named with the stages
holding a copy.
"""

from __future__ import annotations

import math

import networkx as nx
import plotly.graph_objects as go

from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.views.gantt import PALETTE


def layer_graph(profile: Profile) -> nx.DiGraph:
    """``profile.edges`` (a chain if it has none) as a DiGraph; nodes carry ``name``, ``kind``,
    ``compute_s``, ``param_bytes``, edges ``bytes``."""
    g = nx.DiGraph()
    g.add_nodes_from((i, {"name": ly.name, "kind": ly.kind, "compute_s": ly.fwd_s + ly.bwd_s,
                          "param_bytes": ly.param_bytes}) for i, ly in enumerate(profile.layers))
    edges = profile.edges or tuple((i, i + 1) for i in range(len(profile) - 1))
    g.add_edges_from((a, b, {"bytes": profile.layers[a].out_bytes}) for a, b in edges)
    return g


def layered_positions(g: nx.DiGraph) -> dict[int, tuple[float, float]]:
    """x = longest-path depth from a source (the topological generation), y = spread of same-depth nodes
    around 0 (in index order)."""
    by_depth = [sorted(gen) for gen in nx.topological_generations(g)]
    return {n: (float(d), (len(nodes) - 1) / 2.0 - j)
            for d, nodes in enumerate(by_depth) for j, n in enumerate(nodes)}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"


def partition_graph(profile: Profile, plan: Plan, *, title: str | None = None) -> go.Figure:
    """Draw ``profile``'s layer graph with nodes coloured by ``plan``'s stages (``ValueError``, from
    ``plan.validate(profile)``, when the plan was made for another model)."""
    if not isinstance(profile, Profile) or not isinstance(plan, Plan):
        raise TypeError(f"partition_graph(profile, plan) takes a Profile and a Plan; got "
                        f"{type(profile).__name__} and {type(plan).__name__}")
    plan.validate(profile)
    g = layer_graph(profile)
    pos = layered_positions(g)
    stage_of = {i: plan.stage_of_layer(i).index for i in g.nodes}
    fig = go.Figure([*_edge_traces(g, pos), *_tie_traces(profile, plan, pos),
                     *_node_traces(profile, plan, g, pos, stage_of)])
    top = max((y for _, y in pos.values()), default=0.0) + 0.8
    for st in plan.stages:
        stage_x = [pos[n][0] for n in range(st.start, st.end)]
        ranks = ",".join(map(str, st.ranks)) if len(st.ranks) <= 6 else f"{st.ranks[0]}–{st.ranks[-1]}"
        # alternate heights so labels of neighbouring narrow stages do not overlap
        fig.add_annotation(x=sum(stage_x) / len(stage_x), y=top + 0.6 * (st.index % 2), showarrow=False,
                           yanchor="bottom", text=f"<b>S{st.index}</b> ×{st.replicas}<br>ranks {ranks}",
                           font={"color": PALETTE[st.index % len(PALETTE)], "size": 11})
    head = title or (f"{profile.model or 'model'}: plan {plan.config!r} ({plan.method}), "
                     f"{plan.num_stages} stages")
    fig.update_layout(
        title={"text": head}, hovermode="closest", plot_bgcolor="white",
        xaxis={"title": {"text": "depth (topological layer)"}, "showgrid": False, "zeroline": False},
        yaxis={"visible": False, "range": [min(y for _, y in pos.values()) - 1.0, top + 1.8]},
        height=360 + 20 * max(1, int(top)), margin={"l": 10, "r": 10, "t": 60, "b": 40},
        meta={"stage_of_layer": [stage_of[i] for i in range(len(profile))],
              "ties": [{"name": t.name, "layers": list(t.layers),
                        "stages": list(t.stages([(s.start, s.end) for s in plan.stages]))}
                       for t in profile.ties]},
    )
    return fig


def _edge_traces(g: nx.DiGraph, pos: dict[int, tuple[float, float]]) -> list[go.Scatter]:
    """The edges, one trace per width (1 to 8 px on a log scale of bytes; plotly's width is per trace)."""
    max_b = max((d["bytes"] for *_, d in g.edges(data=True)), default=0)
    buckets: dict[float, tuple[list[float | None], list[float | None]]] = {}
    for a, b, d in g.edges(data=True):
        thick = max_b > 0 and d["bytes"] > 0
        width = 1.0 + 7.0 * math.log1p(d["bytes"]) / math.log1p(max_b) if thick else 1.0
        xs, ys = buckets.setdefault(round(width), ([], []))
        xs += [pos[a][0], pos[b][0], None]
        ys += [pos[a][1], pos[b][1], None]
    return [go.Scatter(x=xs, y=ys, mode="lines", line={"width": width, "color": "#9a9a9a"},
                       hoverinfo="skip", showlegend=False, name=f"edges {width:g}px")
            for width, (xs, ys) in sorted(buckets.items())]


def _tie_traces(profile: Profile, plan: Plan, pos: dict[int, tuple[float, float]]) -> list[go.Scatter]:
    """One dashed curve per shared parameter through the layers using it, arched above the graph."""
    ranges = [(s.start, s.end) for s in plan.stages]
    out = []
    for t in profile.ties:
        stages = t.stages(ranges)
        xs: list[float | None] = []
        ys: list[float | None] = []
        for a, b in zip(t.layers, t.layers[1:]):
            (xa, ya), (xb, yb) = pos[a], pos[b]
            lift = 0.6 + 0.02 * abs(xb - xa)
            for k in range(21):     # a parabola from a to b
                u = k / 20
                xs.append(xa + (xb - xa) * u)
                ys.append(ya + (yb - ya) * u + 4 * lift * u * (1 - u))
            xs.append(None)
            ys.append(None)
        where = (f"a copy on each of stages {list(stages)}, gradients summed at U" if len(stages) > 1
                 else f"on stage {stages[0]} only")
        out.append(go.Scatter(x=xs, y=ys, mode="lines", line={"width": 2, "color": "#d62728", "dash": "dash"},
                              name=f"shared {t.name} ({where})", hoverinfo="name", showlegend=True))
    return out


def _node_traces(profile: Profile, plan: Plan, g: nx.DiGraph, pos: dict[int, tuple[float, float]],
                 stage_of: dict[int, int]) -> list[go.Scatter]:
    """The layers, one trace per stage (so the legend lists the stages)."""
    max_c = max((d["compute_s"] for _, d in g.nodes(data=True)), default=0.0)
    out = []
    for st in plan.stages:
        nodes = [n for n in sorted(g.nodes) if stage_of[n] == st.index]
        info = [g.nodes[n] for n in nodes]
        out.append(go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers",
            name=f"stage {st.index} ×{st.replicas}",
            marker={"size": [8.0 + 32.0 * math.sqrt(d["compute_s"] / max_c) if max_c > 0 else 14.0
                             for d in info],
                    "color": PALETTE[st.index % len(PALETTE)], "line": {"width": 1, "color": "#333"}},
            customdata=[[n, d["name"], d["kind"], d["compute_s"] * 1e3, _fmt_bytes(d["param_bytes"]),
                         _fmt_bytes(profile.layers[n].out_bytes)] for n, d in zip(nodes, info, strict=True)],
            hovertemplate=(f"stage {st.index} (×{st.replicas}, ranks {list(st.ranks)})<br>"
                           "layer %{customdata[0]}: <b>%{customdata[1]}</b> (%{customdata[2]})<br>"
                           "fwd+bwd %{customdata[3]:.3g} ms, params %{customdata[4]}, "
                           "output %{customdata[5]}<extra></extra>"),
        ))
    return out
