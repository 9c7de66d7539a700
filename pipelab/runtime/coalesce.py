"""Coalesced weight gradients: one GEMM per Linear at the flush instead of one per microbatch.

Within a flush a ``Linear``'s weight gradient is ``sum_i g_i^T x_i = G^T X`` (zero-bubble's W pass,
Qi et al., ICLR'24 §2): :func:`install` stores each microbatch's ``(x, grad_out)`` and
:meth:`Coalescer.flush` adds ``G^T X`` at ``U``. It holds those until the flush, so it is opt-in.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

import pipelab.methods as methods

#: flushed methods whose every action reads the master weights and which have no W actions (the
#: pipelines first, then data parallelism)
COALESCE_METHODS = tuple(sorted((n for n in methods.names() if methods.get(n).coalesce_wgrad),
                                key=lambda n: methods.get(n).order == "dp"))

Store = list[tuple[torch.Tensor, torch.Tensor]]


class CoalescedLinearFn(torch.autograd.Function):
    """``F.linear`` whose backward defers the weight and bias gradients to a store."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                store: Store) -> torch.Tensor:
        """``x @ weight^T + bias``; saves ``x`` and ``weight`` for backward."""
        ctx.save_for_backward(x, weight)
        ctx.store = store
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        """Input gradient now; ``(x, grad_out)`` kept for the weight gradient at the flush."""
        x, weight = ctx.saved_tensors
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # rows x features views: the flush stacks the rows of every microbatch into one GEMM
            ctx.store.append((x.detach().reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])))
        grad_x = grad_out.to(weight.dtype).matmul(weight).to(x.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def _coalesced_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    store: Store = self._pipelab_wgrad_store  # type: ignore[assignment]
    if not (torch.is_grad_enabled() and self.weight.requires_grad):
        return F.linear(x, self.weight, self.bias)
    if self.bias is not None and not self.bias.requires_grad:
        raise ValueError("coalesce_wgrad=True needs a Linear's bias to be trainable when its weight is; "
                         "freeze both or neither, or leave coalesce_wgrad off")
    return CoalescedLinearFn.apply(x, self.weight, self.bias, store)


class Coalescer:
    """The Linears of one stage module whose weight gradients are deferred to :meth:`flush`."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears

    def stores(self) -> Iterator[tuple[nn.Linear, Store]]:
        """Each patched Linear with its list of pending ``(x, grad_out)`` pairs."""
        for m in self.linears:
            yield m, m._pipelab_wgrad_store  # type: ignore[misc]

    @property
    def pending(self) -> int:
        """Number of ``(x, grad_out)`` pairs waiting (one per Linear call per microbatch)."""
        return sum(len(s) for _, s in self.stores())

    def flush(self) -> None:
        """``weight.grad += G^T X``, ``bias.grad += G.sum(0)`` per Linear; then empty the stores."""
        for m, store in self.stores():
            if not store:
                continue
            X = store[0][0] if len(store) == 1 else torch.cat([x for x, _ in store])
            G = store[0][1] if len(store) == 1 else torch.cat([g for _, g in store])
            store.clear()
            w = m.weight
            G, X = G.to(w.dtype), X.to(w.dtype)     # no-ops unless autocast ran the forward in another dtype
            if w.grad is None:
                w.grad = G.t().mm(X)
            else:
                w.grad.addmm_(G.t(), X)
            if m.bias is not None:
                b = G.sum(0)
                if m.bias.grad is None:
                    m.bias.grad = b
                else:
                    m.bias.grad.add_(b)

    def uninstall(self) -> None:
        """Restore the Linears' own forward (pending pairs are dropped)."""
        for m in self.linears:
            m.__dict__.pop("forward", None)
            m.__dict__.pop("_pipelab_wgrad_store", None)
        self.linears = []


def install(module: nn.Module) -> Coalescer:
    """Defer the weight gradients of every plain ``nn.Linear`` in ``module`` (idempotent)."""
    linears: list[nn.Linear] = []
    for m in module.modules():
        if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward and "forward" not in m.__dict__:
            m._pipelab_wgrad_store = []   # type: ignore[assignment]
            m.forward = types.MethodType(_coalesced_forward, m)   # type: ignore[method-assign]
            linears.append(m)
    return Coalescer(linears)


def check_method(method: str, has_w_actions: bool) -> None:
    """Raise ``ValueError`` unless ``method`` keeps one weight version across a minibatch and has no W."""
    spec = methods.METHODS.get(method)
    if spec is None or not spec.coalesce_wgrad or has_w_actions:
        why = ("it has its own W (weight-gradient) actions" if has_w_actions else
               "its weights change between the microbatches of a minibatch or its backward reads stashed "
               "versions")
        raise ValueError(f"coalesce_wgrad=True is not supported for method {method!r}: {why}, so the weight "
                         "gradients of its microbatches cannot be summed into one GEMM at the update. Use "
                         f"it with one of {', '.join(COALESCE_METHODS)}, or drop coalesce_wgrad")
