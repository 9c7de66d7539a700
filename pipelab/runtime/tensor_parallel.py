"""Megatron-style tensor parallelism of one stage: its modules split over a group of ``t`` processes.

A model says how it splits with ``tensor_parallel_plan``, a dict from module names (``fnmatch``
patterns over qualified names, e.g. ``"blocks.*.mlp.fc"``) to a style of :data:`STYLES`. The rule
(which module has which style, what each cuts, what its size is) lives in :mod:`pipelab.tensor_split`,
which the profiler applies to the layers it records, so the simulator prices what this module splits:

- ``colwise``: ``nn.Linear`` whose output features are split (Megatron's column-parallel layer);
  its input passes through *f* (identity forward, all-reduce of the gradient backward).
- ``rowwise``: ``nn.Linear`` whose input features are split (row-parallel); its partial products
  pass through *g* (all-reduce forward, identity backward) and the bias is added once, after.
- ``qkv``: a column-parallel ``nn.Linear`` producing ``[q; k; v]``: each third is split by heads.
- ``heads``: an attention module with ``n_head`` (and ``n_embd`` if it has one) attributes that its
  forward reads; they become the group member's share.
- ``vocab_embedding``: ``nn.Embedding`` split over the vocabulary (out-of-range ids give zeros,
  then *g* sums the shards' rows).
- ``vocab_head``: the output ``nn.Linear`` split over the vocabulary; the logits are all-gathered
  (forward) so the loss sees every logit, and each member keeps its slice of the gradient (backward).

Invariant: a split stage computes what the whole stage computes (up to float summation order), on
plain tensors; every member holds the same inputs and, after *g*/gather, the same outputs. A
parameter keeps its name; :func:`shard_dims` says along which dimension it was cut, so the whole
weights are the members' shards concatenated (:func:`unshard`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipelab.tensor_split import CUT_DIM, STYLES, bias_cut, cut_size, style_of


class _Copy(torch.autograd.Function):
    """Megatron's *f*: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Reduce(torch.autograd.Function):
    """Megatron's *g*: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _Gather(torch.autograd.Function):
    """All-gather along the last dimension forward; this member's slice of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, index: int, degree: int) -> torch.Tensor:
        ctx.index, ctx.width = index, x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(degree)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        w = ctx.width
        return grad[..., ctx.index * w:(ctx.index + 1) * w].contiguous(), None, None, None


class Group:
    """One member's view of a tensor-parallel group: its index, the degree, the process group."""

    def __init__(self, index: int, degree: int, group: Any) -> None:
        self.index, self.degree, self.group = index, degree, group

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        """*f* on ``x`` (nothing in a group of one)."""
        return x if self.degree == 1 else _Copy.apply(x, self.group)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """*g* on ``x`` (nothing in a group of one)."""
        return x if self.degree == 1 else _Reduce.apply(x, self.group)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """All-gather ``x`` along its last dimension."""
        return x if self.degree == 1 else _Gather.apply(x, self.group, self.index, self.degree)

    def rows(self, n: int) -> slice:
        """This member's share of ``n`` rows."""
        k = n // self.degree
        return slice(self.index * k, (self.index + 1) * k)


