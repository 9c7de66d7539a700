"""The one rule of how a stage splits over a tensor group (Megatron-LM), read by runtime and simulator.

A model says how it splits with ``tensor_parallel_plan``: ``fnmatch`` patterns over qualified module
names mapped to a style of :data:`STYLES` (the first matching pattern wins, :func:`style_of`). The
runtime (:mod:`pipelab.runtime.tensor_parallel`) cuts modules by it; the profiler applies the same
rule to the traced layer graph (:func:`find_splits`) and records one :class:`LayerSplit` per layer on
the Profile, which the cost model prices (:mod:`pipelab.costs.tensor`). Both read :data:`CUT_DIM` and
:func:`cut_size` from here, so what the runtime splits and what the simulator divides cannot differ.

Per style, what one member of a group of ``t`` does (Shoeybi et al. 2019, Fig. 3):

- ``colwise``/``qkv``: weight and bias cut by output features; the input passes *f* (all-reduce of its
  gradient in the backward); the output is a shard.
- ``rowwise``: weight cut by input features, bias whole; takes shards; *g* all-reduces the output
  in the forward.
- ``vocab_embedding``: weight cut by vocabulary rows; every member still produces the whole
  ``[..., hidden]`` output (zeros outside its rows), summed by *g* in the forward.
- ``vocab_head``: a ``colwise`` layer whose logits are all-gathered in the forward.
- ``heads``: an attention module whose head count becomes the member's share (not a layer itself).

A layer no style matches is *whole* when every tensor it reads is whole, and *sharded* (computes on
shards, so its time divides by ``t``) when every tensor it reads is a shard and it holds no weights.
Anything else (a layer mixing shards and whole tensors, weights on a shard, a leaf layer holding split
modules, a shard reaching the model's output) is *unclassified*, with its reason; pricing refuses it.

Invariant: ``Profile.tensor_splits`` is empty or has one record per layer; its byte counts are for
the profile's whole minibatch (activations scale with the batch, weights do not).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch.fx as fx
from torch import nn

from pipelab.graph import layer_members

STYLES = ("colwise", "rowwise", "qkv", "heads", "vocab_embedding", "vocab_head")
#: the dimension each style cuts a weight along (``-3``: per ``[q; k; v]`` third); a bias is cut the
#: same way except under ``rowwise`` (added once, after *g*)
CUT_DIM: dict[str, int] = {"colwise": 0, "vocab_head": 0, "vocab_embedding": 0, "qkv": -3, "rowwise": 1}
#: what a layer of each kind is: whole values in and out; shards in and out; unclassified
WHOLE, SHARDED, UNCLASSIFIED = "whole", "sharded", "unclassified"
#: styles whose layer computes 1/t of the work (the embedding looks up every row on every member)
DIVIDING = ("colwise", "rowwise", "qkv", "vocab_head", SHARDED)
#: kinds of layer whose output is a shard
GIVES_SHARDS = ("colwise", "qkv", SHARDED)


def style_of(plan: Mapping[str, str], name: str) -> str | None:
    """The style of module ``name`` under ``plan``: the first pattern that matches it (None: none)."""
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(name, pattern):
            return style
    return None


def bias_cut(style: str) -> bool:
    """Whether ``style`` cuts a bias too (every cutting style but ``rowwise``)."""
    return style != "rowwise"


def cut_size(style: str, module: nn.Module) -> tuple[str, int] | None:
    """What ``style`` cuts of ``module`` and its size (``("heads", 8)``): the degree must divide it."""
    m: Any = module
    if style == "heads":
        return "heads", int(m.n_head)
    if style == "vocab_embedding":
        return "vocabulary", int(m.num_embeddings)
    if style in ("colwise", "vocab_head"):
        return ("vocabulary" if style == "vocab_head" else "output features"), int(m.out_features)
    if style == "rowwise":
        return "input features", int(m.in_features)
    if style == "qkv":
        return "q/k/v features", int(m.out_features) // 3
    return None


@dataclass(frozen=True)
class LayerSplit:
    """How one layer of a profile splits over a tensor group, and the group's collectives around it.

    Bytes are for the profile's whole minibatch; a group of ``t`` pays each collective once per action.
    """

    #: ``"whole"``, ``"sharded"``, ``"unclassified"`` or a style of :data:`STYLES`
    kind: str = WHOLE
    #: parameter bytes cut into ``t`` shards (the rest of ``Layer.param_bytes`` is whole on every member)
    split_param_bytes: int = 0
    #: bytes *g* all-reduces in the forward (row-parallel output, embedding output)
    forward_allreduce_bytes: int = 0
    #: bytes *f* all-reduces in the backward (the input gradient of a column-parallel layer)
    backward_allreduce_bytes: int = 0
    #: bytes all-gathered in the forward (the vocabulary head's logits, whole after the gather)
    forward_allgather_bytes: int = 0
    #: sizes the degree must divide: ``(("heads of blocks.0.attn", 8), ...)``
    sizes: tuple[tuple[str, int], ...] = ()
    #: why an ``unclassified`` layer could not be classified
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple((str(k), int(v)) for k, v in self.sizes))
        if self.kind not in (WHOLE, SHARDED, UNCLASSIFIED, *STYLES):
            raise ValueError(f"LayerSplit kind={self.kind!r} is not one of {(WHOLE, SHARDED, UNCLASSIFIED)} "
                             f"or a style {STYLES}")
        for attr in ("split_param_bytes", "forward_allreduce_bytes", "backward_allreduce_bytes",
                     "forward_allgather_bytes"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"LayerSplit {attr}={v!r} must be an int >= 0 (bytes)")
        if self.kind == UNCLASSIFIED and not self.reason:
            raise ValueError("an unclassified LayerSplit needs its reason")

    @property
    def divides(self) -> bool:
        """Whether the layer's compute divides by the degree."""
        return self.kind in DIVIDING

    @property
    def gives_shards(self) -> bool:
        """Whether the layer's output is a shard (a stage may not end after it)."""
        return self.kind in GIVES_SHARDS

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d = asdict(self)
        d["sizes"] = [list(s) for s in self.sizes]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayerSplit:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**d, "sizes": tuple(tuple(s) for s in d.get("sizes", ()))})


