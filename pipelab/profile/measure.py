"""The profiler: measure a model layer by layer and return a :class:`~pipelab.profile.records.Profile`.

As PipeDream's profiler (SOSP'19 §3.1), per layer (:func:`pipelab.graph.layer_members`): forward
time, timed inside whole forward passes; backward time, of the layer alone (:mod:`.layer_timing`);
output, weight and saved bytes, FLOPs, and the bytes alive across every cut. With ``whole=True`` the
layers' times are scaled to add up to a timed training step. Times are medians over ``repeats``.
"""

from __future__ import annotations

import copy
import functools
import operator
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from pipelab.graph import (
    LAYER_OPS,
    layer_members,
    live_across_cuts,
    non_tensor_crossings,
    rebuild_output,
    tensor_bytes,
    trace,
)
from pipelab.hf import is_hf_model
from pipelab.profile.checks import warn_dominant_layer
from pipelab.profile.hooks import Timer as _Timer
from pipelab.profile.hooks import Timing
from pipelab.profile.hooks import detach as _detach
from pipelab.profile.hooks import tensors as _tensors
from pipelab.profile.layer_timing import LayerRunner, Pass, measure_layer
from pipelab.profile.loss import measure_loss
from pipelab.profile.records import BlockedCut, Layer, Profile
from pipelab.tensor_split import LayerSplit, find_splits
from pipelab.ties import find_ties
from pipelab.tracing import TracingConfig


class _Group:
    """One layer's nodes: the head, the getitems unpacking its output, and which values leave it."""

    def __init__(self, members: Sequence[fx.Node]) -> None:
        self.head, self.rest = members[0], list(members[1:])
        names = {n.name for n in members}
        # values handed on: used by a node of another layer or by the model's output
        self.leaving = [n.name for n in members if any(u.name not in names for u in n.users)]

    def unpack(self, head_value: Any) -> dict[str, Any]:
        """The values of all the layer's nodes, given the head's output (the getitems run here)."""
        vals = {self.head.name: head_value}
        for n in self.rest:  # each is operator.getitem(earlier member, int) (see layer_members)
            src, index = n.args
            assert isinstance(src, fx.Node) and isinstance(index, int)
            vals[n.name] = vals[src.name][index]
        return vals

    def handed_on(self, head_value: Any) -> list[Any]:
        """What leaves the layer (the head's output when nothing does: a layer used for its effect)."""
        if not self.leaving:
            return [head_value]
        vals = self.unpack(head_value)
        return [vals[name] for name in self.leaving]


