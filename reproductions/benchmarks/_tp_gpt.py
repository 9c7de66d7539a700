"""The GPT of the tensor-parallel cost benchmarks (importable by worker processes):
:class:`pipelab.models.tp_gpt.SplittableGPT` at 2 blocks, width 256, 8 heads, vocabulary 512,
64 tokens, 16 sequences per minibatch, with fixed token data."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
from torch import nn

from pipelab.models.tp_gpt import next_token_loss, splittable_gpt, token_batches

VOCAB, EMBD, HEADS, SEQ, LAYERS, BATCH = 512, 256, 8, 64, 2, 16
loss_fn = next_token_loss


def gpt() -> nn.Module:
    """The benchmark's GPT."""
    return splittable_gpt(vocab=VOCAB, embd=EMBD, heads=HEADS, seq=SEQ, layers=LAYERS)


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Four fixed minibatches."""
    return token_batches(vocab=VOCAB, seq=SEQ, batch=BATCH, count=4, seed=0)


sgd = functools.partial(torch.optim.SGD, lr=0.01)
