"""Reserved memory of a torchtitan training step: its allocations recorded on the meta device, replayed
through the CUDA caching allocator.

A training log's "memory" is usually the caching allocator's peak *reserved* bytes, which exceed what
tensors hold (:func:`pipelab.llm.memory_per_device` counts that) by the free space fragmentation and
per-stream pools strand. That excess depends on the order and sizes of every allocation of the step,
so this module builds the order from real code and replays it:

1. **The step**, as torchtitan 9dec370 runs a Llama: its model (``models/llama/model.py``: RMSNorm in
   fp32, rotary embeddings as complex products, grouped-query heads repeated before SDPA, SwiGLU),
   written here with each block's shapes on one rank, on the meta device, where nothing is allocated
   but autograd saves, frees and recomputes as on a GPU. Attention is the CUDA flash kernel
   (``aten._scaled_dot_product_flash_attention``), as SDPA picks on an H100. Checkpointing follows
   ``parallelize_llama.py`` (``"full"``, or ``"selective-op"``'s save list); the loss is
   ``cross_entropy(pred.float())`` with the bf16 logits deleted before the backward, or with a tensor
   group torch's ``loss_parallel`` (``distributed/tensor/parallel/loss.py``: log-softmax over the local
   vocabulary shard, backward ``(zeros_like(x) + exp(x)) * grad``).
2. **Tensor parallelism** (``t > 1``, always with sequence parallelism as torchtitan's ``apply_tp``):
   the norms run on the sequence shard; the attention and MLP inputs are all-gathered and their
   row-parallel outputs reduce-scattered, each as functional collectives do it on a dimension other
   than 0 (a gathered buffer then its concatenation; a concatenation then the shard); the embedding is
   vocabulary-parallel and reduce-scattered, the head's input gathered.
3. **FSDP2** (``torch/distributed/fsdp/_fully_shard``), emulated as allocations around the modules: fp32
   parameter shards; before a unit's forward and backward, the flat bf16 all-gather buffer on the
   copy-in stream, then the unsharded parameters on the compute stream, the buffer freed; resharding
   after forward except the last block and the root (embedding, final norm, head), which stay gathered
   into the backward; the next block prefetched in the backward; after a unit's backward its bf16
   gradients copied into an fp32 reduce-scatter input (held until the next unit's reduce-scatter), the
   sharded fp32 gradients allocated on the reduce-scatter stream and kept until ``zero_grad``; AdamW
   (``foreach``) creating its two fp32 moments at the first step and one temporary per shard each step.
4. **The replay** (:mod:`pipelab.llm.allocator`) of those events, over ``steps`` iterations (the
   published figure is the peak since the start of training).

Not modelled, so the result says what it is: torch.compile and Float8 (they change allocations inside
the blocks), asynchronous TP, pipeline parallelism, an allocator that must free cached pages because the
device is full (the replay reports what it would need).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from pipelab.llm.allocator import Replay, replay
from pipelab.llm.measure import StorageMeter
from pipelab.llm.parallel import Parallel, ParallelError
from pipelab.llm.shape import Transformer

#: the fused attention kernels on torchtitan's save list (``_save_list`` at 9dec370), with torch's CPU one
ATTENTION_OPS = (torch.ops.aten._scaled_dot_product_flash_attention.default,
                 torch.ops.aten._scaled_dot_product_efficient_attention.default,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def op_checkpoint_context() -> Any:
    """torchtitan's per-operator selective checkpointing as a fresh context (one per block call): keep
    every matrix multiply's output but every second one, counted separately in forward and
    recomputation, and the fused attention kernels'; recompute the rest."""
    count: dict[bool, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == torch.ops.aten.mm.default:
            count[ctx.is_recompute] += 1
        every_other_mm = func == torch.ops.aten.mm.default and count[ctx.is_recompute] % 2 == 1
        keep = every_other_mm or func in ATTENTION_OPS
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence, as a functional collective does it on dimension 1."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: int) -> torch.Tensor:
        ctx.t = t
        gathered = x.new_empty((t * x.shape[0], *x.shape[1:]))          # the collective's output
        return torch.cat(torch.chunk(gathered, t, dim=0), dim=1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _ScatterSeq.apply(g, ctx.t), None


class _ScatterSeq(torch.autograd.Function):
    """Reduce-scatter along the sequence, as a functional collective does it on dimension 1."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: int) -> torch.Tensor:
        ctx.t = t
        staged = torch.cat(torch.chunk(x, t, dim=1), dim=0)             # the collective's input
        return staged.new_empty((x.shape[0], x.shape[1] // t, *x.shape[2:]))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _GatherSeq.apply(g, ctx.t), None


def _gather(x: torch.Tensor, t: int) -> torch.Tensor:
    """``x`` gathered along the sequence over a tensor group of ``t`` (itself when ``t`` is 1)."""
    return _GatherSeq.apply(x, t) if t > 1 else x


def _scatter(x: torch.Tensor, t: int) -> torch.Tensor:
    """``x`` reduce-scattered along the sequence over a tensor group of ``t`` (itself when ``t`` is 1)."""
    return _ScatterSeq.apply(x, t) if t > 1 else x


class _LossParallel(torch.autograd.Function):
    """torch's ``loss_parallel`` cross entropy on one rank's vocabulary shard of fp32 logits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        shifted = x - torch.amax(x, -1, keepdim=True)
        result = shifted - torch.log(torch.sum(torch.exp(shifted), -1, keepdim=True))
        del shifted
        ctx.save_for_backward(result)
        return result.new_empty(())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return (torch.zeros_like(x) + torch.exp(x)) * g


class _PostBackward(torch.autograd.Function):
    """Identity whose backward first calls ``callback`` (FSDP2's post-backward hook on a unit's input)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, callback: Callable[[], None]) -> torch.Tensor:
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.callback()
        return g, None


class _RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


def _rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


class _Block(nn.Module):
    """One rank's share of a Llama block (heads and MLP columns divided by ``t``)."""

    def __init__(self, m: Transformer, t: int) -> None:
        super().__init__()
        self.t, self.d = t, m.head_dim
        self.heads, self.kv = m.heads // t, max(m.kv_heads // t, 1)
        h, f = m.hidden, m.ffn // t
        self.attention_norm, self.ffn_norm = _RMSNorm(h), _RMSNorm(h)
        self.wq = nn.Linear(h, self.heads * self.d, bias=False)
        self.wk = nn.Linear(h, self.kv * self.d, bias=False)
        self.wv = nn.Linear(h, self.kv * self.d, bias=False)
        self.wo = nn.Linear(self.heads * self.d, h, bias=False)
        self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def attention(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = _rotate(self.wq(x).view(b, s, self.heads, self.d), freqs)
        k = _rotate(self.wk(x).view(b, s, self.kv, self.d), freqs)
        v = self.wv(x).view(b, s, self.kv, self.d)
        rep = self.heads // self.kv
        k = k[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        v = v[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        out = torch.ops.aten._scaled_dot_product_flash_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, True)[0]
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        t = self.t
        h = x + _scatter(self.attention(_gather(self.attention_norm(x), t), freqs), t)
        z = _gather(self.ffn_norm(h), t)
        return h + _scatter(self.w2(F.silu(self.w1(z)) * self.w3(z)), t)


class _Checkpointed(nn.Module):
    """A block under torchtitan's activation checkpointing (FSDP's hooks sit on this wrapper, so a
    recomputation does not fire them)."""

    def __init__(self, block: _Block, recompute: str) -> None:
        super().__init__()
        self.block, self.recompute = block, recompute

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full":
            return checkpoint(self.block, x, freqs, use_reentrant=False)
        if self.recompute == "selective-op":
            return checkpoint(self.block, x, freqs, use_reentrant=False, context_fn=op_checkpoint_context)
        return self.block(x, freqs)


class _Llama(nn.Module):
    def __init__(self, m: Transformer, t: int, recompute: str) -> None:
        super().__init__()
        self.t = t
        self.tok_embeddings = nn.Embedding(m.vocab // t, m.hidden)
        self.layers = nn.ModuleList(_Checkpointed(_Block(m, t), recompute) for _ in range(m.layers))
        self.norm = _RMSNorm(m.hidden)
        self.output = nn.Linear(m.hidden, m.vocab // t, bias=False)

    def forward(self, ids: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x = _scatter(self.tok_embeddings(ids), self.t)
        for layer in self.layers:
            x = layer(x, freqs)
        x = self.norm(x)                    # rebinding frees the last block's output, as torchtitan's does
        return self.output(_gather(x, self.t))


class _Fsdp:
    """FSDP2's allocations for a model of fully sharded units (each block, and the root's rest)."""

    def __init__(self, model: _Llama, meter: StorageMeter, data: int) -> None:
        self.meter, self.d = meter, data
        root = [p for n, p in model.named_parameters() if not n.startswith("layers.")]
        self.units: dict[str, list[nn.Parameter]] = {"root": root}
        self.units.update({f"layers.{i}": list(layer.parameters()) for i, layer in enumerate(model.layers)})
        self.params = list(model.parameters())
        meter.skip(self.params)
        for p in self.params:                                        # the fp32 shards, kept
            meter.alloc(self._shard(p) * 4)
        self.gathered: dict[str, list[Any]] = {}
        self.grads: list[Any] = []
        self.reduce_input: Any = None
        self.moments: list[Any] | None = None

    def _shard(self, p: torch.Tensor) -> int:
        return math.ceil(p.numel() / self.d)

    def _unit_shard(self, unit: str) -> int:
        """Elements of ``unit``'s shard on one rank (its gathered flat buffer holds ``d`` of them)."""
        return sum(self._shard(p) for p in self.units[unit])

    def unshard(self, unit: str) -> None:
        """All-gather ``unit``'s parameters in bf16 (a no-op when they are gathered)."""
        if unit in self.gathered:
            return
        flat = self.meter.alloc(self._unit_shard(unit) * self.d * 2, "all-gather copy-in")
        self.gathered[unit] = [self.meter.alloc(p.numel() * 2) for p in self.units[unit]]
        self.meter.free(flat)

    def reshard(self, unit: str) -> None:
        """Free ``unit``'s gathered parameters."""
        for key in self.gathered.pop(unit, []):
            self.meter.free(key)

    def post_backward(self, unit: str) -> None:
        """Reshard, then reduce-scatter the unit's gradients into fp32 shards."""
        self.reshard(unit)
        if self.reduce_input is not None:
            self.meter.free(self.reduce_input)
        self.reduce_input = self.meter.alloc(self._unit_shard(unit) * self.d * 4)
        for p in self.units[unit]:
            p.grad = None                                             # the bf16 gradients, copied in
        self.grads.append(self.meter.alloc(self._unit_shard(unit) * 4, "reduce-scatter"))

    def end_backward(self) -> None:
        """The last reduce-scatter's input is released when the backward ends."""
        if self.reduce_input is not None:
            self.meter.free(self.reduce_input)
            self.reduce_input = None

    def optimizer_step(self) -> None:
        """AdamW (foreach): two fp32 moments per shard from the first step, one temporary per shard."""
        sizes = [self._shard(p) * 4 for p in self.params]
        if self.moments is None:
            self.moments = [self.meter.alloc(n) for n in sizes for _ in range(2)]
        for key in [self.meter.alloc(n) for n in sizes]:
            self.meter.free(key)

    def zero_grad(self) -> None:
        """``set_to_none``: the sharded gradients go."""
        for key in self.grads:
            self.meter.free(key)
        self.grads = []

    def hook(self, model: _Llama) -> None:
        """Unshard and reshard around each block's forward; unshard (and prefetch) before its backward,
        reduce after it."""
        last = len(model.layers) - 1

        def around(i: int) -> tuple[Callable[..., None], Callable[..., None]]:
            unit = f"layers.{i}"

            def pre_forward(module: nn.Module, args: Any) -> Any:
                self.unshard(unit)
                if not args[0].requires_grad:
                    return None
                # as FSDP2's RegisterPostBackwardFunction: the reduce runs once the input's gradient is
                # computed, before that gradient reaches the previous block (and its pre-backward)
                return (_PostBackward.apply(args[0], lambda: self.post_backward(unit)), *args[1:])

            def post_forward(module: nn.Module, args: Any, out: torch.Tensor) -> None:
                if i < last:
                    self.reshard(unit)

                def pre_backward(grad: torch.Tensor) -> None:
                    self.unshard(unit)
                    if i > 0:
                        self.unshard(f"layers.{i - 1}")
                out.register_hook(pre_backward)
            return pre_forward, post_forward

        for i, layer in enumerate(model.layers):
            pre, post = around(i)
            layer.register_forward_pre_hook(pre)
            layer.register_forward_hook(post)


@dataclass(frozen=True)
class ReservedMemory:
    """The replay of a torchtitan step: peak reserved and allocated bytes per device, and each step's
    allocated peak (the first differs: AdamW's moments appear at its end)."""

    replay: Replay
    step_peaks: tuple[int, ...]

    @property
    def peak_reserved(self) -> int:
        """Bytes ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]`` would read."""
        return self.replay.peak_reserved

    @property
    def peak_allocated(self) -> int:
        """Bytes ``torch.cuda.max_memory_allocated()`` would read (rounded requests)."""
        return self.replay.peak_allocated

    def describe(self) -> str:
        """One line in GiB."""
        return (f"peak reserved {self.peak_reserved / 2**30:.2f} GiB, peak allocated "
                f"{self.peak_allocated / 2**30:.2f} GiB (reserve {self.replay.reserve_share:+.1%}), replayed "
                f"over {len(self.step_peaks)} steps on the meta device; torch.compile, Float8 and "
                "asynchronous TP not modelled")


def _check(model: Transformer, parallel: Parallel, steps: int) -> None:
    if not (model.gated_mlp and not model.bias and not model.positions and not model.tied):
        raise ParallelError(f"reserved_memory replays torchtitan's Llama (gated MLP, no biases, rotary "
                            f"positions, untied head); {model.name} is not one")
    problems = []
    if parallel.pipeline != 1:
        problems.append(f"pipeline={parallel.pipeline} (pipeline stages are not emulated: use 1)")
    if parallel.sharding != "fsdp":
        problems.append(f"sharding={parallel.sharding!r} (only FSDP2 is emulated: use 'fsdp')")
    if parallel.tensor > 1 and not parallel.sequence_parallel:
        problems.append("tensor > 1 without sequence_parallel (torchtitan's TP always shards the sequence)")
    if parallel.microbatches != 1:
        problems.append(f"microbatches={parallel.microbatches} (without pipeline stages torchtitan takes "
                        "the local batch at once: use 1 and set microbatch_size to the local batch)")
    if parallel.recompute == "selective-op" and parallel.tensor > 1:
        problems.append("recompute='selective-op' with tensor > 1 (the save list's reduce-scatter outputs "
                        "are not emulated: use 'full' or tensor=1)")
    if parallel.recompute not in ("none", "full", "selective-op"):
        problems.append(f"recompute={parallel.recompute!r} (torchtitan's are 'none', 'full', 'selective-op')")
    if model.kv_heads % parallel.tensor and parallel.tensor % model.kv_heads:
        problems.append(f"kv_heads={model.kv_heads} and tensor={parallel.tensor}, neither divides the other")
    if steps < 1:
        problems.append(f"steps={steps} (at least 1)")
    if problems:
        raise ParallelError("reserved_memory cannot replay this configuration: " + "; ".join(problems))
    parallel.check(model)


def reserved_memory(model: Transformer, parallel: Parallel, *, steps: int = 3) -> ReservedMemory:
    """Replay ``steps`` torchtitan training steps of ``model`` under ``parallel`` (FSDP over the data
    group, TP with sequence parallelism over the tensor group) through the caching allocator.

    Raises:
        ParallelError: for what the emulation does not cover, naming each such setting.
    """
    _check(model, parallel, steps)
    t, b, s = parallel.tensor, parallel.microbatch_size, model.seq
    meter = StorageMeter(record=True)
    with torch.device("meta"):
        net = _Llama(model, t, parallel.recompute).to(torch.bfloat16)
        ids = torch.empty(b, s, dtype=torch.long)
        labels = torch.empty(b * s, dtype=torch.long)
        freqs = torch.empty(s, model.head_dim // 2, dtype=torch.complex64)
    fsdp = _Fsdp(net, meter, parallel.data)
    fsdp.hook(net)
    meter.skip([freqs])
    peaks = []
    with meter:
        for _ in range(steps):
            meter.peak = meter.current
            fsdp.zero_grad()
            fsdp.unshard("root")
            pred = net(ids, freqs)                                   # bf16, deleted before the backward
            logits = pred.flatten(0, 1).float()
            loss = _LossParallel.apply(logits) if t > 1 else F.cross_entropy(logits, labels)
            del pred, logits
            loss.backward()
            del loss
            fsdp.post_backward("root")
            fsdp.end_backward()
            fsdp.optimizer_step()
            peaks.append(meter.peak)
    return ReservedMemory(replay(meter.events), tuple(peaks))
