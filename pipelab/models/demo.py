"""Small demo models and the data they learn from (bundled or generated), for a laptop CPU."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def mlp(in_features: int = 64, hidden: int = 128, depth: int = 3, out_features: int = 10) -> nn.Sequential:
    """A ReLU perceptron of ``depth`` Linear layers; the default fits the flattened 8x8 digits."""
    if depth < 1:
        raise ValueError(f"depth={depth} must be >= 1")
    widths = [in_features] + [hidden] * (depth - 1) + [out_features]
    layers: list[nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < depth - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def linear_blocks(width: int, blocks: int) -> nn.Sequential:
    """``blocks`` x (``Linear(width, width)`` + ReLU): equal blocks, so any split is balanced."""
    if width < 1 or blocks < 1:
        raise ValueError(f"width={width} and blocks={blocks} must be >= 1")
    return nn.Sequential(*(m for _ in range(blocks) for m in (nn.Linear(width, width), nn.ReLU())))


def small_cnn(num_classes: int = 10, channels: int = 16, in_channels: int = 1) -> nn.Sequential:
    """A two-conv CNN for 8x8 images (the digits): conv-relu-conv-relu-pool-flatten-fc-relu-fc."""
    c = channels
    return nn.Sequential(
        nn.Conv2d(in_channels, c, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * c * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, num_classes),
    )


class TinyTransformer(nn.Module):
    """Embedding, learned positions, ``depth`` encoder layers, a vocabulary head: tokens -> logits."""

    def __init__(self, vocab: int = 100, d_model: int = 32, heads: int = 2, depth: int = 4,
                 max_len: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be divisible by heads={heads}")
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.blocks = nn.ModuleList(
            [nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=dropout, batch_first=True)
             for _ in range(depth)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token logits."""
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tiny_transformer(vocab: int = 100, d_model: int = 32, heads: int = 2, depth: int = 4,
                     max_len: int = 64, dropout: float = 0.0) -> TinyTransformer:
    """A small Transformer encoder over tokens (see :class:`TinyTransformer`)."""
    return TinyTransformer(vocab, d_model, heads, depth, max_len, dropout)


class PlainBlock(nn.Module):
    """A GPT block as the analytic transformer counts it: pre-norm attention and a GeLU MLP, no dropout."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)).softmax(-1) @ v.transpose(1, 2)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


def plain_gpt(*, vocab: int, hidden: int, heads: int, layers: int) -> nn.Sequential:
    """A GPT without positions and with an untied head: embedding, ``layers`` :class:`PlainBlock`, final
    norm and head, the five kinds of layer ``pipelab.llm.transformer_profile`` prices (profile it with
    ``leaf_modules=(PlainBlock,)`` to time each block as one layer)."""
    return nn.Sequential(nn.Embedding(vocab, hidden), *[PlainBlock(hidden, heads) for _ in range(layers)],
                         nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False))


def digits_data(split: str = "all", *, flat: bool = False, test_fraction: float = 0.2,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits: images in [0, 1] ``[N, 1, 8, 8]`` (``[N, 64]`` flat), labels 0..9;
    ``split`` is ``"train"``, ``"test"`` (a fixed shuffled split) or ``"all"``."""
    from sklearn.datasets import load_digits

    if split not in ("train", "test", "all"):
        raise ValueError(f"split={split!r} must be 'train', 'test' or 'all'")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction} must be in (0, 1)")
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    if split != "all":
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        n_test = int(round(len(y) * test_fraction))
        idx = perm[:n_test] if split == "test" else perm[n_test:]
        x, y = x[idx], y[idx]
    return (x if flat else x.view(-1, 1, 8, 8)), y


BOS = 1  # start-of-sentence token fed to the decoder; 0 is padding


def synthetic_translation(n: int, *, vocab: int = 100, src_len: int = 12, min_len: int | None = None,
                          seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A toy translation task, ``(src, tgt_in, tgt_out)``: the sentence reversed, each word through a fixed
    dictionary; ``tgt_in`` is ``tgt_out`` behind ``BOS``. With ``min_len``, lengths vary, padded with 0."""
    if vocab < 4:
        raise ValueError(f"vocab={vocab} must be >= 4 (0 = pad, 1 = BOS, and some words)")
    if n < 1 or src_len < 1:
        raise ValueError("n and src_len must be >= 1")
    g = torch.Generator().manual_seed(seed)
    dictionary = torch.randperm(vocab - 2, generator=g) + 2
    src = torch.randint(2, vocab, (n, src_len), generator=g)
    lengths = (torch.full((n,), src_len) if min_len is None
               else torch.randint(min_len, src_len + 1, (n,), generator=g))
    tgt_out = torch.zeros_like(src)
    for i in range(n):
        k = int(lengths[i])
        src[i, k:] = 0
        tgt_out[i, :k] = dictionary[src[i, :k].flip(0) - 2]
    tgt_in = torch.cat([torch.full((n, 1), BOS), tgt_out[:, :-1]], dim=1)
    return src, tgt_in, tgt_out


def batches(tensors: Sequence[torch.Tensor], batch_size: int, *, seed: int = 0,
            shuffle: bool = True) -> list[tuple[torch.Tensor, ...]]:
    """Split equally long tensors into minibatches of ``batch_size`` (the last one may be smaller)."""
    n = len(tensors[0])
    if any(len(t) != n for t in tensors):
        raise ValueError("all tensors must have the same length")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    return [tuple(t[order[i:i + batch_size]] for t in tensors) for i in range(0, n, batch_size)]
