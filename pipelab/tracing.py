"""The tracing configuration: how a model was cut into layers, recorded once and used by every step.

The profiler traces a model with some rules (``leaf_modules``: classes kept whole; ``depth``: modules
this deep kept whole); a plan's layer indices mean something only under the same rules. The Profile
records them as a :class:`TracingConfig`, partitioners copy it into the Plan, and ``pl.train``,
``launch``, the job file, the CLI and the torch bridge trace with the plan's configuration unless told
otherwise. Classes are kept by import path (``"package.module:Class"``) so the record is plain JSON.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TracingConfig:
    """The rules a model was traced with: leaf classes by import path and the leaf depth."""

    leaf_modules: tuple[str, ...] = ()
    depth: int | None = None
    #: a Hugging Face model's positional inputs (``input_ids, attention_mask, position_ids``: the first
    #: ``inputs``), split at its own parts (:mod:`pipelab.hf`); None: not such a model
    inputs: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "leaf_modules", tuple(self.leaf_modules))
        for path in self.leaf_modules:
            if not isinstance(path, str) or ":" not in path:
                raise ValueError(f"leaf module {path!r} must be an import path 'package.module:Class'")
        if self.depth is not None and (isinstance(self.depth, bool) or not isinstance(self.depth, int)
                                       or self.depth < 1):
            raise ValueError(f"depth={self.depth!r} must be an int >= 1 or None")
        if self.inputs is not None and self.inputs not in (1, 2, 3):
            raise ValueError(f"inputs={self.inputs!r} must be 1, 2 or 3 (input_ids, attention_mask, "
                             "position_ids)")

    @classmethod
    def of(cls, leaf_modules: Sequence[type] = (), depth: int | None = None,
           inputs: int | None = None) -> TracingConfig:
        """The record of ``trace``'s keywords (classes become their import paths)."""
        return cls(leaf_modules=tuple(f"{c.__module__}:{c.__qualname__}" for c in leaf_modules), depth=depth,
                   inputs=inputs)

    @property
    def is_default(self) -> bool:
        """Whether these are the default rules (standard torch.nn layers are the leaves)."""
        return not self.leaf_modules and self.depth is None and self.inputs is None

    def leaf_types(self) -> tuple[type, ...]:
        """The leaf classes, imported; ``ValueError`` naming one that cannot be imported by its path."""
        out = []
        for path in self.leaf_modules:
            module_name, _, qualname = path.partition(":")
            try:
                obj: Any = sys.modules.get(module_name) or importlib.import_module(module_name)
                for part in qualname.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError):
                raise ValueError(
                    f"leaf module class {path!r} (recorded in the profile's tracing) cannot be imported; "
                    "define it at the top level of an importable module, or pass leaf_modules= again"
                ) from None
            out.append(obj)
        return tuple(out)

    def trace_kwargs(self) -> dict[str, Any]:
        """The keywords of :func:`pipelab.graph.trace` these rules stand for."""
        return {"leaf_modules": self.leaf_types(), "depth": self.depth, "inputs": self.inputs}

    def describe(self) -> str:
        """One line for humans."""
        if self.is_default:
            return "default tracing (standard torch.nn layers are the leaves)"
        parts = []
        if self.leaf_modules:
            parts.append(f"leaf_modules=[{', '.join(p.split(':')[1] for p in self.leaf_modules)}]")
        if self.depth is not None:
            parts.append(f"depth={self.depth}")
        if self.inputs:
            parts.append(f"a Hugging Face model split at its parts, {self.inputs} input(s)")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"leaf_modules": list(self.leaf_modules), "depth": self.depth, "inputs": self.inputs}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TracingConfig:
        """Inverse of :meth:`to_dict` (None or ``{}``: the default rules)."""
        d = d or {}
        return cls(leaf_modules=tuple(d.get("leaf_modules", ())), depth=d.get("depth"),
                   inputs=d.get("inputs"))


def resolve(leaf_modules: Sequence[type] = (), depth: int | None = None, inputs: int | None = None,
            recorded: TracingConfig | None = None) -> dict[str, Any]:
    """``trace``'s keywords: those given, else the ``recorded`` ones (a plan's or profile's); a given rule
    that contradicts the record raises ``ValueError`` (the plan's layers would not be the model's)."""
    given = TracingConfig.of(leaf_modules, depth, inputs)
    if recorded is None or recorded.is_default:
        return {"leaf_modules": tuple(leaf_modules), "depth": depth, "inputs": inputs}
    if not given.is_default and given != recorded:
        raise ValueError(f"tracing {given.describe()} differs from the plan's ({recorded.describe()}), so "
                         "its layer indices would name other layers; leave them out (the plan's are used) or "
                         "profile and partition again with these")
    return recorded.trace_kwargs()
