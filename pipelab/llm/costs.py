"""Seconds of a transformer job's pieces on one device: compute, tensor/pipeline/data communication.

Per block and microbatch of ``b`` sequences, on one device of a tensor group of ``t``:

- **Compute.** Each matmul of :meth:`Transformer.matmuls` with its weight split by ``t`` (Megatron-LM,
  Shoeybi et al. 2019: qkv and MLP-up by columns, proj and MLP-down by rows, heads by ``t``) is priced
  by the device's roofline (:meth:`DeviceRates.matmul_s`). Element-wise work (norms, dropout, residual
  adds, the activation function) streams its bytes at the device's element-wise rate; norms and dropout
  divide by ``t`` only with sequence parallelism. Without fused attention the softmax and dropout over
  the ``a s^2 b`` scores stream at the attention core's own rate (``attention_efficiency``, measured on
  Megatron-LM's kernels): forward 4.5 elements a score (softmax read and write, dropout read, write and
  a byte of mask), backward 5.5 (dropout's gradient reads the mask, softmax's reads output and gradient).
  The backward's input gradients (``B``) run each weight matmul once and the attention core's two
  twice, and stream as many of the other element-wise bytes as the forward (the development set, Qi et
  al.'s Table 6, has ``T_B`` within 3% of ``T_F`` on all four models); weight gradients (``W``) are
  matmuls.
- **Tensor communication.** Two all-reduces of the block's ``s b h`` activations forward and two
  backward (Shoeybi et al. §3); with sequence parallelism (Korthikanti et al. 2022 §4.2.2) each becomes
  a reduce-scatter plus an all-gather of the same size, which a ring prices the same.
  With ``tensor_overlap`` the backward's collective of each column-parallel linear's input gradient
  (qkv and MLP-up: the ``f`` operator's all-reduce, or with sequence parallelism its reduce-scatter)
  runs behind that linear's weight-gradient GEMM (Megatron-LM's asynchronous all-reduce, Korthikanti
  §6.2): only what exceeds the GEMM stays exposed, and only where ``B`` computes its weight gradients.
- **Recomputation** adds to ``B``: full, the block's forward and its tensor communication (exposed: a
  recomputed forward has no weight-gradient GEMM to hide it); selective, the attention core
  (Korthikanti §5).
- **Pipeline.** One microbatch's ``s b h / t`` activations between neighbouring stages (scatter-gather,
  Narayanan et al. SC'21 §4.1), then an all-gather inside the receiving tensor group without sequence
  parallelism.
- **Data parallelism.** Gradients (the recipe's gradient bytes) all-reduced over the data group once per
  iteration; behind the last microbatch's backward in buckets when ``dp_overlap``. ZeRO-1 reduce-scatters
  the gradients and all-gathers the updated 16-bit weights; FSDP also all-gathers the weights before
  each forward and backward.
- **Optimizer step.** The recipe's model states of the device's shard streamed through memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipelab.cluster import Cluster
from pipelab.llm.collectives import all_gather_s, allreduce_s, p2p_s, reduce_scatter_s
from pipelab.llm.devices import DeviceRates
from pipelab.llm.memory import RECIPES, Recipe, stage_params
from pipelab.llm.parallel import Parallel, ParallelError
from pipelab.llm.shape import Transformer

#: attention implementations: ``"unfused"`` materializes the ``a s^2 b`` scores (softmax, mask and
#: dropout stream them); ``"flash"`` keeps them on chip (Dao et al. 2022)
ATTENTION = ("unfused", "flash")
#: the block's column-parallel linears (Megatron-LM's ``f`` operator before them all-reduces their input
#: gradient in the backward; Shoeybi et al. 2019 §3)
COLUMN_PARALLEL = ("qkv", "mlp_up")
#: bytes per gradient bucket of the overlapped data-parallel all-reduce (PyTorch DDP's bucket_cap_mb=25)
BUCKET_BYTES = 25 * 2**20


class _PassTotals:
    """A forward's and a backward's seconds with their tensor communication (a block's or a stage's)."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    tensor_comm_forward_s: float
    tensor_comm_backward_s: float
    tensor_comm_backward_hidden_s: float

    @property
    def forward_total_s(self) -> float:
        """Forward compute plus its tensor communication."""
        return self.forward_s + self.tensor_comm_forward_s

    @property
    def backward_total_s(self) -> float:
        """Input and weight gradients plus the backward's exposed tensor communication."""
        return (self.backward_input_s + self.backward_weight_s + self.tensor_comm_backward_s
                - self.tensor_comm_backward_hidden_s)


