"""A nanoGPT-style GPT that splits over a tensor-parallel group (Megatron-LM), tied embeddings or not.

Its attention infers its heads from shapes (``view(B, T, -1, head_dim)``), so one member's share of
the heads traces to the same graph; ``tensor_parallel_plan`` says how each module splits
(:mod:`pipelab.tensor_split`). Every size a split cuts (vocabulary, heads, features) is a keyword, so
a degree that divides them all is a choice of the caller (:class:`pipelab.models.gpt.GPT` cannot split:
its default vocabulary is prime and its traced graph freezes its head count).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Causal self-attention; its heads are whatever its qkv layer produces."""

    def __init__(self, embd: int, heads: int) -> None:
        super().__init__()
        if embd % heads:
            raise ValueError(f"embd={embd} must be a multiple of heads={heads}")
        self.n_head, self.head_dim = heads, embd // heads
        self.qkv = nn.Linear(embd, 3 * embd)
        self.proj = nn.Linear(embd, embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention of ``x`` (batch, tokens, features) over earlier tokens."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    """Pre-norm transformer block: attention then a 4x MLP, each with a residual."""

    def __init__(self, embd: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(embd), Attention(embd, heads)
        self.ln2 = nn.LayerNorm(embd)
        self.fc, self.proj = nn.Linear(embd, 4 * embd), nn.Linear(4 * embd, embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block on ``x``."""
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class SplittableGPT(nn.Module):
    """Token and position embeddings, blocks, a final norm and a vocabulary head (tied or not)."""

    tensor_parallel_plan = {"wte": "vocab_embedding", "blocks.*.attn": "heads", "blocks.*.attn.qkv": "qkv",
                            "blocks.*.attn.proj": "rowwise", "blocks.*.fc": "colwise",
                            "blocks.*.proj": "rowwise", "head": "vocab_head"}

    def __init__(self, *, vocab: int = 16, embd: int = 8, heads: int = 2, seq: int = 4, layers: int = 2,
                 tied: bool = False) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(seq, embd)
        self.blocks = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(embd), nn.Linear(embd, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of every next token."""
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def splittable_gpt(**kw: int | bool) -> nn.Module:
    """A :class:`SplittableGPT` (keywords: ``vocab``, ``embd``, ``heads``, ``seq``, ``layers``, ``tied``)."""
    return SplittableGPT(**kw)  # type: ignore[arg-type]


def next_token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def token_batches(*, vocab: int, seq: int, batch: int, count: int, seed: int = 0
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` fixed minibatches of ``batch`` random token sequences: (ids, next ids)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        yield ids[:, :-1], ids[:, 1:]


sgd = functools.partial(torch.optim.SGD, lr=0.1)
