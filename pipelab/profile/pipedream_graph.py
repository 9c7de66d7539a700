"""Read PipeDream's ``graph.txt`` layer profiles (SOSP'19 §3.1) into the fields of a Profile record.

    nodeN -- Description -- forward_compute_time=MS, backward_compute_time=MS, activation_size=BYTES,
    parameter_size=BYTES[ -- stage_id=K]
    <TAB>nodeA -- nodeB

Times are ms per minibatch, sizes bytes (``[a; b]`` for several outputs). Every node becomes one
layer in a topological order; a cut carries the outputs of every distinct node before it with an
edge after it (a tensor consumed twice is sent once). Imports nothing of pipelab's.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "pipedream"

# name -> file in pipelab/data/pipedream (see PROVENANCE.md there)
SHIPPED: dict[str, str] = {"vgg16": "vgg16_graph.txt", "resnet50": "resnet50_graph.txt",
                           "alexnet": "alexnet_graph.txt", "gnmt8": "gnmt_graph.txt",
                           "gnmt16": "gnmt_large_graph.txt"}
_ALIASES = {"vgg": "vgg16", "vgg-16": "vgg16", "resnet-50": "resnet50", "gnmt": "gnmt8", "gnmt-8": "gnmt8",
            "gnmt-16": "gnmt16", "gnmt_large": "gnmt16", "gnmt-large": "gnmt16"}

_NODE_RE = re.compile(r"^(?P<id>\S+) -- (?P<desc>.*) -- forward_compute_time=(?P<fwd>[^,]+), "
                      r"backward_compute_time=(?P<bwd>[^,]+), "
                      r"activation_size=(?P<act>\[[^\]]*\]|[^,]+), parameter_size=(?P<param>[^,\s]+)"
                      r"(?: -- stage_id=(?P<stage>-?\d+))?\s*$")
_EDGE_RE = re.compile(r"^\s+(?P<a>\S+) -- (?P<b>\S+)\s*$")
_FLOAT = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")

# Image sizes tried (in order) when inferring the minibatch from the input activation:
# ImageNet 224 for most models, 299 for Inception-v3, 331 for NASNet-large.
_IMAGE_SIDES = (224, 299, 331)


@dataclass(frozen=True)
class GraphNode:
    """One node line of a ``graph.txt``: times in ms per minibatch, sizes in bytes."""

    node_id: str
    desc: str
    fwd_ms: float
    bwd_ms: float
    activation_bytes: tuple[float, ...]
    param_bytes: float
    stage_id: int | None = None

    @property
    def kind(self) -> str:
        """The operator's class name, e.g. ``Conv2d`` for ``Conv2d(3, 64, ...)``."""
        return re.split(r"[(\s]", self.desc.strip(), maxsplit=1)[0] or "node"


def _aliases_input(node: GraphNode) -> bool:
    """Whether a node's output shares its input's storage (``ReLU(inplace)``, views): it saves no bytes."""
    d = node.desc
    return "inplace" in d or node.kind in ("View", "Size", "Flatten", "Identity", "__getitem__")


@dataclass(frozen=True)
class PipeDreamGraph:
    """A parsed ``graph.txt``: nodes in file order and directed edges ``(a, b)`` by node id."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[str, str], ...]

    def topological_order(self) -> list[GraphNode]:
        """Nodes in a stable topological order: among ready nodes, the smallest ``nodeN`` number first
        (file order for ids without a number), so a chain keeps its natural order."""
        import networkx as nx

        index = {n.node_id: i for i, n in enumerate(self.nodes)}
        graph = nx.DiGraph(list(self.edges))
        graph.add_nodes_from(index)

        def key(node_id: str) -> tuple[float, int]:
            m = re.fullmatch(r"node(\d+)", node_id)
            return (float(m.group(1)) if m else math.inf, index[node_id])

        order: list[GraphNode] = []
        try:
            for v in nx.lexicographical_topological_sort(graph, key=key):
                order.append(self.nodes[index[v]])
        except nx.NetworkXUnfeasible:
            stuck = sorted(set(index) - {n.node_id for n in order})[:5]
            raise ValueError(f"the graph has a cycle (nodes {', '.join(stuck)} ... never become ready); "
                             "a PipeDream profile must be a DAG - check the edge lines") from None
        return order


def _number(text: str, field: str, where: str) -> float:
    t = text.strip()
    if not _FLOAT.match(t):
        raise ValueError(f"{where}: {field}={text!r} is not a number; the file is corrupt or not a "
                         "PipeDream graph.txt")
    v = float(t)
    if v < 0:
        raise ValueError(f"{where}: {field}={v} is negative; times and sizes must be >= 0 - "
                         "fix or re-create the profile")
    return v


def parse_graph(text: str, *, source: str = "graph.txt") -> PipeDreamGraph:
    """Parse the text of a PipeDream ``graph.txt``; a ValueError names the file and line of a bad one."""
    nodes: list[GraphNode] = []
    edges: list[tuple[str, str]] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        m = _NODE_RE.match(line)
        if m and not line[0].isspace():
            nid = m.group("id")
            if nid in seen:
                raise ValueError(f"{where}: node {nid!r} is defined twice; each node needs one line")
            seen.add(nid)
            act = m.group("act").strip()
            parts = [p for p in act[1:-1].split(";") if p.strip()] if act.startswith("[") else [act]
            acts = tuple(_number(p, "activation_size", where) for p in parts)
            stage = m.group("stage")
            nodes.append(GraphNode(
                node_id=nid, desc=m.group("desc").strip(),
                fwd_ms=_number(m.group("fwd"), "forward_compute_time", where),
                bwd_ms=_number(m.group("bwd"), "backward_compute_time", where),
                activation_bytes=acts, param_bytes=_number(m.group("param"), "parameter_size", where),
                stage_id=int(stage) if stage is not None else None))
            continue
        e = _EDGE_RE.match(line)
        if e:
            edges.append((e.group("a"), e.group("b")))
            continue
        shown = line if len(line) <= 80 else line[:77] + "..."
        raise ValueError(f"{where}: cannot read {shown!r}; expected a PipeDream graph.txt node line "
                         "'nodeN -- Desc -- forward_compute_time=..., backward_compute_time=..., "
                         "activation_size=..., parameter_size=...' or an edge line '\\tnodeA -- nodeB'")
    if not nodes:
        raise ValueError(f"{source} has no node lines; it is empty or not a PipeDream graph.txt")
    for a, b in edges:
        for v in (a, b):
            if v not in seen:
                raise ValueError(f"{source}: edge {a} -- {b} names node {v!r}, which has no node line")
        if a == b:
            raise ValueError(f"{source}: edge {a} -- {b} is a self-loop; a profile must be a DAG")
    return PipeDreamGraph(nodes=tuple(nodes), edges=tuple(edges))


def infer_batch_size(graph: PipeDreamGraph) -> int | None:
    """The minibatch size the profile was taken at, when the file shows it, else ``None``: the input over
    one 3xHxW float32 image (H of :data:`_IMAGE_SIDES`), or an LSTM's ``h_n`` bytes over ``4 * hidden``."""
    for n in graph.nodes:
        lstm = re.match(r"LSTM\((\d+),\s*(\d+)\)", n.desc.strip())
        hidden = int(lstm.group(2)) if lstm else None
        if hidden and len(n.activation_bytes) >= 2:
            b = n.activation_bytes[1] / (4 * hidden)
            if b >= 1 and b == int(b):
                return int(b)
    for n in graph.nodes:
        if n.kind.startswith("Input") and n.activation_bytes[0] > 0:
            for side in _IMAGE_SIDES:
                b = n.activation_bytes[0] / (3 * side * side * 4)
                if b >= 1 and b == int(b):
                    return int(b)
    return None


