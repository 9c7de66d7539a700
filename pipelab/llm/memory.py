"""Memory per device of a transformer job: weights, gradients, optimizer states, activations.

Model states follow a precision recipe's bytes per parameter (:data:`RECIPES`): mixed-precision Adam
keeps 16-bit weights and gradients plus fp32 master weights and two fp32 moments, ``2 + 2 + 12 = 16``
bytes (Rajbhandari et al., ZeRO, SC'20 §3.1); Megatron-LM accumulates gradients in fp32, 18 bytes
(Megatron-LM's distributed-optimizer guide). ZeRO-1 divides master weights and moments by the data
degree; FSDP (ZeRO-3) divides all three and holds a gathered block and the next one's with their
unsharded gradients, in the recipe's compute precision where it has one (FSDP2's mixed precision
gathers fp32 shards as bf16).

Activations per layer and microbatch are Korthikanti et al. 2022's ("Reducing Activation
Recomputation in Large Transformer Models") §4, derived term by term in :func:`layer_activation_bytes`
so that GQA, gated MLPs and any ``ffn`` follow: with ``ffn = 4h`` and 16-bit activations they sum to
``sbh (34 + 5as/h)``, ``sbh (10 + 24/t + 5as/ht)`` with tensor parallelism, ``sbh/t (34 + 5as/h)`` with
sequence parallelism, ``34 sbh/t`` with selective recomputation, ``2 sbh`` (``/t`` with sequence
parallelism) with full recomputation. torchtitan's per-operator selective checkpointing
(``"selective-op"``) keeps the block's input and the outputs of the operators on its save list
(:func:`op_saved_bytes`). Korthikanti's counts are Megatron-LM's fused kernels; torch-native Llama
modules keep more (``kernels="eager"``, :data:`KERNELS`: RMSNorm's fp32 copies, the unfused SwiGLU's
extra tensor, no dropout). A stage holds the activations of its in-flight microbatches
(:func:`in_flight`), the first stage also the embedding's, the last the head's and the loss's logits.

On top of what it holds, a device's peak adds the larger of two short-lived terms: the recomputation of
one block in its backward (``"full"``: the whole block's activations; ``"selective-op"``: what the save
list left out), and the loss's backward (:data:`LOSSES`): a loss that upcasts the whole logits to fp32
holds, at the start of the backward, the fp32 log-softmax output, its gradient and its input's gradient.

These are allocated bytes. What a GPU reports as a run's memory is usually the caching allocator's
reserved bytes, which :mod:`pipelab.llm.reserved` replays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipelab.llm.parallel import SCHEDULES, Parallel, ParallelError
from pipelab.llm.shape import Transformer


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of one precision recipe, and where they come from."""

    name: str
    weights: int
    gradients: int
    master: int
    optimizer: int
    source: str
    compute: int = 0

    @property
    def bytes_per_param(self) -> int:
        """All model-state bytes per parameter, unsharded."""
        return self.weights + self.gradients + self.master + self.optimizer

    @property
    def gathered_weight_bytes(self) -> int:
        """Bytes per parameter of an FSDP-gathered weight: ``compute`` (a mixed-precision all-gather that
        casts the stored weights) or, when 0, the stored weights' own."""
        return self.compute or self.weights

    @property
    def gathered_grad_bytes(self) -> int:
        """Bytes per parameter of an unsharded gradient before its reduce-scatter: the compute precision
        where the recipe has one, else the gradients'."""
        return self.compute or self.gradients


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("mixed-adam", 2, 2, 4, 8, "Rajbhandari et al. SC'20 (ZeRO) §3.1: 2 + 2 + 12 = 16 B/parameter"),
    Recipe("mixed-adam-fp32-grads", 2, 4, 4, 8,
           "Megatron-LM docs, distributed optimizer: bf16/fp16 parameters, fp32 gradients: 18 B/parameter"),
    Recipe("fp32-adam", 4, 4, 0, 8, "fp32 weights and gradients, Adam's two fp32 moments: 16 B/parameter"),
    Recipe("mixed-sgd", 2, 2, 4, 4, "16-bit weights and gradients, fp32 master and one fp32 momentum"),
    Recipe("fp32-adam-bf16-compute", 4, 4, 0, 8,
           "FSDP2 mixed precision as torchtitan runs it (parallelize_llama.apply_fsdp, MixedPrecisionPolicy "
           "param_dtype bfloat16, reduce_dtype float32, config_manager defaults at 9dec370): fp32 sharded "
           "weights, gradients and Adam moments (16 B/parameter), blocks gathered and differentiated in "
           "bf16 (2 B)", compute=2),
)}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes one device of a pipeline stage holds, by part."""

    stage: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    gathered: int = 0
    in_flight: float = 0.0

    @property
    def total(self) -> int:
        """All parts together."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.gathered

    def parts(self) -> dict[str, int]:
        """The byte parts by name (and ``total``)."""
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "gathered": self.gathered, "total": self.total}

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    def describe(self) -> str:
        """One line in GiB."""
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in self.parts().items())
        return f"stage {self.stage}: {parts}"


