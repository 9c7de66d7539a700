"""Importable pieces of the tied-parameter tests (worker processes unpickle them by reference)."""

from __future__ import annotations

import torch
from torch import nn

from pipelab.graph import layer_nodes, trace
from pipelab.models import gpt, gpt_data, gpt_loss

LR = 0.1
STEPS = 3
BATCH = 12


def tied_gpt() -> nn.Module:
    """The 4-block tied GPT (D 32, vocab 97) of issue 44."""
    return gpt()


def untied_gpt() -> nn.Module:
    """The same GPT with the head's own matrix (a copy of the embedding's initial one)."""
    m = gpt()
    m.head.weight = nn.Parameter(m.wte.weight.detach().clone())
    return m


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four different deterministic minibatches of next-token data."""
    x, y = gpt_data(4 * BATCH, seed=1)
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(4)]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return gpt_loss(out, y)


def sgd(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    """Plain SGD."""
    return torch.optim.SGD(params, lr=LR)


def adam(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    """Adam."""
    return torch.optim.Adam(params, lr=1e-2)


def block_ends(model_fn=tied_gpt) -> list[int]:  # type: ignore[no-untyped-def]
    """Layer indices after the embedding and after each block: cuts no shape integer crosses."""
    nodes = layer_nodes(trace(model_fn()))
    ends = [i + 1 for i, n in enumerate(nodes) if n.name == "add" or
            (n.name.startswith("add_") and n.name[4:].isdigit() and int(n.name[4:]) % 2 == 0)]
    return ends


def plain(model_fn=tied_gpt, optimizer=sgd, steps: int = STEPS,  # type: ignore[no-untyped-def]
          seed: int = 0) -> dict[str, torch.Tensor]:
    """Plain single-process training with the runtime's seed: the oracle."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = model_fn()
    opt = optimizer(m.parameters())
    for x, y in data()[:steps]:
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference over the weights of ``b``."""
    return max(float((a[k] - b[k]).abs().max()) for k in b)


class GPT2Sequential(nn.Sequential):
    """Hugging Face GPT-2's own modules as a Sequential: wte/wpe, the blocks as leaves, ln_f + lm_head."""


class Embed(nn.Module):
    """GPT-2's token plus position embedding."""

    def __init__(self, wte: nn.Module, wpe: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe = wte, wpe

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    """One GPT2Block returning its hidden states only."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


class Head(nn.Module):
    """Final LayerNorm and the (tied) LM head."""

    def __init__(self, ln_f: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def hf_gpt2() -> nn.Module:
    """A small tied ``GPT2LMHeadModel`` (4 layers, n_embd 64, vocab 97) wrapped as a Sequential."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=97, n_positions=16, n_embd=64, n_layer=4, n_head=2, tie_word_embeddings=True,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(cfg)
    assert hf.lm_head.weight is hf.transformer.wte.weight
    t = hf.transformer
    return GPT2Sequential(Embed(t.wte, t.wpe), *[Block(b) for b in t.h], Head(t.ln_f, hf.lm_head))


HF_TRACE = {"leaf_modules": [Block]}


def delayed(model_fn=tied_gpt, optimizer=sgd, steps: int = STEPS,  # type: ignore[no-untyped-def]
            delay: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """Oracle of the one-version-per-minibatch asynchronous rules (PipeDream-2BW: ``delay = 1``; the
    K-version buffer: ``delay = K - 1``): ``W(t+1) = step(W(t), grad f_t(W(max(0, t - delay))))`` on the
    whole tied model in one process (the tie is one parameter here, as in the plain model)."""
    import copy

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = model_fn()
    old = copy.deepcopy(m)
    opt = optimizer(m.parameters())
    history = [copy.deepcopy(m.state_dict())]
    for t, (x, y) in enumerate(data()[:steps]):
        old.load_state_dict(history[max(0, t - delay)])
        old.zero_grad()
        loss_fn(old(x), y).backward()
        for p, q in zip(m.parameters(), old.parameters()):
            p.grad = q.grad.clone()
        opt.step()
        history.append(copy.deepcopy(m.state_dict()))
    return {k: v.detach().clone() for k, v in m.state_dict().items()}
