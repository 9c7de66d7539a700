"""The GPT of the tensor-parallel cost benchmark (importable by worker processes): nanoGPT-style,
attention inferring its heads from shapes, a ``tensor_parallel_plan``, fixed token data."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, EMBD, HEADS, SEQ, LAYERS, BATCH = 512, 256, 8, 64, 2, 16


class Block(nn.Module):
    """Pre-norm block: attention split by heads, a 4x MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.qkv, self.attn_proj = nn.Linear(EMBD, 3 * EMBD), nn.Linear(EMBD, EMBD)
        self.fc, self.proj = nn.Linear(EMBD, 4 * EMBD), nn.Linear(4 * EMBD, EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, -1, EMBD // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + self.attn_proj(y)
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Embeddings, blocks, norm, an untied vocabulary head."""

    tensor_parallel_plan = {"wte": "vocab_embedding", "blocks.*.qkv": "qkv", "blocks.*.attn_proj": "rowwise",
                            "blocks.*.fc": "colwise", "blocks.*.proj": "rowwise", "head": "vocab_head"}

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(SEQ, EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(EMBD), nn.Linear(EMBD, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def gpt() -> nn.Module:
    """The benchmark's GPT."""
    return GPT()


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Four fixed minibatches."""
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        yield ids[:, :-1], ids[:, 1:]


sgd = functools.partial(torch.optim.SGD, lr=0.01)