def in_flight(schedule: str, stage: int, pipeline: int, microbatches: int, virtual: int = 1) -> float:
    """Microbatches whose activations stage ``stage`` holds at its peak, in units of the stage's whole
    layers (an interleaved chunk holds ``1/virtual`` of them).

    1F1B: ``p - i``. ZB-H1, whose deferred weight gradients keep activations until ``W``: ``p`` on every
    stage; ZB-H2: ``2p - 1`` (Qi et al. ICLR'24 Table 1: ``p M_B`` and ``(2p - 1) M_B``). GPipe: ``m``.
    Interleaved 1F1B: Megatron-LM's warm-up of ``2 (p - i - 1) + (v - 1) p`` chunks plus the one in its
    steady state (Korthikanti §4.2.3: ``p (1 + (p - 1)/(p v))`` on the first stage).
    """
    p, i, m, v = pipeline, stage, microbatches, virtual
    if schedule not in SCHEDULES:
        raise ParallelError(f"schedule={schedule!r} is not one of {SCHEDULES}")
    if not 0 <= i < p:
        raise ParallelError(f"stage={i} is outside 0..{p - 1}")
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b" or (schedule == "interleaved" and v == 1):
        return float(min(m, p - i))
    if schedule == "zb-h1":
        return float(min(m, p))
    if schedule == "zb-h2":
        return float(min(m, 2 * p - 1))
    chunks = min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1)
    return chunks / v


#: how the loss treats the logits: Megatron-LM's fused vocabulary-parallel cross entropy keeps one fp32
#: copy per microbatch (Korthikanti §4.3); torchtitan's ``cross_entropy(pred.float())`` (train.py at
#: 9dec370) keeps the fp32 log-softmax output, and its backward adds that output's gradient and the
#: gradient of its input, two more fp32 copies, while the output is still held; with a tensor group
#: (torch's ``loss_parallel``, ``torch/distributed/tensor/parallel/loss.py``) the fused backward
#: ``(zeros_like(x) + exp(x)) * grad`` holds three more
LOSSES = ("fused", "upcast")


#: what sequence parallelism keeps of a column-parallel linear's input: Megatron-LM saves its sequence
#: shard and gathers it again in the backward (Korthikanti §4.2.2); torch's DTensor ``SequenceParallel``
#: with ``ColwiseParallel`` (torchtitan's ``apply_tp``) gathers it in the forward and autograd keeps the
#: whole ``s b h``
SEQUENCE_PARALLEL_INPUTS = ("sharded", "gathered")


#: what the block's kernels keep: ``"fused"``, Megatron-LM's fused layer norm (its 16-bit input) and
#: fused SwiGLU (the two projections' outputs and the product), Korthikanti's counts; ``"eager"``,
#: torch-native Llama modules as Hugging Face Transformers (``LlamaRMSNorm``) and torchtitan
#: (``models/norms.py`` at 9dec370) write them: RMSNorm upcasts its input, so autograd keeps the fp32
#: input, the fp32 ``rsqrt`` per row and the 16-bit normalized tensor before the weight, and SwiGLU's
#: ``silu(w1 x) * w3 x`` keeps ``silu``'s output as well
KERNELS = ("fused", "eager")


def _check_kernels(model: Transformer, value: str) -> None:
    if value not in KERNELS:
        raise ValueError(f"kernels={value!r} is not one of {KERNELS}")
    if value == "eager" and not (model.gated_mlp and not model.bias):
        raise ParallelError(f"kernels='eager' describes torch-native Llama blocks (RMSNorm in fp32, unfused "
                            f"SwiGLU); {model.name} is not one (gated_mlp={model.gated_mlp}, "
                            f"bias={model.bias}): use kernels='fused'")


