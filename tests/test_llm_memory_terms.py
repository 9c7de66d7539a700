"""The memory terms that torchtitan's runs state, against closed forms written here independently of
pipelab.llm.memory: the per-operator save list ("selective-op"), measured on a real bf16 Llama block
under torch's selective checkpointing on this CPU; the upcast loss's fp32 copies; FSDP's bf16-gathered
blocks; and the refusals of what is priced for memory only."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipelab.cluster import Cluster
from pipelab.llm import Parallel, ParallelError, Transformer, layer_activation_bytes, memory_per_device
from pipelab.llm.costs import stage_costs
from pipelab.llm.memory import (
    LOSSES,
    RECIPES,
    block_shard_params,
    loss_transient_bytes,
    op_saved_bytes,
    recompute_transient_bytes,
)
from pipelab.sim.llm import hardware_flops

LLAMA_8B = dict(name="llama3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                seq=8192, tied=False, gated_mlp=True, bias=False, positions=False)


def _llama(**kw) -> Transformer:
    return Transformer(**{**LLAMA_8B, **kw})


def test_op_saved_bytes_llama_8b_closed_form():
    """Llama 3.1 8B, micro batch 2, bf16: the block input, q (s b h), v (8 of 32 heads: s b h / 4), the
    MLP's up (s b f) and down (s b h) outputs, the attention output (s b h) and its fp32 logsumexp."""
    s, b, h, f, a = 8192, 2, 4096, 14336, 32
    sbh = s * b * h
    expected = 2 * sbh + 2 * sbh + 2 * sbh // 4 + 2 * s * b * f + 2 * sbh + 2 * sbh + 4 * a * s * b
    assert expected == 1_042_284_544        # 994 MiB per block
    par = Parallel(data=8, microbatch_size=2, recompute="selective-op", sharding="fsdp")
    assert op_saved_bytes(_llama(), par, "flash") == expected
    assert layer_activation_bytes(_llama(), par, "flash") == expected
    # unfused attention: the core's softmax and matmuls are not on the save list, nothing of it is kept
    assert op_saved_bytes(_llama(), par, "unfused") == expected - 2 * sbh - 4 * a * s * b


