"""Hugging Face causal LMs as pipelab traces them: split at the model's own parts, named by module path.

transformers 5 has no fx tracer of its own and a model's ``forward`` cannot be traced by torch.fx
(caches, masks built from Python conditions, ``ModelOutput``). As torchtitan does, pipelab splits such a
model at its parts instead: the embeddings, each decoder block, the final norm and the head, each kept
whole (a leaf) and named by its module path (``transformer.h.3``, ``model.layers.0``, ``lm_head``).
A root sharing the model's submodules (so every parameter keeps its name, and a tied head stays the
same tensor) runs them in the model's order; its inputs are the first ``inputs`` of ``(input_ids,
attention_mask, position_ids)``, tensors whose first dimension is the batch. Its output is the logits.

Two layouts are known (chosen by the modules present, not the class name):

- GPT-2-like: ``transformer.wte``, ``transformer.wpe``, ``transformer.drop``, ``transformer.h``,
  ``transformer.ln_f``, ``lm_head``;
- Llama-like: ``model.embed_tokens``, ``model.rotary_emb``, ``model.layers``, ``model.norm``, ``lm_head``
  (Llama, Mistral, Qwen2 and others of that shape).

An attention mask becomes one additive float mask (causal and padding) made once and handed to every
block, so only tensors cross a cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch import nn

INPUT_NAMES = ("input_ids", "attention_mask", "position_ids")


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers model (its class comes from the ``transformers`` package)."""
    return any(c.__module__.split(".")[0] == "transformers" for c in type(model).__mro__[:-2]) and hasattr(
        model, "config")


def positions(input_ids: torch.Tensor) -> torch.Tensor:
    """Position ids ``0..s-1`` for every sequence of the batch, ``[b, s]``."""
    b, s = input_ids.shape[0], input_ids.shape[1]
    return torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)


def additive_mask(attention_mask: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The causal and padding mask ``[b, 1, s, s]`` to add to attention scores (0 kept, dtype min masked)."""
    b, s = attention_mask.shape[0], attention_mask.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    keep = causal[None, None] & attention_mask.reshape(b, 1, 1, s).bool()
    zeros = torch.zeros(b, 1, s, s, dtype=hidden.dtype, device=hidden.device)
    return zeros.masked_fill(~keep, torch.finfo(hidden.dtype).min)


torch.fx.wrap("positions")       # each one call (one layer) in the traced graph
torch.fx.wrap("additive_mask")


def _gpt2(root: Any, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
    base: Any = root.transformer
    if position_ids is None:
        position_ids = positions(input_ids)
    h = base.drop(base.wte(input_ids) + base.wpe(position_ids))
    mask = None if attention_mask is None else additive_mask(attention_mask, h)
    for block in base.h:
        h = block(h, None, mask)
    return root.lm_head(base.ln_f(h))


def _llama(root: Any, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
    base: Any = root.model
    if position_ids is None:
        position_ids = positions(input_ids)
    h = base.embed_tokens(input_ids)
    rotary = base.rotary_emb(h, position_ids)
    cos_sin = (rotary[0], rotary[1])
    mask = None if attention_mask is None else additive_mask(attention_mask, h)
    for layer in base.layers:
        h = layer(h, attention_mask=mask, position_embeddings=cos_sin, position_ids=position_ids)
    return root.lm_head(base.norm(h))


_LAYOUTS: dict[str, tuple[tuple[str, ...], Callable[..., Any], tuple[str, ...]]] = {
    # name: (module paths that must exist, the forward, paths whose classes are leaves besides the blocks)
    "gpt2": (("transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f", "lm_head"), _gpt2,
             ("transformer.ln_f",)),
    "llama": (("model.embed_tokens", "model.rotary_emb", "model.layers", "model.norm", "lm_head"), _llama,
              ("model.norm", "model.rotary_emb")),
}
_BLOCKS = {"gpt2": "transformer.h", "llama": "model.layers"}


def layout_of(model: nn.Module) -> str:
    """The known layout ``model`` has (``"gpt2"`` or ``"llama"``); ``TypeError`` naming what to do if none."""
    names = dict(model.named_modules())
    for name, (paths, _, _) in _LAYOUTS.items():
        if all(p in names for p in paths):
            return name
    raise TypeError(
        f"pipelab splits a Hugging Face causal LM at its own parts when it has GPT-2's modules "
        f"({', '.join(_LAYOUTS['gpt2'][0])}) or Llama's ({', '.join(_LAYOUTS['llama'][0])}); "
        f"{type(model).__name__} has neither. Wrap it as nn.Sequential(embeddings, *blocks, norm and head) "
        "with modules that take and return tensors (docs/transformers.md), and profile that")


class _SplitRoot(nn.Module):
    """Shares ``model``'s submodules, parameters and buffers (the same names and tensors)."""

    def __init__(self, model: nn.Module, run: Callable[..., Any]) -> None:
        super().__init__()
        self.__dict__["_modules"] = model._modules
        self.__dict__["_parameters"] = model._parameters
        self.__dict__["_buffers"] = model._buffers
        self.__dict__["_run"] = run

    def parts(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None) -> Any:
        """The model's parts in order on the given inputs."""
        return self.__dict__["_run"](self, input_ids, attention_mask, position_ids)


class _Ids(_SplitRoot):
    def forward(self, input_ids: Any) -> Any:
        return self.parts(input_ids)


class _IdsMask(_SplitRoot):
    def forward(self, input_ids: Any, attention_mask: Any) -> Any:
        return self.parts(input_ids, attention_mask)


class _IdsMaskPositions(_SplitRoot):
    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
        return self.parts(input_ids, attention_mask, position_ids)


_ROOTS: tuple[type[_SplitRoot], ...] = (_Ids, _IdsMask, _IdsMaskPositions)


def split_root(model: nn.Module, inputs: int = 1) -> tuple[nn.Module, tuple[type[nn.Module], ...]]:
    """The root to trace for ``model`` taking its first ``inputs`` of :data:`INPUT_NAMES`, and the
    classes to keep whole (its blocks, norm and rotary embedding)."""
    if not 1 <= inputs <= len(INPUT_NAMES):
        raise ValueError(f"a Hugging Face model takes 1 to {len(INPUT_NAMES)} positional inputs "
                         f"({', '.join(INPUT_NAMES)}), got {inputs}")
    layout = layout_of(model)
    _, run, leaf_paths = _LAYOUTS[layout]
    names = dict(model.named_modules())
    blocks = names[_BLOCKS[layout]]
    leaves = {type(b) for b in blocks.children()} | {type(names[p]) for p in leaf_paths}
    return _ROOTS[inputs - 1](model, run), tuple(leaves)
