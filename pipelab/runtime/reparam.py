"""Run a stage module with a stashed weight version in place of its parameters, cheaply.

:class:`Reparametrizer` resolves each parameter's slots once, so a call only swaps dictionary
entries (``torch.func.functional_call`` walks the module on every call;
``reproductions/benchmarks/stash_forward.py`` measures both). Semantics are ``functional_call``'s
with ``tie_weights=True, strict=False``; parameters are restored when the call returns or raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class Reparametrizer:
    """``module(*args)`` with ``weights[name]`` standing in for the parameter ``name`` (see module doc)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        first: dict[int, str] = {}
        for name, p in module.named_parameters():          # deduplicated: a tied tensor's first name
            first.setdefault(id(p), name)
        #: (the owning module's parameter dict, leaf name, the name a replacement is looked up by)
        self.slots: list[tuple[dict[str, Any], str, str]] = []
        seen: set[tuple[int, str]] = set()
        for _, mod in module.named_modules(remove_duplicate=False):   # a shared submodule: once
            for leaf, p in mod._parameters.items():
                if p is not None and id(p) in first and (id(mod._parameters), leaf) not in seen:
                    seen.add((id(mod._parameters), leaf))
                    self.slots.append((mod._parameters, leaf, first[id(p)]))

    def __call__(self, weights: Mapping[str, torch.Tensor], *args: Any) -> Any:
        """Call the module with ``weights`` in place of its parameters; restore them afterwards."""
        saved: list[tuple[dict[str, Any], str, Any]] = []
        try:
            for slots, leaf, name in self.slots:
                t = weights.get(name)
                if t is not None:
                    saved.append((slots, leaf, slots[leaf]))
                    slots[leaf] = t
            return self.module(*args)
        finally:
            for slots, leaf, orig in reversed(saved):
                slots[leaf] = orig
