"""Memory per device of a transformer job: weights, gradients, optimizer states, activations.

Model states follow a precision recipe's bytes per parameter (:data:`RECIPES`): mixed-precision Adam
keeps 16-bit weights and gradients plus fp32 master weights and two fp32 moments, ``2 + 2 + 12 = 16``
bytes (Rajbhandari et al., ZeRO, SC'20 §3.1); Megatron-LM accumulates gradients in fp32, 18 bytes
(Megatron-LM's distributed-optimizer guide). ZeRO-1 divides master weights and moments by the data
degree; FSDP (ZeRO-3) divides all three and holds one gathered block at a time.

Activations per layer and microbatch are Korthikanti et al. 2022's ("Reducing Activation
Recomputation in Large Transformer Models") §4, derived term by term in :func:`layer_activation_bytes`
so that GQA, gated MLPs and any ``ffn`` follow: with ``ffn = 4h`` and 16-bit activations they sum to
``sbh (34 + 5as/h)``, ``sbh (10 + 24/t + 5as/ht)`` with tensor parallelism, ``sbh/t (34 + 5as/h)`` with
sequence parallelism, ``34 sbh/t`` with selective recomputation, ``2 sbh`` (``/t`` with sequence
parallelism) with full recomputation. A stage holds the activations of its in-flight microbatches
(:func:`in_flight`), the first stage also the embedding's, the last the head's and the loss's logits.
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

    @property
    def bytes_per_param(self) -> int:
        """All model-state bytes per parameter, unsharded."""
        return self.weights + self.gradients + self.master + self.optimizer


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("mixed-adam", 2, 2, 4, 8, "Rajbhandari et al. SC'20 (ZeRO) §3.1: 2 + 2 + 12 = 16 B/parameter"),
    Recipe("mixed-adam-fp32-grads", 2, 4, 4, 8,
           "Megatron-LM docs, distributed optimizer: bf16/fp16 parameters, fp32 gradients: 18 B/parameter"),
    Recipe("fp32-adam", 4, 4, 0, 8, "fp32 weights and gradients, Adam's two fp32 moments: 16 B/parameter"),
    Recipe("mixed-sgd", 2, 2, 4, 4, "16-bit weights and gradients, fp32 master and one fp32 momentum"),
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


def layer_activation_bytes(model: Transformer, parallel: Parallel) -> int:
    """Bytes one block saves for its backward per microbatch on one device (Korthikanti §4, term by term)."""
    b, s, h, a, f = parallel.microbatch_size, model.seq, model.hidden, model.heads, model.ffn
    t, e = parallel.tensor, model.bytes_per_element
    kv = model.kv_heads / model.heads
    sbh = s * b * h
    split_seq = t if parallel.sequence_parallel else 1
    if parallel.recompute == "full":
        return int(e * sbh / split_seq)                     # the block's input only
    # kept whole on each tensor rank unless sequence-parallel: two norm inputs, the qkv and MLP inputs
    # (e bytes each) and two dropout masks (1 byte each)
    replicated = 4 * e * sbh + 2 * sbh
    # attention core: softmax output and its dropout's output (e bytes) and mask (1 byte), a s^2 b each
    # split over the tensor group: q, k, v, the projection's input, the MLP's intermediate tensors
    mlp_inner = (3 if model.gated_mlp else 2) * e * s * b * f
    split = e * sbh * (1 + 2 * kv) + e * sbh + mlp_inner
    core = 0 if parallel.recompute == "selective" else (2 * e + 1) * a * s * s * b
    return int(replicated / split_seq + split / t + core / t)


def stage_params(model: Transformer, parallel: Parallel, stage: int, blocks: int | None = None) -> int:
    """Parameters one device of pipeline stage ``stage`` holds (its tensor shard of ``blocks`` blocks,
    default ``layers / pipeline``; the embedding on the first stage, the final norm and head on the last;
    a tied head's copy of the embedding too, as Megatron-LM keeps one on the last stage)."""
    t, p = parallel.tensor, parallel.pipeline
    blocks = model.layers // p if blocks is None else blocks
    h = model.hidden
    norms = 2 * h * (2 if model.bias else 1)
    row_bias = 2 * h if model.bias else 0                   # projection and MLP-down biases: replicated
    shard = (model.block_params() - norms - row_bias) // t + norms + row_bias
    n = blocks * shard
    if stage == 0:
        n += model.vocab * h // t + (model.seq * h if model.positions else 0)
    if stage == p - 1:
        n += model.final_norm_params() + (model.vocab * h // t if (not model.tied or p > 1) else 0)
    return n


def end_activation_bytes(model: Transformer, parallel: Parallel, stage: int) -> int:
    """Activation bytes per microbatch the end stages add: the embedding's dropout mask on the first, the
    final norm's and head's inputs and the fp32 logits of the loss on the last (Korthikanti §4.3)."""
    b, s, h = parallel.microbatch_size, model.seq, model.hidden
    t, e = parallel.tensor, model.bytes_per_element
    split_seq = t if parallel.sequence_parallel else 1
    out = 0
    if stage == 0:
        out += s * b * h // split_seq
    if stage == parallel.pipeline - 1:
        out += 2 * e * s * b * h // split_seq + 4 * s * b * model.vocab // t
    return out


def memory_per_device(model: Transformer, parallel: Parallel, schedule: str | None = None, *,
                      recipe: str = "mixed-adam-fp32-grads",
                      stage_layers: Sequence[int] | None = None) -> tuple[MemoryBreakdown, ...]:
    """Peak memory of one device of each pipeline stage (``schedule`` overrides ``parallel.schedule``).

    Args:
        recipe: the precision recipe's name (:data:`RECIPES`).
        stage_layers: blocks per pipeline stage where uneven (default ``layers / pipeline`` each).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    rec = RECIPES[recipe]
    order = schedule or parallel.schedule
    parallel.check(model, stage_layers=stage_layers)
    d, p = parallel.data, parallel.pipeline
    per_layer = layer_activation_bytes(model, parallel)
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
            norms = 2 * model.hidden * (2 if model.bias else 1)
            one_block = (model.block_params() - norms) // parallel.tensor
            gathered = 2 * (rec.weights + rec.gradients) * one_block   # this block's and the next's, gathered
        flight = in_flight(order, i, p, parallel.microbatches, parallel.virtual)
        if parallel.recompute == "full":
            # every stored block input, plus one block's full activations while it recomputes
            full = layer_activation_bytes(model, Parallel(**{**parallel.to_dict(), "recompute": "none"}))
            acts = flight * (layers * per_layer + end_activation_bytes(model, parallel, i)) + full
        else:
            acts = flight * (layers * per_layer + end_activation_bytes(model, parallel, i))
        out.append(MemoryBreakdown(stage=i, weights=w, gradients=g, optimizer=o, activations=int(acts),
                                   gathered=gathered, in_flight=flight))
    return tuple(out)
