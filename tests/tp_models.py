"""A tiny nanoGPT-style GPT for the tensor-parallel tests: attention infers its heads from shapes
(``view(B, T, -1, head_dim)``), so a split by heads traces to the same graph; ``tensor_parallel_plan``
says how it splits (pipelab.runtime.tensor_parallel)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, EMBD, HEADS, SEQ, LAYERS = 16, 8, 2, 4, 2


class Attention(nn.Module):
    """Causal self-attention; its heads are whatever its qkv layer produces."""

    def __init__(self) -> None:
        super().__init__()
        self.n_head, self.head_dim = HEADS, EMBD // HEADS
        self.qkv = nn.Linear(EMBD, 3 * EMBD)
        self.proj = nn.Linear(EMBD, EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    """Pre-norm transformer block: attention then a 4x MLP, each with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(EMBD), Attention()
        self.ln2 = nn.LayerNorm(EMBD)
        self.fc, self.proj = nn.Linear(EMBD, 4 * EMBD), nn.Linear(4 * EMBD, EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token and position embeddings, blocks, a final norm and an untied vocabulary head."""

    tensor_parallel_plan = {"wte": "vocab_embedding", "blocks.*.attn": "heads", "blocks.*.attn.qkv": "qkv",
                            "blocks.*.attn.proj": "rowwise", "blocks.*.fc": "colwise",
                            "blocks.*.proj": "rowwise", "head": "vocab_head"}

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
    """The tiny GPT."""
    return GPT()


def tied_gpt() -> nn.Module:
    """The tiny GPT with its head's weight tied to the token embedding."""
    m = GPT()
    m.head.weight = m.wte.weight
    return m


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Three fixed minibatches of 4 sequences."""
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (4, SEQ + 1), generator=g)
        yield ids[:, :-1], ids[:, 1:]


sgd = functools.partial(torch.optim.SGD, lr=0.1)
