"""pipelab's allocated memory of a whole training step against the step itself, measured on this CPU.

A Hugging Face ``LlamaForCausalLM`` (code nobody here wrote) is built from a small configuration in
bf16 and trained one step the way torchtitan's ``train.py`` does: the logits upcast to fp32 for the
cross entropy and deleted before the backward, each decoder layer checkpointed as ``recompute`` says
(``"full"``; ``"selective-op"``, torchtitan's save list: every second matrix multiply and the flash
attention kernel; ``"none"``). The gradients of an earlier step are kept (``zero_grad(set_to_none=
False)``), so the weights and gradients are alive throughout, as pipelab's sum of parts assumes.

:class:`pipelab.llm.measure.StorageMeter` counts the live storages op by op; the measured peak is set
beside ``weights + gradients + activations`` of :func:`pipelab.llm.memory_per_device` (one device,
no optimizer step inside the measured window, ``attention="flash"``: the CPU's SDPA is torch's CPU
flash kernel, which keeps the output and an fp32 logsumexp, as on CUDA).
"""

from __future__ import annotations

from typing import Any

#: the measured shapes: one whose peak is the loss's backward (large vocabulary), one whose peak is a
#: block's recomputation (small vocabulary, wide MLP)
SHAPES: dict[str, dict[str, int]] = {
    "vocab-heavy": dict(layers=4, hidden=256, heads=8, kv_heads=2, ffn=688, vocab=4096, seq=256, batch=2),
    "block-heavy": dict(layers=3, hidden=384, heads=6, kv_heads=6, ffn=1536, vocab=256, seq=384, batch=1),
}
#: for a GPU (``--device cuda``, gpu_checks.py): Llama 3.1 8B's blocks, vocabulary, sequence and local
#: batch as torchtitan's Table 1 run has them, with 4 of its 32 layers (about 50 GB in bf16)
CUDA_SHAPES: dict[str, dict[str, int]] = {
    "llama3-8b-4-layers": dict(layers=4, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                               seq=8192, batch=2),
}
RECOMPUTES = ("full", "selective-op", "none")


def measure(shape: str, recompute: str, device: str = "cpu") -> dict[str, Any]:
    """Measured and predicted peak bytes of one training step of ``shape`` (:data:`SHAPES` or
    :data:`CUDA_SHAPES`) under ``recompute``; on CUDA also the caching allocator's peaks."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipelab.llm import Parallel, Transformer, memory_per_device
    from pipelab.llm.allocator import replay
    from pipelab.llm.measure import StorageMeter, measure_step
    from pipelab.llm.reserved import op_checkpoint_context

    s = {**SHAPES, **CUDA_SHAPES}[shape]
    cfg = LlamaConfig(hidden_size=s["hidden"], intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                      vocab_size=s["vocab"], max_position_embeddings=s["seq"], tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).train()
    if recompute != "none":
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if recompute == "selective-op":
            kwargs["context_fn"] = op_checkpoint_context
        if hasattr(model, "activation_checkpointing_enable"):          # transformers 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=device)
    labels = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=device)

    def step() -> None:
        logits = model(ids, use_cache=False).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        del logits
        loss.backward()

    step()                                          # the gradients now exist and are kept
    params = list(model.parameters())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    measured = measure_step(step, [*params, *(p.grad for p in params if p.grad is not None), ids, labels])
    shape_ = Transformer.from_hf_config(cfg, seq=s["seq"])
    par = Parallel(microbatch_size=s["batch"], microbatches=1, recompute=recompute)
    mem = memory_per_device(shape_, par, recipe="mixed-adam", attention="flash", loss="upcast",
                           kernels="eager")[0]
    predicted = mem.weights + mem.gradients + mem.activations
    out = {"shape": shape, "recompute": recompute, "measured_mib": measured.peak / 2**20,
           "predicted_mib": predicted / 2**20, "error": predicted / measured.peak - 1,
           "held_mib": measured.held / 2**20, "predicted_states_mib": (mem.weights + mem.gradients) / 2**20}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        out["cuda_allocated_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        out["cuda_reserved_peak_mib"] = stats["reserved_bytes.all.peak"] / 2**20
        out["alloc_retries"] = stats.get("num_alloc_retries", 0)
        # the replay against the allocator itself: two steps from an emptied cache, recorded and replayed
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with StorageMeter([*params, ids, labels], record=True) as meter:
            step()
            step()
        torch.cuda.synchronize()
        out["cuda_reserved_two_steps_mib"] = torch.cuda.memory_stats()["reserved_bytes.all.peak"] / 2**20
        out["replayed_reserved_mib"] = replay(meter.events).peak_reserved / 2**20
    return out


def measured_table(results: list[dict[str, Any]]) -> str:
    """The comparison as Markdown."""
    lines = ["| shape | recompute | measured peak MiB | predicted MiB | error | weights + gradients: "
             "measured / predicted MiB |", "|" + "---|" * 6]
    for r in results:
        lines.append(f"| {r['shape']} | {r['recompute']} | {r['measured_mib']:.2f} | "
                     f"{r['predicted_mib']:.2f} | {r['error']:+.1%} | {r['held_mib']:.2f} / "
                     f"{r['predicted_states_mib']:.2f} |")
    return "\n".join(lines)


def run_all() -> list[dict[str, Any]]:
    """Every shape under every recomputation policy."""
    return [measure(shape, rc) for shape in SHAPES for rc in RECOMPUTES]


def main(argv: list[str] | None = None) -> None:
    """Print the CPU table, or with ``--device cuda`` one GPU-sized step with the allocator's peaks."""
    import argparse
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="llama3-8b-4-layers", choices=sorted(CUDA_SHAPES),
                    help="the shape measured with --device cuda")
    ap.add_argument("--recompute", default="selective-op", choices=RECOMPUTES)
    args = ap.parse_args(argv)
    if args.device == "cpu":
        print(measured_table(run_all()))
        return
    r = measure(args.shape, args.recompute, args.device)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)")
    print(f"{args.shape}, {args.recompute}, PYTORCH_CUDA_ALLOC_CONF={conf}: predicted allocated "
          f"{r['predicted_mib'] / 1024:.2f} GiB; storages counted {r['measured_mib'] / 1024:.2f} GiB "
          f"(predicted {r['error']:+.1%}); max_memory_allocated "
          f"{r['cuda_allocated_peak_mib'] / 1024:.2f} GiB "
          f"(predicted {r['predicted_mib'] / r['cuda_allocated_peak_mib'] - 1:+.1%}); peak reserved "
          f"{r['cuda_reserved_peak_mib'] / 1024:.2f} GiB = allocated x "
          f"{r['cuda_reserved_peak_mib'] / r['cuda_allocated_peak_mib']:.3f}; allocation retries "
          f"{r['alloc_retries']}; two steps from an empty cache: reserved "
          f"{r['cuda_reserved_two_steps_mib'] / 1024:.2f} GiB, pipelab's allocator replay of their trace "
          f"{r['replayed_reserved_mib'] / 1024:.2f} GiB "
          f"({r['replayed_reserved_mib'] / r['cuda_reserved_two_steps_mib'] - 1:+.1%})")


if __name__ == "__main__":
    main()