@dataclass(frozen=True)
class BlockCosts(_PassTotals):
    """Seconds of one block for one microbatch on one device of its tensor group."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    attention_core_s: float
    tensor_comm_forward_s: float
    tensor_comm_backward_s: float
    forward_flops: int
    #: the forward's matmul seconds, the attention core's score-streaming seconds and the other
    #: element-wise bytes (what the development set's ``T_F`` leaves to the element-wise rate)
    matmul_forward_s: float = 0.0
    elementwise_bytes: float = 0.0
    attention_stream_forward_s: float = 0.0
    #: of ``tensor_comm_backward_s``, the seconds that hide behind weight-gradient GEMMs
    #: (``Parallel.tensor_overlap``; 0 without it)
    tensor_comm_backward_hidden_s: float = 0.0


#: elements streamed per attention score by the unfused core: forward (softmax read and write; dropout
#: read, write and its one-byte mask) and backward (dropout's gradient read, mask read and write;
#: softmax's gradient reads output and gradient and writes one)
CORE_FORWARD_ELEMENTS, CORE_BACKWARD_ELEMENTS = 4.5, 5.5


def _elementwise_elements(model: Transformer, parallel: Parallel, attention: str) -> tuple[float, float]:
    """(elements streamed by one block's forward on one device outside the attention core, attention
    scores on that device: ``a s^2 b / t`` unfused, 0 with flash attention)."""
    b, s, h, f, a = parallel.microbatch_size, model.seq, model.hidden, model.ffn, model.heads
    t = parallel.tensor
    split_seq = t if parallel.sequence_parallel else 1
    sbh = s * b * h
    # two norms (read, write), two dropout + residual adds (read two, write one): 10 sbh
    seq_parts = 10 * sbh / split_seq
    act_fn = (3 if model.gated_mlp else 2) * s * b * f / t     # gelu: read, write; swiglu: read two, write
    scores = 0.0 if attention == "flash" else a * s * s * b / t
    return seq_parts + act_fn, scores


def block_costs(model: Transformer, parallel: Parallel, device: DeviceRates, cluster: Cluster | None = None,
                *, attention: str = "unfused", stage: int = 0) -> BlockCosts:
    """Seconds of one block's forward, input and weight gradients and tensor communication."""
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r} is not one of {ATTENTION}")
    t, e, prec = parallel.tensor, model.bytes_per_element, model.precision
    tokens = parallel.microbatch_size * model.seq
    mm_w = mm_core = 0.0
    flops = 0
    column_parallel_w = []      # weight-gradient GEMMs of the linears whose input gradient is reduced
    for mm in model.matmuls(tokens):
        fl = mm.flops / t
        nbytes = mm.operand_bytes(e) / t
        sec = device.matmul_s(fl, nbytes, prec)
        flops += int(fl)
        if mm.weight:
            mm_w += sec
            if mm.name in COLUMN_PARALLEL:
                column_parallel_w.append(sec)
        else:
            mm_core += sec
    elems, scores = _elementwise_elements(model, parallel, attention)
    ew = device.stream_s(e * elems)
    core_f = device.attention_stream_s(e * CORE_FORWARD_ELEMENTS * scores)
    core_b = device.attention_stream_s(e * CORE_BACKWARD_ELEMENTS * scores)
    fwd = mm_w + mm_core + ew + core_f
    comm_f = comm_b = hidden = 0.0
    if t > 1 and cluster is not None:
        group = parallel.workers(stage=stage)
        act = e * tokens * model.hidden
        if parallel.sequence_parallel:
            # backward: all-gather (the reduce-scatter's gradient) before the row-parallel linears,
            # reduce-scatter (the all-gather's gradient) of the column-parallel linears' input gradient
            reduced = reduce_scatter_s(cluster, group, act)
            one = reduced + all_gather_s(cluster, group, act)
        else:
            reduced = one = allreduce_s(cluster, group, act)
        comm_f = comm_b = 2 * one
        if parallel.tensor_overlap:
            hidden = sum(min(reduced, w) for w in column_parallel_w)
    return BlockCosts(forward_s=fwd, backward_input_s=mm_w + 2 * mm_core + ew + core_b,
                      backward_weight_s=mm_w, attention_core_s=mm_core + core_f,
                      tensor_comm_forward_s=comm_f, tensor_comm_backward_s=comm_b, forward_flops=flops,
                      matmul_forward_s=mm_w + mm_core, elementwise_bytes=e * elems,
                      attention_stream_forward_s=core_f, tensor_comm_backward_hidden_s=hidden)


