"""The tiny splittable GPT of the tensor-parallel tests (:mod:`pipelab.models.tp_gpt`), importable by
worker processes, with its fixed data."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
from torch import nn

from pipelab.models.tp_gpt import SplittableGPT, next_token_loss, token_batches

VOCAB, EMBD, HEADS, SEQ, LAYERS = 16, 8, 2, 4, 2
GPT = SplittableGPT
loss_fn = next_token_loss


def gpt() -> nn.Module:
    """The tiny GPT."""
    return SplittableGPT(vocab=VOCAB, embd=EMBD, heads=HEADS, seq=SEQ, layers=LAYERS)


def tied_gpt() -> nn.Module:
    """The tiny GPT with its head's weight tied to the token embedding."""
    return SplittableGPT(vocab=VOCAB, embd=EMBD, heads=HEADS, seq=SEQ, layers=LAYERS, tied=True)


def data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Three fixed minibatches of 4 sequences."""
    return token_batches(vocab=VOCAB, seq=SEQ, batch=4, count=3, seed=7)


sgd = functools.partial(torch.optim.SGD, lr=0.1)