def _owned_bytes(module: nn.Module, style: str, seen: set[int]) -> int:
    """Bytes of ``module``'s own parameters that ``style`` cuts, each parameter counted once (``seen``)."""
    total = 0
    for leaf, p in module.named_parameters(recurse=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if leaf == "weight" or (leaf == "bias" and bias_cut(style)):
            total += p.numel() * p.element_size()
    return total


def find_splits(gm: fx.GraphModule, plan: Mapping[str, str], value_bytes: Mapping[str, int],
                model: nn.Module | None = None) -> tuple[LayerSplit, ...]:
    """One :class:`LayerSplit` per layer of ``gm`` (traced as the profiler does) under ``plan``.

    Args:
        plan: the model's ``tensor_parallel_plan``.
        value_bytes: bytes of every value of the graph for the profiled minibatch (node name -> bytes;
            0 or absent: not a tensor).
        model: the model ``gm`` was traced from (its ``heads`` modules' head counts; the graph keeps
            only the modules it calls).
    """
    bad = {k: v for k, v in plan.items() if v not in STYLES}
    if bad:
        raise ValueError(f"tensor_parallel_plan: unknown style(s) {bad}; use {STYLES}")
    shard: dict[str, bool] = {}     # value -> whether it is a shard
    pos: dict[str, int] = {}        # value -> its layer
    seen: set[int] = set()
    heads: dict[str, int] = {name: int(getattr(m, "n_head", 0)) for name, m in (model or gm).named_modules()
                             if name and style_of(plan, name) == "heads" and getattr(m, "n_head", 0)}
    out: list[LayerSplit] = []
    for members in layer_members(gm):
        head = members[0]
        ins = [n for n in head.all_input_nodes if value_bytes.get(n.name, 0) > 0]
        split_in = [shard.get(n.name, False) for n in ins]
        in_bytes = sum(value_bytes.get(n.name, 0) for n in ins)
        out_bytes = sum(value_bytes.get(n.name, 0) for n in members)
        target = str(head.target) if head.op == "call_module" else ""
        module = gm.get_submodule(target) if target else None
        style = style_of(plan, target) if target else None
        split = _classify(head, module, style, target, plan, split_in, in_bytes, out_bytes, seen)
        owners = [h for h in heads if target.startswith(h + ".")]
        if owners and split.kind in ("qkv", "colwise"):
            split = LayerSplit(**{**asdict(split), "sizes": (*split.sizes,
                                                            *((f"heads of {h}", heads[h]) for h in owners))})
        out.append(split)
        for n in members:
            shard[n.name], pos[n.name] = split.gives_shards, len(out) - 1
    for n in gm.graph.nodes:
        for a in n.all_input_nodes if n.op == "output" else ():
            if shard.get(a.name, False):
                why = "its shard is the model's output; end the split with a 'rowwise' or 'vocab_head' layer"
                out[pos[a.name]] = LayerSplit(kind=UNCLASSIFIED, reason=why)
    return tuple(out)


def _classify(head: fx.Node, module: nn.Module | None, style: str | None, target: str,
              plan: Mapping[str, str], split_in: Sequence[bool], in_bytes: int, out_bytes: int,
              seen: set[int]) -> LayerSplit:
    """The :class:`LayerSplit` of one layer from its style and whether its tensor inputs are shards."""
    def unclassified(why: str) -> LayerSplit:
        return LayerSplit(kind=UNCLASSIFIED, reason=why)

    any_in, all_in = any(split_in), bool(split_in) and all(split_in)
    if module is not None and style is None:
        inner = [n for n, _ in module.named_modules() if n and style_of(plan, f"{target}.{n}")]
        if inner:
            return unclassified(f"it is one leaf layer holding modules the plan splits "
                                f"({target}.{inner[0]}); profile without that leaf module so each split "
                                "module is a layer")
        own = any(True for _ in module.parameters())
        if any_in and (own or not all_in):
            does = "has weights and reads a shard" if own else "mixes shards and whole tensors"
            return unclassified(f"{type(module).__name__} {target} {does}")
        return LayerSplit(kind=SHARDED if all_in else WHOLE)
    if module is None:
        if any_in and not all_in:
            return unclassified(f"{head.op} {head.target} mixes shards and whole tensors")
        return LayerSplit(kind=SHARDED if all_in else WHOLE)
    assert style is not None
    if style == "heads":
        return unclassified(f"attention {target} is one leaf layer; profile without that leaf module so "
                            "its q/k/v and output projections are layers of their own")
    if style == "rowwise" and not all_in:
        return unclassified(f"row-parallel {target} reads a whole tensor, not the shard of a column-parallel "
                            "layer")
    if style != "rowwise" and any_in:
        return unclassified(f"{style} {target} reads a shard; it takes the whole input")
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        return unclassified(f"{target} is a {type(module).__name__}, not what style {style!r} splits")
    what = cut_size(style, module)
    nbytes = _owned_bytes(module, style, seen)
    sizes = ((f"{what[0]} of {target}", what[1]),) if what else ()
    if style in ("colwise", "qkv"):
        return LayerSplit(kind=style, split_param_bytes=nbytes, backward_allreduce_bytes=in_bytes,
                          sizes=sizes)
    if style == "vocab_head":
        return LayerSplit(kind=style, split_param_bytes=nbytes, backward_allreduce_bytes=in_bytes,
                          forward_allgather_bytes=out_bytes, sizes=sizes)
    # rowwise, vocab_embedding: g all-reduces the whole output in the forward
    return LayerSplit(kind=style, split_param_bytes=nbytes, forward_allreduce_bytes=out_bytes, sizes=sizes)