class ColumnParallelLinear(nn.Module):
    """A shard of an ``nn.Linear`` split over its output features (rows of ``weight``)."""

    def __init__(self, full: nn.Linear, grp: Group, *, thirds: bool = False) -> None:
        super().__init__()
        self.grp = grp
        W = full.weight.detach()
        idx = _qkv_rows(W.shape[0], grp) if thirds else torch.arange(W.shape[0])[grp.rows(W.shape[0])]
        self.weight = nn.Parameter(W[idx].clone(), requires_grad=full.weight.requires_grad)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[idx].clone(),
                                                                requires_grad=full.bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Input copied to the group (*f*), output features of this shard."""
        return F.linear(self.grp.copy(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """A shard of an ``nn.Linear`` split over its input features (columns of ``weight``)."""

    def __init__(self, full: nn.Linear, grp: Group) -> None:
        super().__init__()
        self.grp = grp
        W = full.weight.detach()
        self.weight = nn.Parameter(W[:, grp.rows(W.shape[1])].clone(),
                                   requires_grad=full.weight.requires_grad)
        self.bias = full.bias      # whole on every member (the same object: a tie to it holds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Partial products summed over the group (*g*), then the bias once."""
        y = self.grp.reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """A shard of an ``nn.Embedding`` holding a contiguous slice of the vocabulary."""

    def __init__(self, full: nn.Embedding, grp: Group) -> None:
        super().__init__()
        if full.padding_idx is not None or full.max_norm is not None or full.sparse:
            raise ValueError("vocab_embedding splits a plain nn.Embedding (no padding_idx, max_norm or "
                             "sparse)")
        self.grp = grp
        rows = grp.rows(full.num_embeddings)
        self.lo, self.hi = int(rows.start), int(rows.stop)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone(),
                                   requires_grad=full.weight.requires_grad)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of this shard's ids (zeros elsewhere), summed over the group."""
        inside = (ids >= self.lo) & (ids < self.hi)
        local = torch.where(inside, ids - self.lo, torch.zeros_like(ids))
        out = F.embedding(local, self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return self.grp.reduce(out)


class VocabParallelHead(ColumnParallelLinear):
    """The output layer split over the vocabulary; the logits gathered whole."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every logit: this shard's, gathered with the others'."""
        return self.grp.gather(super().forward(x))


def _qkv_rows(n: int, grp: Group) -> torch.Tensor:
    """Rows of a ``[q; k; v]`` weight of ``n`` rows that this member keeps (its heads of each third)."""
    third = n // 3
    k = third // grp.degree
    lo = grp.index * k
    return torch.cat([torch.arange(j * third + lo, j * third + lo + k) for j in range(3)])


def plan_of(model: nn.Module) -> dict[str, str]:
    """The model's ``tensor_parallel_plan`` (raises ``ValueError`` saying how to declare one)."""
    tp = getattr(model, "tensor_parallel_plan", None)
    if not isinstance(tp, Mapping) or not tp:
        raise ValueError(f"{type(model).__name__} has no tensor_parallel_plan: a tensor degree > 1 needs "
                         "the model to say how its modules split, e.g. tensor_parallel_plan = "
                         "{'blocks.*.mlp.fc': 'colwise', 'blocks.*.mlp.proj': 'rowwise', ...} with styles "
                         f"{STYLES} (pipelab.runtime.tensor_parallel)")
    bad = {k: v for k, v in tp.items() if v not in STYLES}
    if bad:
        raise ValueError(f"tensor_parallel_plan: unknown style(s) {bad}; use {STYLES}")
    return dict(tp)


def _matches(plan: Mapping[str, str], name: str) -> str | None:
    return style_of(plan, name)


def split_sizes(model: nn.Module, plan: Mapping[str, str]) -> dict[str, int]:
    """Every size a split cuts, by what it is (``heads of blocks.0.attn``: 4, ...)."""
    sizes: dict[str, int] = {}
    for name, m in model.named_modules():
        style = _matches(plan, name)
        what = cut_size(style, m) if style is not None else None
        if what is not None:
            sizes[f"{what[0]} of {name}"] = what[1]
    return sizes


def check_degree(model: nn.Module, degree: int, *, stage: int | None = None) -> None:
    """Raise ``ValueError`` when ``degree`` does not divide every size the model's plan splits,
    listing the degrees that do."""
    if degree == 1:
        return
    sizes = split_sizes(model, plan_of(model))
    if not sizes:
        raise ValueError("tensor_parallel_plan matches no module of the model: check its names against "
                         "model.named_modules()")
    wrong = {k: v for k, v in sizes.items() if v % degree}
    if wrong:
        g = math.gcd(*sizes.values())
        valid = [d for d in range(1, g + 1) if g % d == 0]
        where = f"stage {stage}: " if stage is not None else ""
        first = ", ".join(f"{k} ({v})" for k, v in list(wrong.items())[:4])
        raise ValueError(f"{where}tensor degree {degree} does not divide {first}; valid degrees for this "
                         f"model: {valid}")


def cuts(module: nn.Module, plan: Mapping[str, str]) -> dict[str, int | None]:
    """Every parameter name (shared ones under each of their names) and the dimension the plan cuts it
    along (``-3``: per ``[q; k; v]`` third; ``None``: whole on every member)."""
    out: dict[str, int | None] = {n: None for n, _ in module.named_parameters(remove_duplicate=False)}
    for name, _ in module.named_modules():
        style = _matches(plan, name) if name else None
        dim = CUT_DIM.get(style or "")
        if dim is None or style is None:
            continue
        out[f"{name}.weight"] = dim
        if bias_cut(style) and f"{name}.bias" in out:
            out[f"{name}.bias"] = dim
    return out


def check_shared(module: nn.Module, plan: Mapping[str, str]) -> None:
    """Refuse a parameter shared between modules that the plan cuts differently (``ValueError`` naming
    them): a tied weight stays one tensor only when each of its users holds the same shard of it."""
    where = cuts(module, plan)
    owners: dict[int, list[str]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(n)
    for names in owners.values():
        if len({where[n] for n in names}) > 1:
            said = ", ".join(f"{n} ({_said(where[n])})" for n in names)
            raise ValueError(f"the model shares one parameter between modules its tensor_parallel_plan cuts "
                             f"differently: {said}; a tie stays one weight only when every user holds the "
                             "same shard (e.g. 'vocab_embedding' with 'vocab_head': both split over the "
                             "vocabulary). Give them matching styles, or untie them")


def _said(dim: int | None) -> str:
    return {None: "whole", -3: "split per q/k/v third", 0: "split along dimension 0",
            1: "split along dimension 1"}[dim]


def shard(module: nn.Module, plan: Mapping[str, str], grp: Group) -> dict[str, int]:
    """Replace ``module``'s planned submodules by this member's shards, in place.

    A parameter that several of the modules share (a tied embedding and head) stays one parameter: its
    users hold the same shard object (:func:`check_shared` refuses users cut differently).

    Returns the dimension each split parameter was cut along (qualified names); parameters not listed
    are whole on every member.
    """
    check_shared(module, plan)
    made: dict[int, nn.Parameter] = {}     # id of a whole parameter -> this member's shard of it
    dims: dict[str, int] = {}
    for name, m in list(module.named_modules()):
        style = _matches(plan, name) if name else None
        if style is None:
            continue
        if style == "heads":
            for attr in ("n_head", "n_embd"):
                if hasattr(m, attr):
                    setattr(m, attr, int(getattr(m, attr)) // grp.degree)
            continue
        new: nn.Module
        if style in ("colwise", "qkv", "vocab_head") and isinstance(m, nn.Linear):
            cls = VocabParallelHead if style == "vocab_head" else ColumnParallelLinear
            new = cls(m, grp, thirds=style == "qkv")
            dims[f"{name}.weight"] = -3 if style == "qkv" else 0
            if m.bias is not None:
                dims[f"{name}.bias"] = -3 if style == "qkv" else 0
        elif style == "rowwise" and isinstance(m, nn.Linear):
            new = RowParallelLinear(m, grp)
            dims[f"{name}.weight"] = 1
        elif style == "vocab_embedding" and isinstance(m, nn.Embedding):
            new = VocabParallelEmbedding(m, grp)
            dims[f"{name}.weight"] = 0
        else:
            raise ValueError(f"tensor_parallel_plan: {name} is a {type(m).__name__}, not what style "
                             f"{style!r} splits")
        for leaf_name, whole in list(m.named_parameters(recurse=False)):
            piece = getattr(new, leaf_name, None)
            if isinstance(piece, nn.Parameter):
                setattr(new, leaf_name, made.setdefault(id(whole), piece))
        parent_name, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, leaf, new)
    return dims


def unshard(shards: Sequence[Mapping[str, torch.Tensor]], dims: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """The whole weights from every member's shard (in member order): split ones concatenated along
    their dimension (``-3``: a ``[q; k; v]`` cut per third), the others member 0's."""
    out: dict[str, torch.Tensor] = {}
    for k, v in shards[0].items():
        d = dims.get(k)
        if d is None:
            out[k] = v
        elif d == -3:
            thirds = [s[k].chunk(3, dim=0) for s in shards]
            out[k] = torch.cat([torch.cat([t[j] for t in thirds], dim=0) for j in range(3)], dim=0)
        else:
            out[k] = torch.cat([s[k] for s in shards], dim=d)
    return out