def profile(model: nn.Module, sample_input: Any, *, device: str | torch.device = "cpu", warmup: int = 1,
            repeats: int = 3, leaf_modules: Sequence[type[nn.Module]] = (), depth: int | None = None,
            loss_fn: Callable[..., torch.Tensor] | None = None, target: Any = None, progress: bool = True,
            model_name: str | None = None, small_batch: int | str | None = "auto",
            whole: bool = True) -> Profile:
    """Measure ``model`` on ``sample_input`` (one minibatch) layer by layer.

    The model runs in its current mode (``model.train()`` for training costs); its buffers are restored.

    Args:
        sample_input: a tensor or a tuple of the forward's positional inputs, batch dimension first;
            its batch size is the profile's ``batch_size``.
        warmup, repeats: untimed and timed runs per layer; times are medians.
        leaf_modules, depth: the layer granularity (:func:`pipelab.graph.trace`).
        loss_fn, target: the training loss, ``loss_fn(output, target)`` (or ``loss_fn(output)``),
            timed into the last layer; the bytes it saves are ``loss_saved_bytes``.
        small_batch: a second, smaller batch (``"auto"``: a quarter; None: none) whose times give
            each layer's part that does not shrink with the batch (``fwd_fixed_s``/``bwd_fixed_s``).
        whole: scale the layers' forward and backward times to whole training passes, timed too.
    """
    _check_counts(warmup, repeats, has_target=target is not None, has_loss=loss_fn is not None)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but CUDA is not available here; profile with device='cpu' "
                         "or run on a machine with a GPU")
    name = model_name or type(model).__name__
    gm, args, buffers = _traced(model, sample_input, dev, name, leaf_modules, depth)
    batch = next((int(a.shape[0]) for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), 1)
    small = _small_batch(small_batch, batch)
    if isinstance(target, torch.Tensor):
        target = target.to(dev)
    run = _Timing(gm, dev, name, warmup, repeats, loss_fn, whole)
    grad_was = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(True)  # backward timing needs autograd even if called under no_grad()
        layers, value_bytes, edges, loss_saved = run.timed(args, target, progress)
        if small is not None:
            layers = run.with_fixed_parts(layers, args, target, batch, small)
        crossings = non_tensor_crossings(gm, args)
    finally:
        torch.set_grad_enabled(grad_was)
        with torch.no_grad():
            state = gm.state_dict(keep_vars=True)
            for k, v in buffers.items():
                state[k].copy_(v)
    live = live_across_cuts(gm)
    cut_bytes = tuple(sum(value_bytes.get(v, 0) for v in cut) for cut in live)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    floating = [p for p in gm.parameters() if p.is_floating_point()]
    dtype = str(floating[0].dtype if floating else torch.get_default_dtype()).replace("torch.", "")
    source = "measured"
    if run.scales:
        source += ("; layer times scaled to whole passes: forward "
                   + ", ".join(f"x{f:.3f}" for f, _ in run.scales)
                   + ", backward " + ", ".join(f"x{b:.3f}" for _, b in run.scales)
                   + (f" (batch {batch}, {small})" if len(run.scales) > 1 else ""))
    prof = Profile(layers=tuple(layers), cut_bytes=cut_bytes, batch_size=batch, dtype=dtype, device=str(dev),
                   input_bytes=sum(value_bytes.get(p, 0) for p in placeholders), model=name,
                   source=source, edges=tuple(sorted(set(edges))), loss_saved_bytes=loss_saved,
                   blocked_cuts=_blocked(crossings, [ly.name for ly in layers]),
                   tracing=TracingConfig.of(leaf_modules, depth,
                                            inputs=len(args) if is_hf_model(model) else None),
                   ties=find_ties(gm), tensor_splits=_tensor_splits(model, gm, value_bytes))
    warn_dominant_layer(prof, gm)
    return prof


def _tensor_splits(model: nn.Module, gm: fx.GraphModule, value_bytes: dict[str, int]
                   ) -> tuple[LayerSplit, ...]:
    """The model's ``tensor_parallel_plan`` applied to its layers (none: the model declares none)."""
    plan = getattr(model, "tensor_parallel_plan", None)
    return find_splits(gm, plan, value_bytes, model) if isinstance(plan, dict) and plan else ()


def _blocked(crossings: Sequence[tuple[int, str, str, int, tuple[int, ...]]], names: Sequence[str]
             ) -> tuple[BlockedCut, ...]:
    """The profile's records of :func:`pipelab.graph.non_tensor_crossings`, layers by name."""
    return tuple(BlockedCut(boundary=b, value=v, kind=k, producer=names[p] if p >= 0 else "",
                            users=tuple(names[u] for u in users)) for b, v, k, p, users in crossings)


