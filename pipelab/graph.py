"""The model as a layer graph: torch.fx tracing at module granularity, cuts, and stage modules.

One place decides what a *layer* is, so that the profiler and the runtime always agree: one
``call_module``/``call_function``/``call_method`` node (its head) with the integer ``getitem`` nodes
that unpack its output (``out, (h, c) = lstm(x)`` is one layer), so what crosses a cut is a tensor.
Layers are ordered as their heads in the graph. :func:`live_across_cuts` gives what a cut after each
layer must send (skip connections included); :func:`build_stage` cuts a layer range out as a module.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

LAYER_OPS = ("call_module", "call_function", "call_method")


class LayerTracer(fx.Tracer):
    """An fx tracer whose leaves are standard layers, ``leaf_modules`` and modules below ``depth``."""

    def __init__(self, leaf_modules: Sequence[type[nn.Module]] = (), depth: int | None = None) -> None:
        super().__init__()
        self.leaf_types = tuple(leaf_modules)
        self.depth = depth
        self.output_type: type | None = None
        self._nesting = 0

    def create_arg(self, a: Any) -> Any:
        """As fx's, but a dataclass value (a ``ModelOutput``, say) becomes the dict of its fields that are
        set; the type of the last top-level value (the model's output) is kept in ``output_type`` when it
        is a dataclass or a namedtuple, so a stage can rebuild the output as that type."""
        is_dataclass = dataclasses.is_dataclass(a) and not isinstance(a, type)
        if self._nesting == 0:
            named = is_dataclass or isinstance(a, tuple) and hasattr(a, "_fields")
            self.output_type = type(a) if named else None
        self._nesting += 1
        try:
            if is_dataclass:
                fields = {f.name: getattr(a, f.name) for f in dataclasses.fields(a)}
                a = {k: v for k, v in fields.items() if v is not None}
            return super().create_arg(a)
        finally:
            self._nesting -= 1

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Standard torch.nn layers, ``leaf_modules`` instances, and modules at ``depth`` are leaves."""
        name = module_qualified_name
        return (bool(self.leaf_types) and isinstance(m, self.leaf_types)
                or self.depth is not None and bool(name) and name.count(".") + 1 >= self.depth
                or bool(super().is_leaf_module(m, name)))


def trace(model: nn.Module, *, leaf_modules: Sequence[type[nn.Module]] = (),
          depth: int | None = None, inputs: int | None = None) -> fx.GraphModule:
    """Trace ``model`` into an ``fx.GraphModule`` at layer granularity; ``TypeError`` naming the module
    that failed and the options that would help when fx cannot trace it.

    A Hugging Face causal LM is split at its own parts (:mod:`pipelab.hf`), taking its first
    ``inputs`` (default 1) of ``input_ids, attention_mask, position_ids``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if depth is not None and depth < 1:
        raise ValueError(f"depth={depth} must be >= 1 (1 = the model's direct children are leaves)")
    from pipelab import hf

    root, leaves = model, tuple(leaf_modules)
    if hf.is_hf_model(model):
        root, hf_leaves = hf.split_root(model, inputs or 1)
        leaves += hf_leaves
    tracer = LayerTracer(leaves, depth)
    try:
        graph = tracer.trace(root)
    except Exception as exc:  # fx raises many types (TraceError, TypeError, RuntimeError, ...)
        raise TypeError(_trace_failure(model, exc)) from None
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    gm.meta["output_type"] = tracer.output_type
    return gm


def rebuild_output(kind: type | None, out: Any) -> Any:
    """``out`` as ``kind``, the type the model's forward returns (a dataclass traced as the dict of its
    fields, a namedtuple as a tuple); unchanged when ``kind`` is None."""
    if kind is None or isinstance(out, kind) or not isinstance(out, (dict, tuple)):
        return out
    try:
        return kind(**out) if isinstance(out, dict) else kind(*out)
    except Exception as exc:
        raise TypeError(f"pipelab traced the model's {kind.__name__} output as its fields "
                        f"{sorted(out) if isinstance(out, dict) else len(out)} and cannot rebuild it "
                        f"({type(exc).__name__}: {exc}); return a tensor, "
                        "a tuple or a dict from forward(), or read the dict's keys in loss_fn") from None


def _trace_failure(model: nn.Module, exc: BaseException) -> str:
    """What failed (the innermost module of ``model`` on the traceback) and what would help."""
    paths = {id(m): name for name, m in model.named_modules()}
    failed: nn.Module | None = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and id(owner) in paths:
            failed = owner
        tb = tb.tb_next
    if failed is not None and failed is not model:
        path = paths[id(failed)]
        where = f"module {path!r} ({type(failed).__name__})"
        advice = f"keep it whole: leaf_modules=[{type(failed).__name__}] or depth={path.count('.') + 1}"
    else:
        where = "its own forward()"
        advice = ("move that code into a submodule and keep it whole (leaf_modules=[ThatClass] or "
                  "depth=N), or wrap the model as nn.Sequential of modules that take and return tensors "
                  "(docs/transformers.md)")
    return (f"torch.fx cannot trace {type(model).__name__}: it failed in {where} ({type(exc).__name__}: "
            f"{str(exc)[:300]}). To fix it, {advice}, or remove Python control flow that depends on tensor "
            "values from forward(); Hugging Face GPT-2- and Llama-like causal LMs are split at their own "
            "parts automatically (pipelab.hf)")


def _unpacks(node: fx.Node, layer_of: dict[str, int]) -> bool:
    """Whether ``node`` is ``operator.getitem(v, int)`` of a value ``v`` that a layer produced."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return False
    src, index = node.args
    return isinstance(src, fx.Node) and src.name in layer_of and isinstance(index, int)


