"""One layer measured alone: run on fresh copies of its real inputs, timed forward and backward.

Backward is ``torch.autograd.grad`` of what leaves the layer with respect to its inputs and weights,
which isolates one layer's backward without hooks into the autograd engine. The first, untimed run
counts FLOPs and the bytes autograd saves.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch import nn

from pipelab.profile.hooks import SavedBytes, Timer, Timing
from pipelab.profile.hooks import tensors as _tensors


class LayerRunner:
    """Runs one fx node on given inputs, with the weights it uses, for timing in isolation."""

    def __init__(self, gm: fx.GraphModule, node: fx.Node) -> None:
        self.node = node
        self.params: list[torch.Tensor] = []
        if node.op == "call_module":
            mod = gm.get_submodule(str(node.target))
            self.fn: Callable[..., Any] = mod
            self.params = [p for p in mod.parameters() if p.requires_grad]
            self.kind = type(mod).__name__
        elif node.op == "call_function":
            self.fn = node.target  # type: ignore[assignment]
            self.kind = getattr(node.target, "__name__", str(node.target))
        else:
            method = str(node.target)
            self.fn = lambda obj, *a, **k: getattr(obj, method)(*a, **k)
            self.kind = method

    def __call__(self, args: Any, kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@dataclass
class Pass:
    """One node-by-node pass: the values so far, which need grad, the weights' storages, the timing."""

    env: dict[str, Any]
    requires: dict[str, bool]
    param_ids: set[int]
    timing: Timing


def fresh_inputs(node: fx.Node, env: dict[str, Any], requires: dict[str, bool],
                  origins: dict[int, str] | None = None) -> tuple[Any, Any, list[torch.Tensor]]:
    """Copies of a node's inputs, new autograd leaves where the originals need grad (``origins``: each
    copy's storage address -> the input value's name)."""
    leaves: list[torch.Tensor] = []

    def fresh(a: fx.Node) -> Any:
        v = env[a.name]
        if a.op == "get_attr":
            return v  # weights used directly: the real parameter

        def copy_one(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            leaf = t.detach()
            if requires.get(a.name, False) and t.is_floating_point():
                leaf = leaf.requires_grad_()
                leaves.append(leaf)
            copy = leaf.clone()
            if origins is not None:
                origins[copy.untyped_storage().data_ptr()] = a.name
            return copy

        return fx.node.map_aggregate(v, copy_one)

    return fx.node.map_arg(node.args, fresh), fx.node.map_arg(node.kwargs, fresh), leaves


class Measured(NamedTuple):
    """One layer measured alone: medians, FLOPs, saved bytes less its saved inputs (``saved_inputs``:
    value -> bytes) and the storages it counted (``saved_storages``)."""

    fwd_s: float
    bwd_s: float
    flops: int
    saved_bytes: int
    wgrad_s: float
    saved_inputs: dict[str, int]
    saved_storages: set[int]


def measure_layer(ctx: Pass, runner: LayerRunner, node: fx.Node,
                   handed_on: Callable[[Any], list[Any]] = lambda out: [out]) -> tuple[Measured, Any]:
    """One layer measured alone on fresh copies of its inputs, and its head's output (first run).

    Backward starts from gradients of what leaves the layer (``handed_on``) only, as in training.
    ``wgrad_s``: the backward less the input gradient alone (timed on a second forward), in ``[0, bwd_s]``.
    """
    weights = runner.params + [env_v for a in node.all_input_nodes if a.op == "get_attr"
                               and isinstance(env_v := ctx.env[a.name], torch.Tensor) and env_v.requires_grad]
    first, first_out = _first_run(ctx, runner, node, handed_on, weights)
    tm = ctx.timing
    times: list[tuple[float, float, float]] = []
    for r in range(1, 1 + tm.warmup + tm.repeats):
        args, kwargs, leaves = fresh_inputs(node, ctx.env, ctx.requires)
        t0 = tm.timer.start()
        out = runner(args, kwargs)
        f = tm.timer.stop(t0)
        outs = _grad_outputs(handed_on(out))
        b = _timed_grad(tm.timer, outs, leaves + weights)
        if r > tm.warmup:
            bi = b
            if outs and weights:   # the input gradient alone, on a fresh graph (zero-bubble's B)
                args, kwargs, leaves = fresh_inputs(node, ctx.env, ctx.requires)
                bi = _timed_grad(tm.timer, _grad_outputs(handed_on(runner(args, kwargs))), leaves)
            times.append((f, b, bi))
    f_med, b_med, bi_med = (statistics.median(col) for col in zip(*times))
    return first._replace(fwd_s=f_med, bwd_s=b_med, wgrad_s=min(max(b_med - bi_med, 0.0), b_med)), first_out


def _first_run(ctx: Pass, runner: LayerRunner, node: fx.Node, handed_on: Callable[[Any], list[Any]],
               weights: list[torch.Tensor]) -> tuple[Measured, Any]:
    """The untimed run that counts FLOPs and saved bytes (times left 0), and its output."""
    from torch.utils.flop_counter import FlopCounterMode

    origins: dict[int, str] = {}
    args, kwargs, leaves = fresh_inputs(node, ctx.env, ctx.requires, origins)
    counter = SavedBytes(ctx.param_ids, origins)
    with FlopCounterMode(display=False) as fc, torch.autograd.graph.saved_tensors_hooks(
            counter.pack, counter.unpack):
        out = runner(args, kwargs)
    flops = int(fc.get_total_flops())
    got = Measured(0.0, 0.0, flops, counter.total, 0.0, dict(counter.saved_inputs), set(counter.storages))
    del counter
    if flops == 0 and isinstance(runner.fn, nn.RNNBase):
        got = got._replace(flops=_rnn_flops(runner.fn, args[0]))
    _timed_grad(ctx.timing.timer, _grad_outputs(handed_on(out)), leaves + weights)
    return got, out


def _grad_outputs(value: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(value) if t.requires_grad]


def _timed_grad(timer: Timer, outs: list[torch.Tensor], wrt: list[torch.Tensor]) -> float:
    """Seconds of ``torch.autograd.grad`` of ``outs`` (all-ones gradients) w.r.t. ``wrt`` (0 if none)."""
    if not (outs and wrt):
        return 0.0
    grads = [torch.ones_like(t) for t in outs]
    t0 = timer.start()
    torch.autograd.grad(outs, wrt, grads, allow_unused=True)
    return timer.stop(t0)


def _rnn_flops(rnn: nn.RNNBase, x: Any) -> int:
    """Matmul FLOPs of a recurrent layer (fused kernels the flop counter misses): ``2 G H (in + H)`` per
    token, direction and layer, ``G`` gates."""
    if isinstance(x, nn.utils.rnn.PackedSequence):
        tokens = int(x.data.shape[0])
    elif isinstance(x, torch.Tensor) and x.dim() >= 2:
        tokens = x.numel() // x.shape[-1]
    else:
        return 0
    gates = {"LSTM": 4, "GRU": 3}.get(rnn.mode, 1)
    dirs = 2 if rnn.bidirectional else 1
    h = rnn.hidden_size
    return tokens * sum(dirs * 2 * gates * h * ((rnn.input_size if layer == 0 else h * dirs) + h)
                        for layer in range(rnn.num_layers))
