"""A small nanoGPT-style decoder with an output head tied to the token embedding, and token data for it.

The model is written the way such code usually is (each block's forward starts with
``b, s, _ = x.shape``; causal self-attention with heads; pre-LayerNorm; a final norm), and, with
``tied=True`` (the default, as in GPT-2 and nanoGPT), the head's weight *is* the embedding's weight:
one ``nn.Parameter`` that the first and the last layer both use. Invariant: ``model.head.weight is
model.wte.weight`` exactly when ``tied``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees itself and the positions before it."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be divisible by heads={heads}")
        self.heads = heads
        self.head_dim = d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, d] -> [b, s, d]``."""
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, s, d))


class Block(nn.Module):
    """Pre-norm Transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, d] -> [b, s, d]``; reads the shape first, as nanoGPT-style blocks do."""
        b, s, _ = x.shape
        x = x + self.attn(self.ln1(x))
        h = self.out(F.gelu(self.fc(self.ln2(x))))
        return x + h.view(b, s, -1)


class GPT(nn.Module):
    """Token + position embedding, ``depth`` blocks, final LayerNorm, a vocabulary head (tied by default)."""

    def __init__(self, vocab: int = 97, d_model: int = 32, heads: int = 2, depth: int = 4, max_len: int = 16,
                 tied: bool = True) -> None:
        super().__init__()
        if min(vocab, d_model, heads, depth, max_len) < 1:
            raise ValueError("vocab, d_model, heads, depth and max_len must be >= 1")
        self.max_len = max_len
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight

    @property
    def tied(self) -> bool:
        """Whether the head's weight is the embedding's weight (the same parameter object)."""
        return self.head.weight is self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token logits ``[b, s, vocab]`` for tokens ``[b, s]`` (``s <= max_len``)."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt(vocab: int = 97, d_model: int = 32, heads: int = 2, depth: int = 4, max_len: int = 16,
        tied: bool = True, seed: int | None = None) -> GPT:
    """A small nanoGPT-style decoder (see :class:`GPT`); ``seed`` makes its initial weights reproducible."""
    if seed is not None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return GPT(vocab, d_model, heads, depth, max_len, tied)
    return GPT(vocab, d_model, heads, depth, max_len, tied)


def gpt_data(n: int, *, vocab: int = 97, seq_len: int = 16,
             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic next-token data ``(tokens, targets)``, both ``[n, seq_len]`` int64.

    Each sequence follows ``t[i+1] = (a * t[i] + c) mod vocab`` with its own ``a`` and ``c`` drawn from
    ``seed``, so the task is learnable; ``targets`` is ``tokens`` shifted left by one."""
    if n < 1 or seq_len < 1 or vocab < 2:
        raise ValueError(f"n={n} and seq_len={seq_len} must be >= 1, vocab={vocab} >= 2")
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(1, vocab, (n, 1), generator=g)
    c = torch.randint(0, vocab, (n, 1), generator=g)
    seq = torch.empty(n, seq_len + 1, dtype=torch.int64)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for i in range(seq_len):
        seq[:, i + 1] = (a[:, 0] * seq[:, i] + c[:, 0]) % vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``[b, s, vocab]`` logits against ``[b, s]`` targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