def _check_counts(warmup: int, repeats: int, *, has_target: bool, has_loss: bool) -> None:
    """Raise ``ValueError`` saying what to pass for a bad count, or a target without its loss."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")
    if has_target and not has_loss:
        raise ValueError("target= is given without loss_fn=: pass the loss too (loss_fn(output, target), "
                         "the function pl.train takes), or leave target out")


def _traced(model: nn.Module, sample_input: Any, dev: torch.device, name: str,
            leaf_modules: Sequence[type[nn.Module]], depth: int | None
            ) -> tuple[fx.GraphModule, tuple[Any, ...], dict[str, torch.Tensor]]:
    """The traced model on ``dev``, the sample's arguments there (checked by one forward) and the
    model's buffers as they were before it, to restore."""
    if not isinstance(sample_input, (torch.Tensor, tuple, list)):
        raise TypeError(f"sample_input must be a tensor or a tuple of the model's positional inputs, "
                        f"got {type(sample_input).__name__}")
    given = (sample_input,) if isinstance(sample_input, torch.Tensor) else tuple(sample_input)
    args = tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in given)
    if any(p.device != dev for p in model.parameters()) or any(b.device != dev for b in model.buffers()):
        model = copy.deepcopy(model).to(dev)
    gm = trace(model, leaf_modules=leaf_modules, depth=depth, inputs=len(args))
    buffers = {k: v.detach().clone() for k, v in gm.state_dict(keep_vars=True).items()
               if not isinstance(v, nn.Parameter)}
    try:
        with torch.no_grad():
            gm(*args)
    except Exception as exc:
        shown = ", ".join(f"{tuple(a.shape)} {str(a.dtype).replace('torch.', '')}"
                          if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
        raise ValueError(f"the sample input ({shown}) does not fit {name}: {type(exc).__name__}: "
                         f"{exc}. Pass one minibatch shaped as the model's forward() expects (a tensor, or a "
                         "tuple of its positional inputs, batch dimension first)") from None
    return gm, args, buffers


def _small_batch(small_batch: int | str | None, batch: int) -> int | None:
    """The second batch size to time (``"auto"``: a quarter of ``batch``), checked."""
    if small_batch == "auto":
        return batch // 4 if batch >= 4 else None
    if small_batch is not None and not (isinstance(small_batch, int) and 1 <= small_batch < batch):
        raise ValueError(f"small_batch={small_batch!r} must be an integer in 1..{batch - 1}: a smaller batch "
                         f"than the sample's {batch} (e.g. the microbatch size)")
    return small_batch if isinstance(small_batch, int) else None


class _Timing:
    """How one profile times its layers at a batch size: layer by layer, the loss, the whole passes."""

    def __init__(self, gm: fx.GraphModule, dev: torch.device, name: str, warmup: int, repeats: int,
                 loss_fn: Callable[..., torch.Tensor] | None, whole: bool) -> None:
        self.gm, self.dev, self.name = gm, dev, name
        self.warmup, self.repeats, self.loss_fn, self.whole = warmup, repeats, loss_fn, whole
        self.param_ids = {p.untyped_storage().data_ptr() for p in gm.parameters()}
        self.scales: list[tuple[float, float]] = []     # (forward, backward) factor per batch size timed

    def timed(self, a: tuple[Any, ...], y: Any, show: bool
              ) -> tuple[list[Layer], dict[str, int], list[tuple[int, int]], int]:
        """(layers, bytes per value, edges, the loss's saved bytes) at the batch of ``a``."""
        gm, warmup, repeats = self.gm, self.warmup, self.repeats
        timer = _Timer(self.dev)
        timing = Timing(timer, warmup, repeats)
        layers, value_bytes, edges, counted = _measure(gm, a, timing, show, self.name)
        fwd, output, output_values = _forward_in_context(gm, a, timer, warmup, repeats)
        layers = [replace(layer, fwd_s=f) for layer, f in zip(layers, fwd)]
        saved = 0
        if self.loss_fn is not None:
            typed = rebuild_output(gm.meta.get("output_type"), output)
            lc = measure_loss(self.loss_fn, typed, y, params=self.param_ids, output_values=output_values,
                              counted=counted, timing=timing)
            last = layers[-1]
            layers[-1] = replace(last, fwd_s=last.fwd_s + lc.fwd_s, bwd_s=last.bwd_s + lc.bwd_s)
            saved = lc.saved_bytes
        if self.whole:
            f_all, b_all = _whole_passes(gm, a, y, self.loss_fn, timer, warmup, max(3 * repeats, 10))
            layers, factors = _scaled_to(layers, f_all, b_all)
            self.scales.append(factors)
        return layers, value_bytes, edges, saved

    def with_fixed_parts(self, layers: list[Layer], args: tuple[Any, ...], target: Any, batch: int,
                         small: int) -> list[Layer]:
        """``layers`` with the part of each time that does not shrink with the batch, fitted through
        the times on the first ``small`` samples."""
        def first(v: Any) -> Any:
            whole = isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch
            return v[:small] if whole else v

        try:
            small_layers = self.timed(tuple(first(a) for a in args), fx.node.map_aggregate(target, first),
                                      False)[0]
        except Exception as exc:
            raise ValueError(f"small_batch={small}: the model (or loss_fn) failed on the first "
                             f"{small} samples ({type(exc).__name__}: {exc}); a loss_fn tied to the "
                             "whole batch's targets cannot run on fewer samples: pass the targets as target= "
                             "(their first samples are used), or profile without small_batch") from None
        return [_fit_fixed(layer, s, batch, small) for layer, s in zip(layers, small_layers)]


def _whole_passes(gm: fx.GraphModule, args: tuple[Any, ...], target: Any,
                  loss_fn: Callable[..., torch.Tensor] | None, timer: _Timer, warmup: int,
                  steps: int) -> tuple[float, float]:
    """Median seconds of the whole model's forward (with the loss) and backward over ``steps`` training
    steps after ``max(warmup, 2)`` untimed ones; their gradients are dropped."""
    fs, bs = [], []
    for i in range(max(warmup, 2) + steps):
        t0 = timer.start()
        out = gm(*args)
        if loss_fn is None:
            loss = sum(t.float().sum() for t in _tensors(out) if t.is_floating_point() and t.requires_grad)
        else:
            out = rebuild_output(gm.meta.get("output_type"), out)
            loss = loss_fn(out, target) if target is not None else loss_fn(out)
        f = timer.stop(t0)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise ValueError("whole=True: the model's output (or loss_fn's value) does not require grad, so "
                             "its backward cannot be timed; pass whole=False")
        t1 = timer.start()
        loss.backward()
        b = timer.stop(t1)
        if i >= max(warmup, 2):
            fs.append(f)
            bs.append(b)
    for p in gm.parameters():
        p.grad = None
    return statistics.median(fs), statistics.median(bs)


def _scaled_to(layers: list[Layer], fwd_all: float,
               bwd_all: float) -> tuple[list[Layer], tuple[float, float]]:
    """``layers`` scaled to add up to ``fwd_all`` and ``bwd_all``, and the two factors."""
    f_sum, b_sum = sum(x.fwd_s for x in layers), sum(x.bwd_s for x in layers)
    ff, fb = fwd_all / f_sum if f_sum > 0 else 1.0, bwd_all / b_sum if b_sum > 0 else 1.0
    return [replace(x, fwd_s=x.fwd_s * ff, bwd_s=x.bwd_s * fb,
                    wgrad_s=None if x.wgrad_s is None else x.wgrad_s * fb) for x in layers], (ff, fb)


def _fit_fixed(layer: Layer, small: Layer, batch: int, b: int) -> Layer:
    """``layer`` (timed at ``batch``) with the fixed parts of the affine fit through ``small`` (at ``b``)."""
    def fixed(t_big: float, t_small: float) -> float:
        return min(max((t_small * batch - t_big * b) / (batch - b), 0.0), t_big)

    return replace(layer, fwd_fixed_s=fixed(layer.fwd_s, small.fwd_s),
                   bwd_fixed_s=fixed(layer.bwd_s, small.bwd_s))


def _measure(gm: fx.GraphModule, args: tuple[Any, ...], timing: Timing, progress: bool, name: str
             ) -> tuple[list[Layer], dict[str, int], list[tuple[int, int]], set[str]]:
    """The layers (saved bytes, backward times; forward times of ``_forward_in_context`` replace
    theirs), each value's bytes, the layer graph's edges, and the values some layer's saved bytes count."""
    from tqdm.auto import tqdm

    walk = _LayerWalk(gm, Pass({}, {}, {p.untyped_storage().data_ptr() for p in gm.parameters()}, timing))
    env = walk.ctx.env
    last_use = _last_use(gm.graph.nodes)
    placeholders = iter(args)
    bar = tqdm(total=len(walk.groups), desc=f"profiling {name}", disable=not progress, leave=False)
    try:
        for idx, node in enumerate(gm.graph.nodes):
            if node.op == "placeholder":
                v = next(placeholders, None)
                walk.value(node.name, v, False)
            elif node.op == "get_attr":
                env[node.name] = attr = _attr(gm, node)
                walk.ctx.requires[node.name] = isinstance(attr, torch.Tensor) and attr.requires_grad
            elif node.name in walk.groups:  # a layer's head (its getitems' values are computed with it)
                walk.layer(node)
                bar.update(1)
            # free values nobody needs any more (as fx.Interpreter does), keeping memory at one pass
            for inp in node.all_input_nodes:
                if last_use.get(inp.name) == idx and node.op != "output":
                    env.pop(inp.name, None)
            if node.op in LAYER_OPS and not node.users:
                env.pop(node.name, None)
    finally:
        bar.close()
    return walk.result()


class _LayerWalk:
    """What :func:`_measure` gathers layer by layer. A value a layer saves of its inputs is counted once,
    at the layer that produces it (a stage holds its output until its backward), unless that layer
    saves it itself; a model input is the profile's ``input_bytes``."""

    def __init__(self, gm: fx.GraphModule, ctx: Pass) -> None:
        self.gm, self.ctx = gm, ctx
        self.groups = {members[0].name: _Group(members) for members in layer_members(gm)}
        self.pos = {n.name: i for i, g in enumerate(self.groups.values()) for n in [g.head, *g.rest]}
        self.value_bytes: dict[str, int] = {}
        self.consumer_saved: dict[str, int] = {}
        self.producer_saved: set[str] = set()
        self.outputs_of: dict[int, list[str]] = {}     # layer index -> its output values
        self.layers: list[Layer] = []
        self.edges: list[tuple[int, int]] = []
        self.counted_params: set[int] = set()
        self.used_names: set[str] = set()

    def value(self, name: str, v: Any, requires: bool) -> None:
        """Record value ``name``: kept for the layers that read it, and its bytes."""
        self.ctx.env[name] = v
        self.ctx.requires[name] = requires
        self.value_bytes[name] = tensor_bytes(v)

    def layer(self, node: fx.Node) -> None:
        """Measure the layer headed by ``node`` and record its values."""
        group, runner = self.groups[node.name], LayerRunner(self.gm, node)
        got, out = measure_layer(self.ctx, runner, node, group.handed_on)
        for vname, nbytes in got.saved_inputs.items():
            self.consumer_saved[vname] = max(self.consumer_saved.get(vname, 0), nbytes)
        for vname, v in group.unpack(out).items():
            self.outputs_of.setdefault(len(self.layers), []).append(vname)
            if any(t.untyped_storage().data_ptr() in got.saved_storages for t in _tensors(v)):
                self.producer_saved.add(vname)
            self.value(vname, _detach(v), any(t.requires_grad for t in _tensors(v)))
        param_bytes = param_tensors = 0
        env = self.ctx.env
        for p in runner.params + [env[a.name] for a in node.all_input_nodes
                                  if a.op == "get_attr" and isinstance(env[a.name], nn.Parameter)]:
            if id(p) not in self.counted_params:
                self.counted_params.add(id(p))
                param_bytes += p.numel() * p.element_size()
                param_tensors += 1
        lname = str(node.target) if node.op == "call_module" else node.name
        if lname in self.used_names:
            lname = node.name
        self.used_names.add(lname)
        out_bytes = sum(tensor_bytes(v) for v in group.handed_on(out))
        self.layers.append(Layer(name=lname, kind=runner.kind, fwd_s=got.fwd_s, bwd_s=got.bwd_s,
                                 out_bytes=out_bytes, param_bytes=param_bytes, flops=got.flops,
                                 saved_bytes=got.saved_bytes, wgrad_s=got.wgrad_s,
                                 param_tensors=param_tensors))
        pos = self.pos
        for member in [group.head, *group.rest]:
            self.edges.extend((pos[a.name], pos[member.name]) for a in member.all_input_nodes
                              if a.name in pos and pos[a.name] != pos[member.name])

    def result(self) -> tuple[list[Layer], dict[str, int], list[tuple[int, int]], set[str]]:
        """The layers with the saved inputs counted at their producers, and what :func:`_measure` returns."""
        layers, pos = self.layers, self.pos
        for vname, nbytes in self.consumer_saved.items():
            at = pos.get(vname)
            if at is not None and at < len(layers) and vname not in self.producer_saved:
                layers[at] = replace(layers[at], saved_bytes=layers[at].saved_bytes + nbytes)
        for at, names in self.outputs_of.items():
            if at < len(layers):
                saved = any(v in self.producer_saved or v in self.consumer_saved for v in names)
                layers[at] = replace(layers[at], out_saved=saved)
        counted = self.producer_saved | {v for v in self.consumer_saved
                                         if pos.get(v, len(layers)) < len(layers)}
        return layers, self.value_bytes, self.edges, counted


def _last_use(nodes: Iterable[fx.Node]) -> dict[str, int]:
    """Each value's last reader: node name -> index of the last node that reads it."""
    return {inp.name: i for i, n in enumerate(nodes) for inp in n.all_input_nodes}


def _attr(gm: fx.GraphModule, node: fx.Node) -> Any:
    return functools.reduce(getattr, str(node.target).split("."), gm)


def _forward_in_context(gm: fx.GraphModule, args: tuple[Any, ...], timer: _Timer, warmup: int,
                        repeats: int) -> tuple[list[float], Any, dict[int, str]]:
    """Median forward seconds of every layer timed where it runs, inside whole forward passes; the last
    pass's output (detached) and its tensors' storage addresses -> their fx node names."""
    nodes = list(gm.graph.nodes)
    # only layer heads are timed; the getitems unpacking their outputs run untimed (they copy nothing)
    runners = {members[0].name: LayerRunner(gm, members[0]) for members in layer_members(gm)}
    last_use = _last_use(nodes)
    samples: list[list[float]] = [[] for _ in runners]
    output: Any = None
    output_values: dict[int, str] = {}
    env: dict[str, Any] = {}

    def value(n: fx.Node) -> Any:
        return env[n.name]

    for r in range(warmup + repeats):
        placeholders = iter(args)
        times: list[float] = []
        for idx, node in enumerate(nodes):
            if node.op == "placeholder":
                env[node.name] = next(placeholders, None)
            elif node.op == "get_attr":
                env[node.name] = _attr(gm, node)
            elif node.name in runners:
                a, k = fx.node.map_arg(node.args, value), fx.node.map_arg(node.kwargs, value)
                t0 = timer.start()
                env[node.name] = runners[node.name](a, k)
                times.append(timer.stop(t0))
            elif node.op in LAYER_OPS:  # a getitem unpacking a layer's output
                env[node.name] = operator.getitem(*fx.node.map_arg(node.args, value))
            elif node.op == "output":
                output = _detach(fx.node.map_arg(node.args[0], value))
                output_values = {t.untyped_storage().data_ptr(): a.name for a in node.all_input_nodes
                                 for t in _tensors(env[a.name])}
            for inp in node.all_input_nodes:
                if last_use.get(inp.name) == idx:
                    env.pop(inp.name, None)
        env.clear()  # frees this pass's activations and autograd graph, outside any timer
        if r >= warmup:
            for s, t in zip(samples, times):
                s.append(t)
    return [statistics.median(s) for s in samples], output, output_values