def layer_members(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The nodes of every layer: its head first, then the getitems unpacking its output (graph order).

    An integer getitem of layer ``i``'s value joins layer ``i`` even where it sits later in the graph
    (it depends on nothing else); a slice or tensor index stays a layer of its own (it may copy).
    """
    groups: list[list[fx.Node]] = []
    layer_of: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op not in LAYER_OPS:
            continue
        if _unpacks(n, layer_of):
            i = layer_of[n.args[0].name]
            groups[i].append(n)
        else:
            i = len(groups)
            groups.append([n])
        layer_of[n.name] = i
    return groups


def layer_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The layers of a traced model (their head nodes), in topological order."""
    return [members[0] for members in layer_members(gm)]


def _is_value(n: fx.Node) -> bool:
    return n.op in LAYER_OPS or n.op == "placeholder"


def live_across_cuts(gm: fx.GraphModule) -> list[list[str]]:
    """For each boundary ``i`` (after layer ``i``), the values produced at or before layer ``i`` (inputs
    included) and used after it or by the output, in graph order."""
    pos = {n.name: i for i, members in enumerate(layer_members(gm)) for n in members}   # heads and getitems
    n_layers = len(set(pos.values()))
    last_use: dict[str, int] = {}
    produced_at: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            produced_at[n.name] = -1
        elif n.op in LAYER_OPS:
            produced_at[n.name] = pos[n.name]
        user_pos = pos[n.name] if n.op in LAYER_OPS else (n_layers if n.op == "output" else None)
        for inp in n.all_input_nodes:
            if user_pos is not None and _is_value(inp):
                last_use[inp.name] = max(last_use.get(inp.name, -1), user_pos)
    order = [n.name for n in gm.graph.nodes if _is_value(n)]
    return [[v for v in order if produced_at[v] <= i < last_use.get(v, -2)] for i in range(n_layers - 1)]


class StageModule(nn.Module):
    """Layers ``[start, end)`` of a traced model as a module: the values named by ``input_names`` in, a
    tuple of those named by ``output_names`` out (the last stage: the model's output)."""

    def __init__(self, gm: fx.GraphModule, start: int, end: int) -> None:
        super().__init__()
        members = layer_members(gm)
        n = len(members)
        if not (0 <= start < end <= n):
            raise ValueError(f"stage layer range [{start}, {end}) is outside the model's 0..{n} layers")
        cuts = live_across_cuts(gm)
        self.start, self.end, self.is_last = start, end, end == n
        # the whole live set at the start (values a later stage needs pass through), or the model's inputs
        self.input_names = (cuts[start - 1] if start
                            else [n.name for n in gm.graph.nodes if n.op == "placeholder"])
        self.output_names = [] if self.is_last else cuts[end - 1]
        # copying in graph order keeps every node after its inputs
        selected = {n.name for group in members[start:end] for n in group}
        graph = fx.Graph()
        env: dict[str, fx.Node] = {name: graph.placeholder(name) for name in self.input_names}
        attr_nodes = {n.name: n for n in gm.graph.nodes if n.op == "get_attr"}

        def lookup(node: fx.Node | str) -> fx.Node:
            name = node if isinstance(node, str) else node.name
            if name not in env and name in attr_nodes:
                env[name] = graph.node_copy(attr_nodes[name], lookup)
            if name not in env:
                raise RuntimeError(f"stage [{start}, {end}) needs value {name!r} that is not alive "
                                   f"at its input; this is a bug in cut computation")
            return env[name]

        for node in gm.graph.nodes:
            if node.name in selected:
                env[node.name] = graph.node_copy(node, lookup)
        if self.is_last:
            out_node = next(n for n in gm.graph.nodes if n.op == "output")
            graph.output(fx.map_arg(out_node.args[0], lookup))
        else:
            graph.output(tuple(lookup(name) for name in self.output_names))
        graph.lint()
        self.graph_module = fx.GraphModule(gm, graph, f"Stage_{start}_{end}")
        self.output_type: type | None = gm.meta.get("output_type")   # the model's output type

    def forward(self, *inputs: Any) -> Any:
        """Run the stage's layers on the live values entering it (the last stage: the model's output,
        of the type the model's forward returns)."""
        out = self.graph_module(*inputs)
        return rebuild_output(self.output_type, out) if self.is_last else out


def build_stage(model_or_gm: nn.Module, start: int, end: int, *,
                leaf_modules: Sequence[type[nn.Module]] = (), depth: int | None = None) -> StageModule:
    """Cut layers ``[start, end)`` out of a model (traced with the same rules as the profiler)."""
    gm = model_or_gm if isinstance(model_or_gm, fx.GraphModule) else trace(
        model_or_gm, leaf_modules=leaf_modules, depth=depth)
    return StageModule(gm, start, end)


def non_tensor_crossings(gm: fx.GraphModule, args: Sequence[Any]
                         ) -> list[tuple[int, str, str, int, tuple[int, ...]]]:
    """Every value that is not a tensor alive across a boundary, from one forward (no grad) on ``args``:
    ``(boundary, value, its type, producing layer (-1: a model input), using layers after the cut)``.

    The runtime sends only tensors between stages (:func:`pipelab.runtime.comm.boundary_specs`), so a
    cut at such a boundary cannot run; the profiler records them and the partitioners avoid them.
    """
    kinds: dict[str, str] = {}

    class _Kinds(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            if _is_value(n) and not isinstance(value, torch.Tensor):
                kinds[n.name] = type(value).__name__
            return value

    with torch.no_grad():
        _Kinds(gm).run(*args)
    if not kinds:
        return []
    members = layer_members(gm)
    layer_of = {n.name: i for i, group in enumerate(members) for n in group}
    nodes = {n.name: n for n in gm.graph.nodes}
    out = []
    for boundary, live in enumerate(live_across_cuts(gm)):
        for name in live:
            if name in kinds:
                users = tuple(sorted({layer_of[u.name] for u in nodes[name].users
                                      if layer_of.get(u.name, -1) > boundary}))
                out.append((boundary, name, kinds[name], layer_of.get(name, -1), users))
    return out


def as_tuple(value: Any) -> tuple[Any, ...]:
    """Wrap a stage's inputs as a tuple (a lone tensor becomes a 1-tuple)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor inside ``value`` (nested tuples/lists/dicts), using real dtypes."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list, dict)):
        return sum(tensor_bytes(v) for v in (value.values() if isinstance(value, dict) else value))
    return 0