def test_op_saved_bytes_tensor_and_sequence_parallel_closed_form():
    """t = 8 with sequence parallelism: the block input and the two reduce-scatter outputs are s b h / t;
    q, v (8 kv heads over 8 ranks: one head each), up split by t; the row-parallel down projection's
    output is the whole s b h partial sum on every rank."""
    s, b, h, f, a, t = 8192, 1, 8192, 28672, 64, 8
    sbh = s * b * h
    m = _llama(name="llama3.1-70b", layers=80, hidden=h, heads=a, ffn=f)
    par = Parallel(tensor=t, microbatch_size=b, recompute="selective-op", sequence_parallel=True)
    expected = (2 * sbh // t + 2 * sbh // t + 2 * s * b * 128 + 2 * s * b * f // t + 2 * sbh
                + 2 * sbh // t + 4 * a * s * b // t + 2 * 2 * sbh // t)
    assert op_saved_bytes(m, par, "flash") == expected


def test_op_saved_bytes_ungated_keeps_q_v_and_up():
    """A bias-free block without a gated MLP multiplies q, k, v, out, up, down: q, v and up are kept."""
    s, b, h, a = 512, 4, 256, 4
    m = Transformer(name="plain", layers=2, hidden=h, heads=a, seq=s, vocab=1000, bias=False, positions=False)
    par = Parallel(microbatch_size=b, recompute="selective-op")
    sbh = s * b * h
    assert op_saved_bytes(m, par, "flash") == 2 * (sbh + sbh + sbh + 4 * sbh + sbh) + 4 * a * s * b


def test_op_policy_refuses_biased_blocks():
    m = Transformer(name="gpt", layers=2, hidden=64, heads=4, seq=32, vocab=100)
    with pytest.raises(ParallelError, match="addmm"):
        op_saved_bytes(m, Parallel(recompute="selective-op"))


class _Block(nn.Module):
    """A Llama block (RMS norms, grouped-query attention, SwiGLU MLP), written plainly for the check."""

    def __init__(self, h: int, heads: int, kv: int, f: int) -> None:
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.wq, self.wk = nn.Linear(h, h, bias=False), nn.Linear(h, kv * self.d, bias=False)
        self.wv, self.wo = nn.Linear(h, kv * self.d, bias=False), nn.Linear(h, h, bias=False)
        self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.n1(x)
        q = self.wq(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.wk(y).view(b, s, self.kv, self.d).repeat_interleave(self.heads // self.kv, 2).transpose(1, 2)
        v = self.wv(y).view(b, s, self.kv, self.d).repeat_interleave(self.heads // self.kv, 2).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.wo(o)
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def test_op_saved_bytes_matches_torch_selective_checkpointing_on_a_real_block():
    """Run a bf16 Llama block under torch's selective checkpointing with the save list's rule (matrix
    multiplies but every second one, the fused attention kernels) and add up what torch's cache holds
    after the forward, plus the block input: pipelab's closed form must equal it (CPU: the attention
    kernel is torch's CPU flash attention, whose logsumexp is fp32 per head and row, as on CUDA)."""
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    b, s, h, heads, kv, f = 2, 16, 64, 4, 2, 96
    torch.manual_seed(0)
    block = _Block(h, heads, kv, f).to(torch.bfloat16)
    attention_ops = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                     torch.ops.aten._scaled_dot_product_flash_attention.default,
                     torch.ops.aten._scaled_dot_product_efficient_attention.default}
    contexts = []
    seen: set[str] = set()

    def context():
        meta: dict[str, int] = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            seen.add(str(func))
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                meta[mode] += 1
            save = (func == torch.ops.aten.mm.default and meta[mode] % 2 == 1) or func in attention_ops
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        contexts.append(create_selective_checkpoint_contexts(policy))
        return contexts[-1]

    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False, context_fn=context)
    # torch's cache (private): per op, the outputs it keeps, each wrapped with its version counter
    entries = [out for entry in contexts[0][0].storage.values()
               for out in (entry.values() if isinstance(entry, dict) else entry)]
    leaves = [getattr(leaf, "val", leaf) for out in entries for leaf in tree_leaves(out)]
    cached = [t for t in leaves if isinstance(t, torch.Tensor)]
    measured = x.numel() * x.element_size() + sum(t.numel() * t.element_size() for t in cached)
    y.float().sum().backward()                       # and the block trains under the policy
    assert "aten.mm.default" in seen and any("flash_attention" in n for n in seen)
    assert sorted(t.shape[-1] for t in cached if t.dim() == 2) == [32, 64, 64, 96]   # v, q, w2, w1
    model = Transformer(name="tiny", layers=1, hidden=h, heads=heads, kv_heads=kv, ffn=f, seq=s, vocab=100,
                        gated_mlp=True, bias=False, positions=False)
    assert op_saved_bytes(model, Parallel(microbatch_size=b, recompute="selective-op"), "flash") == measured
    assert len([t for t in cached if t.dtype == torch.float32]) == 1            # the logsumexp


def test_loss_transient_closed_form():
    s, b, v = 8192, 2, 128256
    m = _llama()
    assert LOSSES == ("fused", "upcast")
    assert loss_transient_bytes(m, Parallel(microbatch_size=b), "fused") == 0
    assert loss_transient_bytes(m, Parallel(microbatch_size=b), "upcast") == 2 * 4 * s * b * v
    assert loss_transient_bytes(m, Parallel(tensor=8, microbatch_size=b), "upcast") == 3 * 4 * s * b * v // 8
    with pytest.raises(ValueError, match="loss="):
        loss_transient_bytes(m, Parallel(), "chunked")


def test_upcast_loss_adds_to_the_last_stage_only():
    """Pipeline of 2, no recomputation: the last stage's peak grows by exactly two fp32 logits; the
    first stage's not at all."""
    m = _llama(layers=4, seq=256)
    par = Parallel(pipeline=2, microbatches=4, microbatch_size=2)
    fused = memory_per_device(m, par, attention="flash")
    upcast = memory_per_device(m, par, attention="flash", loss="upcast")
    assert upcast[0].total == fused[0].total
    assert upcast[1].total - fused[1].total == 2 * 4 * 256 * 2 * 128256


def test_peak_takes_the_larger_transient():
    """selective-op: the recomputed block adds what the save list left out (the whole block less what
    was kept); with an upcast loss larger than that, the loss's copies replace it (they do not add)."""
    m = _llama(layers=2, seq=512, vocab=1000)
    par = Parallel(microbatch_size=2, recompute="selective-op")
    whole = layer_activation_bytes(m, Parallel(microbatch_size=2), "flash")
    kept = op_saved_bytes(m, par, "flash")
    assert recompute_transient_bytes(m, par, "flash") == whole - kept
    base = memory_per_device(m, par, attention="flash")[0]
    big = _llama(layers=2, seq=512)
    up = memory_per_device(big, par, attention="flash", loss="upcast")[0]
    fu = memory_per_device(big, par, attention="flash")[0]
    assert 2 * 4 * 512 * 2 * 128256 > recompute_transient_bytes(big, par, "flash")
    assert up.total - fu.total == 2 * 4 * 512 * 2 * 128256 - recompute_transient_bytes(big, par, "flash")
    assert base.activations >= 2 * kept + whole - kept


def test_fsdp_gathers_blocks_in_the_compute_precision():
    """FSDP2 with bf16 compute: two blocks' bf16 weights and bf16 unsharded gradients (2 + 2 bytes each);
    the fp32 recipe without a compute precision gathers 4 + 4."""
    m = _llama(layers=4, seq=256)
    par = Parallel(data=8, sharding="fsdp")
    per_block = block_shard_params(m, 1)
    assert per_block == 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    bf16 = memory_per_device(m, par, recipe="fp32-adam-bf16-compute")[0]
    fp32 = memory_per_device(m, par, recipe="fp32-adam")[0]
    assert bf16.gathered == 2 * (2 + 2) * per_block
    assert fp32.gathered == 2 * (4 + 4) * per_block
    assert RECIPES["fp32-adam-bf16-compute"].bytes_per_param == 16
    assert (bf16.weights, bf16.gradients, bf16.optimizer) == (fp32.weights, fp32.gradients, fp32.optimizer)


def test_op_policy_is_memory_only():
    m = _llama(layers=4, seq=256)
    with pytest.raises(ParallelError, match="memory only"):
        stage_costs(m, Parallel(recompute="selective-op"), Cluster.preset("dgx-a100", nodes=1))
    with pytest.raises(ValueError, match="memory only"):
        hardware_flops(m, 8, "selective-op")


def test_sequence_parallel_gathered_inputs_closed_form():
    """DTensor sequence parallelism keeps the qkv and MLP inputs whole (2 bf16 s b h per block, instead of
    their shards) and the head's input whole: Korthikanti's ``sbh/t (34 + 5as/h)`` becomes
    ``sbh/t (30 + 5as/h) + 4 sbh`` per block, and the last stage adds ``2 sbh (1 - 1/t)``."""
    s, b, h, a, t = 2048, 1, 1024, 16, 8
    sbh = s * b * h
    m = Transformer(name="gpt", layers=4, hidden=h, heads=a, seq=s, vocab=51200, tied=False)
    par = Parallel(tensor=t, microbatch_size=b, sequence_parallel=True)
    sharded = layer_activation_bytes(m, par, "unfused")
    gathered = layer_activation_bytes(m, par, "unfused", "gathered")
    assert sharded == sbh * (34 + 5 * a * s // h) // t
    assert gathered == sbh * (30 + 5 * a * s // h) // t + 4 * sbh
    fused = memory_per_device(m, par, attention="unfused")[0]
    whole = memory_per_device(m, par, attention="unfused", sequence_parallel_inputs="gathered")[0]
    assert whole.activations - fused.activations == 4 * (gathered - sharded) + 2 * sbh - 2 * sbh // t
    # without sequence parallelism there is nothing to gather: the knob changes nothing
    plain = Parallel(tensor=t, microbatch_size=b)
    same = layer_activation_bytes(m, plain, "unfused")
    assert layer_activation_bytes(m, plain, "unfused", "gathered") == same
    with pytest.raises(ValueError, match="sequence_parallel_inputs"):
        memory_per_device(m, par, sequence_parallel_inputs="whole")


def test_planner_refuses_the_memory_only_policy():
    from pipelab.planner.llm import enumerate_parallel

    m = _llama(layers=4, seq=256)
    with pytest.raises(ValueError, match="memory only"):
        list(enumerate_parallel(m, Cluster.preset("dgx-a100", nodes=1), 8, recompute="selective-op"))
