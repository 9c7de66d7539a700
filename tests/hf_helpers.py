"""Small Hugging Face causal LMs (from configs, no download), token data, loss and optimizer for tests
and job files."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pipelab.models.gpt import gpt, gpt_data, gpt_loss

VOCAB, SEQ, BATCH = 61, 8, 4


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module="transformers")


def gpt2(tied: bool = False) -> nn.Module:
    """GPT2LMHeadModel: 2 blocks of width 32 (``tied``: the head is the token embedding)."""
    _quiet()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16, bos_token_id=0,
                     eos_token_id=0, tie_word_embeddings=tied, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def gpt2_tied() -> nn.Module:
    """GPT-2 with its default tied head."""
    return gpt2(tied=True)


def llama() -> nn.Module:
    """LlamaForCausalLM: 2 blocks of width 32, grouped-query attention (2 heads, 1 key/value head)."""
    _quiet()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=16, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def tokens() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Minibatches of ``BATCH`` next-token sequences ``(ids, targets)``."""
    x, y = gpt_data(BATCH * 6, vocab=VOCAB, seq_len=SEQ, seed=3)
    for i in range(6):
        yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]


def tokens_masked() -> Iterator[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """As :func:`tokens`, with an attention mask (each sequence's last two positions are padding)."""
    for x, y in tokens():
        mask = torch.ones_like(x)
        mask[:, -2:] = 0
        yield (x, mask), y


def lm_loss(logits: Any, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of logits (or a ModelOutput's ``logits``)."""
    return gpt_loss(getattr(logits, "logits", logits), targets)


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5)


def nanogpt() -> nn.Module:
    """pipelab's nanoGPT-style model, untied (for the depth/CLI test)."""
    return gpt(vocab=VOCAB, d_model=16, heads=2, depth=2, max_len=SEQ, tied=False)


def reference(model_fn: Any, data_fn: Any, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Plain single-process SGD of the whole model (the oracle)."""
    torch.manual_seed(seed)
    model = model_fn()
    opt = sgd(model.parameters())
    it = iter(data_fn())
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        out = model(x[0], attention_mask=x[1]) if isinstance(x, tuple) else model(x)
        lm_loss(out, y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