def eager_norm_extra_bytes(model: Transformer, parallel: Parallel) -> int:
    """Bytes one eager RMSNorm keeps beyond a fused norm's 16-bit input, per microbatch on one device:
    its input in fp32 instead (``4 - e`` bytes an element more), the normalized 16-bit tensor (``e``) and
    the fp32 ``rsqrt`` of each row (4 bytes a token), divided by ``t`` with sequence parallelism."""
    b, s, h = parallel.microbatch_size, model.seq, model.hidden
    split_seq = parallel.tensor if parallel.sequence_parallel else 1
    return (4 * s * b * h + 4 * s * b) // split_seq


def _check_sp_inputs(value: str) -> None:
    if value not in SEQUENCE_PARALLEL_INPUTS:
        raise ValueError(f"sequence_parallel_inputs={value!r} is not one of {SEQUENCE_PARALLEL_INPUTS}")


def op_saved_bytes(model: Transformer, parallel: Parallel, attention: str = "flash") -> int:
    """Bytes one block keeps per microbatch on one device under torchtitan's per-operator selective
    checkpointing (``recompute="selective-op"``).

    torchtitan's ``_save_list`` (``parallelize_llama.py`` at 9dec370) saves the outputs of matrix
    multiplies (``aten.mm``), of the fused attention kernels and of the tensor group's reduce-scatters,
    except every second matrix multiply of a block, counted in forward order; the checkpoint keeps the
    block's input; everything else is recomputed in the backward. A Llama block multiplies q, k, v, the
    output projection, the MLP's up (w1), gate (w3) and down (w2) in that order, so q, v, up and down
    are kept (q, v, up without a gated MLP: q, k, v, out, up, down). A row-parallel product (output
    projection, down) is the whole ``s b h`` partial sum on each tensor rank before its reduction.

    Raises:
        ParallelError: for a block with biases (its linears run ``aten.addmm``, which the save list does
            not name).
    """
    if model.bias:
        raise ParallelError(f"recompute='selective-op' models torchtitan's bias-free Llama blocks; "
                            f"{model.name} has biased linears (aten.addmm, not on the save list): use "
                            "recompute='selective' or 'full'")
    b, s, h, a, f = parallel.microbatch_size, model.seq, model.hidden, model.heads, model.ffn
    t, e = parallel.tensor, model.bytes_per_element
    sb = s * b
    kv_cols = model.kv_heads * model.head_dim // t if model.kv_heads % t == 0 else model.head_dim
    products = [sb * h // t, sb * kv_cols, sb * kv_cols, sb * h, sb * f // t]
    products += [sb * f // t, sb * h] if model.gated_mlp else [sb * h]
    kept = e * sum(products[0::2])
    block_input = e * sb * h // (t if parallel.sequence_parallel else 1)
    core = e * sb * h // t + 4 * a * sb // t if attention == "flash" else 0   # output and fp32 logsumexp
    scatters = 2 * e * sb * h // t if parallel.sequence_parallel else 0
    return block_input + kept + core + scatters


def layer_activation_bytes(model: Transformer, parallel: Parallel, attention: str = "unfused",
                           sequence_parallel_inputs: str = "sharded", kernels: str = "fused") -> int:
    """Bytes one block saves for its backward per microbatch on one device (Korthikanti §4, term by term).

    Args:
        attention: ``"unfused"`` keeps the ``a s^2 b`` softmax output, dropout mask and dropout output;
            ``"flash"`` (Dao et al. 2022) keeps one fp32 softmax statistic per row instead.
        sequence_parallel_inputs: ``"gathered"``: with sequence parallelism the qkv and MLP inputs are
            kept whole (:data:`SEQUENCE_PARALLEL_INPUTS`).
        kernels: ``"fused"`` (Megatron-LM, Korthikanti's counts) or ``"eager"`` (:data:`KERNELS`).
    """
    _check_sp_inputs(sequence_parallel_inputs)
    _check_kernels(model, kernels)
    if attention not in ("unfused", "flash"):
        raise ValueError(f"attention={attention!r} is not one of ('unfused', 'flash')")
    b, s, h, a, f = parallel.microbatch_size, model.seq, model.hidden, model.heads, model.ffn
    t, e = parallel.tensor, model.bytes_per_element
    kv = model.kv_heads / model.heads
    sbh = s * b * h
    split_seq = t if parallel.sequence_parallel else 1
    if parallel.recompute == "full":
        return int(e * sbh / split_seq)                     # the block's input only
    if parallel.recompute == "selective-op":
        return op_saved_bytes(model, parallel, attention)
    # kept whole on each tensor rank unless sequence-parallel: two norm inputs, the qkv and MLP inputs
    # (e bytes each) and two dropout masks (1 byte each; eager Llama blocks have no dropout)
    masks = 0 if kernels == "eager" else 2 * sbh
    replicated = 4 * e * sbh + masks
    if parallel.sequence_parallel and sequence_parallel_inputs == "gathered":
        # the norms' inputs and the masks divide by t below; the qkv and MLP inputs stay whole
        replicated = 2 * e * sbh + masks + 2 * e * sbh * t
    # attention core: softmax output and its dropout's output (e bytes) and mask (1 byte), a s^2 b each
    # split over the tensor group: q, k, v, the projection's input, the MLP's intermediate tensors
    mlp_inner = (3 if model.gated_mlp else 2) * e * s * b * f + (e * s * b * f if kernels == "eager" else 0)
    split = e * sbh * (1 + 2 * kv) + e * sbh + mlp_inner
    if parallel.recompute == "selective":
        core = 0
    elif attention == "flash":
        core = 4 * a * s * b
    else:
        core = (2 * e + 1) * a * s * s * b
    norms = 2 * eager_norm_extra_bytes(model, parallel) if kernels == "eager" else 0
    return int(replicated / split_seq + split / t + core / t) + norms


def block_shard_params(model: Transformer, tensor: int) -> int:
    """Parameters of one block on one device of a tensor group of ``tensor``: the weight matrices and
    column-parallel biases split, the norms and the row-parallel biases (proj, MLP-down) replicated."""
    h = model.hidden
    norms = 2 * h * (2 if model.bias else 1)
    row_bias = 2 * h if model.bias else 0
    return (model.block_params() - norms - row_bias) // tensor + norms + row_bias


def stage_params(model: Transformer, parallel: Parallel, stage: int, blocks: int | None = None) -> int:
    """Parameters one device of pipeline stage ``stage`` holds (its tensor shard of ``blocks`` blocks,
    default ``layers / pipeline``; the embedding on the first stage, the final norm and head on the last;
    a tied head's copy of the embedding too, as Megatron-LM keeps one on the last stage)."""
    t, p = parallel.tensor, parallel.pipeline
    blocks = model.layers // p if blocks is None else blocks
    h = model.hidden
    n = blocks * block_shard_params(model, t)
    if stage == 0:
        n += model.vocab * h // t + (model.seq * h if model.positions else 0)
    if stage == p - 1:
        n += model.final_norm_params() + (model.vocab * h // t if (not model.tied or p > 1) else 0)
    return n


def end_activation_bytes(model: Transformer, parallel: Parallel, stage: int,
                         sequence_parallel_inputs: str = "sharded", kernels: str = "fused") -> int:
    """Activation bytes per microbatch the end stages add: the embedding's dropout mask on the first, the
    final norm's and head's inputs and the fp32 logits of the loss on the last (Korthikanti §4.3); the
    head's input whole when sequence parallelism keeps it ``"gathered"``; with ``kernels="eager"``
    (:data:`KERNELS`) no dropout mask and the final norm's fp32 copies."""
    _check_sp_inputs(sequence_parallel_inputs)
    _check_kernels(model, kernels)
    b, s, h = parallel.microbatch_size, model.seq, model.hidden
    t, e = parallel.tensor, model.bytes_per_element
    split_seq = t if parallel.sequence_parallel else 1
    out = 0
    if stage == 0 and kernels == "fused":
        out += s * b * h // split_seq
    if stage == parallel.pipeline - 1:
        head_split = split_seq if sequence_parallel_inputs == "sharded" else 1
        out += e * s * b * h // split_seq + e * s * b * h // head_split + 4 * s * b * model.vocab // t
        if kernels == "eager":
            out += eager_norm_extra_bytes(model, parallel)
    return out


def recompute_transient_bytes(model: Transformer, parallel: Parallel, attention: str = "unfused",
                              sequence_parallel_inputs: str = "sharded", kernels: str = "fused") -> int:
    """Bytes one block's recomputation adds while its backward runs: ``"full"`` rebuilds all of the
    block's activations, ``"selective-op"`` what its save list left out; 0 otherwise."""
    if parallel.recompute not in ("full", "selective-op"):
        return 0
    whole = layer_activation_bytes(model, Parallel(**{**parallel.to_dict(), "recompute": "none"}), attention,
                                   sequence_parallel_inputs, kernels)
    if parallel.recompute == "full":
        return whole
    return max(0, whole - op_saved_bytes(model, parallel, attention))


def loss_transient_bytes(model: Transformer, parallel: Parallel, loss: str = "fused") -> int:
    """Bytes the loss's backward adds on the last stage beyond the fp32 logits it holds
    (:func:`end_activation_bytes`): none for the fused loss; for ``"upcast"`` two more fp32 copies of the
    ``s b V / t`` logits (the log-softmax's output gradient and input gradient), three with a tensor
    group (loss-parallel's zeros, ``exp`` and their sum, :data:`LOSSES`)."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of {LOSSES}")
    if loss == "fused":
        return 0
    copies = 3 if parallel.tensor > 1 else 2
    return copies * 4 * model.seq * parallel.microbatch_size * model.vocab // parallel.tensor


def memory_per_device(model: Transformer, parallel: Parallel, schedule: str | None = None, *,
                      recipe: str = "mixed-adam-fp32-grads",
                      stage_layers: Sequence[int] | None = None,
                      attention: str = "unfused", loss: str = "fused",
                      sequence_parallel_inputs: str = "sharded",
                      kernels: str = "fused") -> tuple[MemoryBreakdown, ...]:
    """Peak memory of one device of each pipeline stage (``schedule`` overrides ``parallel.schedule``).

    Args:
        recipe: the precision recipe's name (:data:`RECIPES`).
        stage_layers: blocks per pipeline stage where uneven (default ``layers / pipeline`` each).
        attention: ``"unfused"`` or ``"flash"`` (:func:`layer_activation_bytes`).
        loss: ``"fused"`` (default) or ``"upcast"`` (:data:`LOSSES`).
        sequence_parallel_inputs: ``"sharded"`` (default, Megatron-LM) or ``"gathered"`` (DTensor,
            :data:`SEQUENCE_PARALLEL_INPUTS`).
        kernels: ``"fused"`` (default, Megatron-LM) or ``"eager"`` (torch-native Llama, :data:`KERNELS`).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of {LOSSES}")
    rec = RECIPES[recipe]
    order = schedule or parallel.schedule
    parallel.check(model, stage_layers=stage_layers)
    d, p = parallel.data, parallel.pipeline
    _check_sp_inputs(sequence_parallel_inputs)
    _check_kernels(model, kernels)
    per_layer = layer_activation_bytes(model, parallel, attention, sequence_parallel_inputs, kernels)
    counts = list(stage_layers) if stage_layers is not None else [model.layers // p] * p
    out = []
    for i in range(p):
        layers = counts[i]
        n = stage_params(model, parallel, i, layers)
        w, g, o = rec.weights * n, rec.gradients * n, (rec.master + rec.optimizer) * n
        gathered = 0
        if parallel.sharding == "zero1":
            o = -(-o // d)
        elif parallel.sharding == "fsdp":
            w, g, o = -(-w // d), -(-g // d), -(-o // d)
            one_block = block_shard_params(model, parallel.tensor)
            # this block's and the next's, gathered, with their unsharded gradients
            gathered = 2 * (rec.gathered_weight_bytes + rec.gathered_grad_bytes) * one_block
        flight = in_flight(order, i, p, parallel.microbatches, parallel.virtual)
        ends = end_activation_bytes(model, parallel, i, sequence_parallel_inputs, kernels)
        acts = flight * (layers * per_layer + ends)
        acts += max(recompute_transient_bytes(model, parallel, attention, sequence_parallel_inputs, kernels),
                    loss_transient_bytes(model, parallel, loss) if i == p - 1 else 0)
        out.append(MemoryBreakdown(stage=i, weights=w, gradients=g, optimizer=o, activations=int(acts),
                                   gathered=gathered, in_flight=flight))
    return tuple(out)


def check_fits(memory: Sequence[MemoryBreakdown], limit_bytes: int) -> None:
    """Refuse (``ParallelError``) when a stage's device needs more than ``limit_bytes``, naming the worst
    stage's figure, its parts and the limit."""
    worst = max(memory, key=lambda m: m.total)
    if worst.total > limit_bytes:
        parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in worst.parts().items() if k != "total" and v)
        raise ParallelError(f"stage {worst.stage} needs {worst.total / 2**30:.2f} GiB per device ({parts} "
                            f"GiB) but a device has {limit_bytes / 2**30:.2f} GiB; recompute activations, "
                            "shard the optimizer (zero1/fsdp), or use more tensor or pipeline stages")