def profile_fields(graph: PipeDreamGraph, *, batch_size: int | None = None, model: str = "",
                   source: str = "pipedream") -> dict[str, Any]:
    """Linearize a parsed graph into a Profile's fields, ``layers`` as Layer fields (ms -> s; cuts count
    distinct tensors)."""
    order = graph.topological_order()
    pos = {n.node_id: i for i, n in enumerate(order)}
    edges = sorted({(pos[a], pos[b]) for a, b in graph.edges})
    out_bytes = [int(round(sum(n.activation_bytes))) for n in order]
    # For each producer, the last consumer's position (edges are sorted: dict keeps the largest): the
    # output is alive across every boundary i with pos(producer) <= i < last consumer (sent once).
    last_use = dict(edges)
    n = len(order)
    diff = [0] * (n + 1)
    for a, last in last_use.items():
        diff[a] += out_bytes[a]
        diff[last] -= out_bytes[a]
    cut_bytes = list(itertools.accumulate(diff[:n - 1]))
    layers = tuple(dict(name=node.node_id, kind=node.kind, fwd_s=node.fwd_ms / 1e3, bwd_s=node.bwd_ms / 1e3,
                        out_bytes=out_bytes[i], param_bytes=int(round(node.param_bytes)),
                        saved_bytes=0 if _aliases_input(node) else out_bytes[i])
                   for i, node in enumerate(order))
    inferred = infer_batch_size(graph)
    if batch_size is None:
        batch_size = inferred if inferred is not None else 1
    elif not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer (the minibatch the "
                         "profile was measured at)")
    # The data the first stage loads: the outputs of the graph's input nodes (no predecessors).
    has_pred = {b for _, b in edges}
    input_bytes = sum(out_bytes[i] for i, node in enumerate(order)
                      if i not in has_pred and node.kind.startswith("Input"))
    return dict(layers=layers, cut_bytes=tuple(cut_bytes), batch_size=batch_size, dtype="float32",
                device="cuda", input_bytes=input_bytes, model=model, source=source, edges=tuple(edges))


def shipped(name: str) -> Path:
    """Path of a PipeDream profile shipped with pipelab: ``vgg16``, ``resnet50``, ``alexnet``,
    ``gnmt8`` (PipeDream's ``gnmt``) or ``gnmt16`` (``gnmt_large``)."""
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in SHIPPED:
        raise ValueError(f"no shipped PipeDream profile named {name!r}; choose one of "
                         f"{', '.join(SHIPPED)} or pass the path of a graph.txt")
    return DATA_DIR / SHIPPED[key]


def read_fields(path: str | os.PathLike[str], batch_size: int | None = None,
                model: str | None = None) -> dict[str, Any]:
    """A PipeDream ``graph.txt`` (a path, or a shipped name such as ``"vgg16"``) as a Profile's fields;
    ``batch_size`` overrides the inferred one (1 when none is)."""
    p = Path(path)
    if not p.exists() and isinstance(path, str) and os.sep not in path and not path.endswith(".txt"):
        key = _ALIASES.get(path.strip().lower(), path.strip().lower())
        if key in SHIPPED:
            p = shipped(key)
            model = model or key
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file; pass the path of a PipeDream graph.txt or one of the "
                                f"shipped names {', '.join(SHIPPED)}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{p} is not text; pass a PipeDream graph.txt") from None
    graph = parse_graph(text, source=str(p))
    if model is None:
        stem = p.stem[:-len("_graph")] if p.stem.endswith("_graph") else p.stem
        model = stem if stem != "graph" else p.parent.name
    return profile_fields(graph, batch_size=batch_size, model=model, source=f"pipedream:{p.name}")
