"""The runtime's stashed-version call (:class:`pipelab.runtime.reparam.Reparametrizer`) against its
oracles, the plain module holding those weights and ``torch.func.functional_call``: the same outputs
and the same gradients on the stashed tensors (none on the master), tied weights and a submodule
registered twice replaced everywhere, the module's own parameters back in
place after a call that returns or raises, and under activation checkpointing's recomputation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from pipelab.runtime.reparam import Reparametrizer


class Tied(nn.Module):
    """An embedding whose weight is also the output projection's (tied weights), and a shared block."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        block = nn.Linear(6, 6)
        self.body = nn.Sequential(block, nn.Tanh(), block)      # one submodule registered twice
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(x)))


def _stash(m: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g).requires_grad_() for n, p in m.named_parameters()}


def _masters(m: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach().clone()) for n, p in m.named_parameters()]


def _oracle(m: nn.Module, w: dict[str, torch.Tensor],
            x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The plain module with ``w``'s values as its own parameters: output and per-name gradients."""
    twin = copy.deepcopy(m)
    with torch.no_grad():
        for n, p in twin.named_parameters():
            p.copy_(w[n])
    out = twin(x)
    out.square().sum().backward()
    return out, {n: p.grad for n, p in twin.named_parameters()}   # type: ignore[misc]


@pytest.mark.parametrize("make", [lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                  Tied], ids=["transformer-block", "tied-and-shared"])
def test_same_outputs_and_gradients_as_the_plain_module_with_those_weights(make) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    m = make()
    x = torch.randint(0, 11, (3, 5)) if isinstance(m, Tied) else torch.randn(3, 5, 8)
    before = _masters(m)
    w = _stash(m, 1)
    want, grads = _oracle(m, w, x)
    got = Reparametrizer(m)(w, x)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    got.square().sum().backward()
    for n in w:
        assert w[n].grad is not None, n
        assert torch.allclose(w[n].grad, grads[n], rtol=1e-5, atol=1e-6), n
    assert all(p.grad is None for p in m.parameters())        # the master weights got no gradient
    assert all(torch.equal(p, q) for (_, p), (_, q) in zip(_masters(m), before))
    assert all(isinstance(p, nn.Parameter) for p in m.parameters())


def test_same_as_functional_call_on_an_untied_module() -> None:
    torch.manual_seed(0)
    m = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(3, 5, 8)
    w = _stash(m, 3)
    assert torch.equal(Reparametrizer(m)(w, x), functional_call(m, w, (x,)))


def test_tied_weights_are_replaced_in_every_slot() -> None:
    m = Tied()
    w = {n: torch.zeros_like(p) for n, p in m.named_parameters()}
    assert "head.weight" not in w                              # deduplicated: only emb.weight names it
    out = Reparametrizer(m)(w, torch.tensor([[1, 2]]))
    assert torch.count_nonzero(out) == 0                       # the head's (tied) weight was replaced too


def test_restored_after_an_exception_and_partial_mappings_keep_the_rest() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    own = [p for p in m.parameters()]
    call = Reparametrizer(m)
    with pytest.raises(RuntimeError):
        call({"0.weight": torch.zeros(4, 4)}, torch.randn(3, 5))   # wrong input width
    assert [p for p in m.parameters()] == own and all(p is q for p, q in zip(m.parameters(), own))
    x = torch.randn(3, 4)
    w = {"1.bias": torch.full((2,), 7.0)}
    assert torch.equal(call(w, x), functional_call(m, w, (x,)))


def test_recomputation_under_checkpoint_sees_the_stashed_version() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    call = Reparametrizer(m)
    x = torch.randn(5, 4)
    a, b = _stash(m, 2), _stash(m, 2)
    functional_call(m, a, (x,)).sum().backward()
    checkpoint(lambda t: call(b, t), x, use_reentrant=False).sum().backward()
    for n in a:
        assert torch.allclose(a[n].grad, b[n].grad), n   # type: ignore[arg-type]