@dataclass(frozen=True)
class StageCosts(_PassTotals):
    """Seconds of one pipeline stage (all its blocks, and the embedding or head at the ends) per
    microbatch, on one device of its tensor group; recomputation is inside ``backward_input_s``."""

    stage: int
    layers: int
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    tensor_comm_forward_s: float
    tensor_comm_backward_s: float
    recompute_s: float
    p2p_s: float
    params: int
    #: seconds of the optimizer step on this stage's shard (once per iteration)
    optimizer_s: float = 0.0
    #: of ``tensor_comm_backward_s``, the seconds hidden behind the weight-gradient GEMMs when the
    #: backward computes them (``Parallel.tensor_overlap``)
    tensor_comm_backward_hidden_s: float = 0.0


@dataclass(frozen=True)
class LlmCosts:
    """Per-stage costs of one pipeline and the once-per-iteration data-parallel and optimizer seconds
    (of the slowest stage)."""

    stages: tuple[StageCosts, ...]
    dp_sync_s: float
    dp_exposed_s: float
    sharding_gather_s: float
    optimizer_s: float

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlmCosts:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**d, "stages": tuple(StageCosts(**s) for s in d["stages"])})


def _head_s(model: Transformer, parallel: Parallel, device: DeviceRates) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of the vocabulary-parallel head and its loss."""
    t, e = parallel.tensor, model.bytes_per_element
    tokens = parallel.microbatch_size * model.seq
    fl = 2 * tokens * model.hidden * model.vocab / t
    nbytes = e * (tokens * model.hidden + model.hidden * model.vocab / t + tokens * model.vocab / t)
    mm = device.matmul_s(fl, nbytes, model.precision)
    # the fused cross-entropy reads the logits forward and writes their gradient backward, streaming
    # at the full HBM rate (one pass each; its softmax statistics are per token, not per logit)
    loss = e * tokens * model.vocab / t / device.hbm_bytes_per_s
    return mm + loss, mm + loss, mm


def _embedding_s(model: Transformer, parallel: Parallel, device: DeviceRates) -> float:
    """Seconds of the embedding lookup (a gather writing ``s b h``) and its dropout."""
    return device.stream_s(3 * model.bytes_per_element * parallel.microbatch_size * model.seq * model.hidden)


def stage_costs(model: Transformer, parallel: Parallel, cluster: Cluster, *,
                device: DeviceRates | str | None = None, attention: str = "unfused",
                recipe: str = "mixed-adam-fp32-grads", allow_slow_tensor: bool = False,
                stage_layers: Sequence[int] | None = None) -> LlmCosts:
    """Per pipeline stage: forward, ``B``, ``W``, tensor and pipeline communication per microbatch; the
    data-parallel gradient sync, the sharding gathers and the optimizer step per iteration.

    Args:
        device: the rates (default: the cluster's device's cited rates, :mod:`pipelab.llm.devices`).
        attention: ``"unfused"`` or ``"flash"`` (:data:`ATTENTION`).
        recipe: the precision recipe (:data:`pipelab.llm.memory.RECIPES`): gradient bytes on the wire.
        stage_layers: blocks per pipeline stage where uneven (default ``layers / pipeline`` each).
    """
    parallel.check(model, cluster, allow_slow_tensor=allow_slow_tensor, stage_layers=stage_layers)
    if parallel.recompute == "selective-op":
        raise ParallelError("recompute='selective-op' (torchtitan's per-operator save list) is modelled for "
                            "memory only (pipelab.llm.memory_per_device); price time with 'none', "
                            "'selective' or 'full'")
    rates = DeviceRates.of(device if device is not None else cluster.devices[0].name)
    p, t, e = parallel.pipeline, parallel.tensor, model.bytes_per_element
    counts = list(stage_layers) if stage_layers is not None else [model.layers // p] * p
    tokens = parallel.microbatch_size * model.seq
    stages = []
    for i in range(p):
        per_stage = counts[i]
        blk = block_costs(model, parallel, rates, cluster, attention=attention, stage=i)
        fwd, b_in, w = (per_stage * blk.forward_s, per_stage * blk.backward_input_s,
                        per_stage * blk.backward_weight_s)
        comm_f, comm_b = per_stage * blk.tensor_comm_forward_s, per_stage * blk.tensor_comm_backward_s
        if parallel.recompute == "full":
            rec, comm_b = per_stage * blk.forward_s, comm_b + comm_f
        elif parallel.recompute == "selective":
            rec = per_stage * blk.attention_core_s
        else:
            rec = 0.0
        group = parallel.workers(stage=i)
        act = e * tokens * model.hidden
        if i == 0:
            fwd += _embedding_s(model, parallel, rates)
            b_in += _embedding_s(model, parallel, rates)
            comm_f += allreduce_s(cluster, group, act) if t > 1 else 0.0
        if i == p - 1:
            hf, hb, hw = _head_s(model, parallel, rates)
            fwd, b_in, w = fwd + hf, b_in + hb, w + hw
            comm_b += allreduce_s(cluster, group, act) if t > 1 else 0.0
        send = 0.0
        if i < p - 1:
            src, dst = group[0], parallel.workers(stage=i + 1)[0]
            send = p2p_s(cluster, src, dst, act / t)
            if t > 1 and not parallel.sequence_parallel:
                send += all_gather_s(cluster, parallel.workers(stage=i + 1), act)
        stages.append(StageCosts(stage=i, layers=per_stage, forward_s=fwd, backward_input_s=b_in + rec,
                                 backward_weight_s=w, tensor_comm_forward_s=comm_f,
                                 tensor_comm_backward_s=comm_b, recompute_s=rec, p2p_s=send,
                                 tensor_comm_backward_hidden_s=per_stage * blk.tensor_comm_backward_hidden_s,
                                 params=stage_params(model, parallel, i, per_stage),
                                 optimizer_s=_optimizer_s(rates, RECIPES[recipe], parallel,
                                                          stage_params(model, parallel, i, per_stage))))
    sync, exposed, gather, opt = _data_parallel(model, parallel, cluster, rates, recipe, stages)
    return LlmCosts(stages=tuple(stages), dp_sync_s=sync, dp_exposed_s=exposed, sharding_gather_s=gather,
                    optimizer_s=opt)


def _optimizer_s(rates: DeviceRates, rec: Recipe, parallel: Parallel, params: int) -> float:
    """Seconds of the optimizer step over a device's shard of ``params``: Adam reads the master weights,
    gradients and moments, writes them back and the 16-bit copy, all at the full HBM rate."""
    shard = params if parallel.sharding == "none" else -(-params // parallel.data)
    return shard * (2 * (rec.master + rec.optimizer) + rec.gradients + rec.weights) / rates.hbm_bytes_per_s


def _data_parallel(model: Transformer, parallel: Parallel, cluster: Cluster, rates: DeviceRates,
                   recipe: str, stages: list[StageCosts]) -> tuple[float, float, float, float]:
    """(gradient sync, its exposed part, sharding gathers, optimizer step) of the slowest stage."""
    rec = RECIPES[recipe]
    d = parallel.data
    worst = (0.0, 0.0, 0.0, 0.0)
    for st in stages:
        group = parallel.data_group(stage=st.stage)
        grads = rec.gradients * st.params
        weights = (rec.gathered_weight_bytes if parallel.sharding == "fsdp" else rec.weights) * st.params
        gather = 0.0
        if d == 1:
            sync = 0.0
        elif parallel.sharding == "none":
            sync = allreduce_s(cluster, group, grads)
        else:
            sync = reduce_scatter_s(cluster, group, grads)
            gather = all_gather_s(cluster, group, weights)
            if parallel.sharding == "fsdp":
                # weights gathered again before every microbatch's forward and backward
                gather += 2 * parallel.microbatches * all_gather_s(cluster, group, weights)
        if parallel.dp_overlap and sync > 0:
            bucket = sync * min(1.0, BUCKET_BYTES / max(grads, 1))
            exposed = max(bucket, sync - (st.backward_input_s + st.backward_weight_s))
        else:
            exposed = sync
        opt = st.optimizer_s
        if exposed + gather + opt > sum(worst[1:]):
            worst = (sync, exposed, gather, opt)
    return worst
